output "cluster_name" {
  description = "Name of the cluster (for gcloud container clusters get-credentials)."
  value       = google_container_cluster.attention.name
}

output "cluster_location" {
  description = "Region of the cluster."
  value       = google_container_cluster.attention.location
}

output "get_credentials" {
  description = "Command that points kubectl at the cluster."
  value       = "gcloud container clusters get-credentials ${google_container_cluster.attention.name} --region ${var.region} --project ${var.project_id}"
}
