variable "project_id" {
  description = "GCP project to create the cluster in (APIs: container, compute, monitoring)."
  type        = string
}

variable "region" {
  description = "Region of the (regional) cluster."
  type        = string
  default     = "us-central1"
}

variable "node_locations" {
  description = "Zones with L4 capacity for the GPU node pool (g2 machines are zonal offerings)."
  type        = list(string)
  default     = ["us-central1-a", "us-central1-b"]
}

variable "cluster_name" {
  description = "Name of the GKE cluster."
  type        = string
  default     = "attention"
}

variable "gke_min_version" {
  description = <<-EOT
    Minimum GKE control-plane version. CUDA 13 needs an R580+ NVIDIA driver; with
    gpu_driver_version = "LATEST" GKE installs the newest driver its node version supports, which
    is R580 from GKE 1.33 on (check the table "GPU driver versions" in the GKE GPU docs for the
    version you get). The server logs the driver's CUDA version at start and refuses its GPU
    backends with the reason when the driver is older (GetServerInfo.cuda_driver_version).
  EOT
  type        = string
  default     = "1.33"
}

variable "gpu_machine_type" {
  description = "g2-standard-* machine type (1 L4 for g2-standard-4/8/12/16/32)."
  type        = string
  default     = "g2-standard-8"
}

variable "gpu_pool_min_nodes" {
  description = "Minimum L4 nodes per zone (cluster autoscaler)."
  type        = number
  default     = 1
}

variable "gpu_pool_max_nodes" {
  description = "Maximum L4 nodes per zone (cluster autoscaler); the HPA's maxReplicas should fit."
  type        = number
  default     = 4
}

variable "master_authorized_cidr" {
  description = "CIDR allowed to reach the control plane (your workstation or CI egress)."
  type        = string
  default     = "10.0.0.0/8"
}

variable "deletion_protection" {
  description = "Refuse to delete the cluster (terraform destroy fails while true). Set false with terraform apply first to tear down (deploy/README.md \"Teardown\")."
  type        = bool
  default     = true
}
