# A dedicated VPC with a subnet and secondary ranges for VPC-native pods and services, and Cloud
# NAT so private nodes can pull images.
resource "google_compute_network" "attention" {
  name                    = "${var.cluster_name}-vpc"
  auto_create_subnetworks = false
}

resource "google_compute_subnetwork" "attention" {
  name                     = "${var.cluster_name}-subnet"
  region                   = var.region
  network                  = google_compute_network.attention.id
  ip_cidr_range            = "10.10.0.0/20"
  private_ip_google_access = true

  secondary_ip_range {
    range_name    = "pods"
    ip_cidr_range = "10.20.0.0/14"
  }
  secondary_ip_range {
    range_name    = "services"
    ip_cidr_range = "10.30.0.0/20"
  }

  log_config {
    aggregation_interval = "INTERVAL_10_MIN"
    flow_sampling        = 0.5
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_router" "attention" {
  name    = "${var.cluster_name}-router"
  region  = var.region
  network = google_compute_network.attention.id
}

resource "google_compute_router_nat" "attention" {
  name                               = "${var.cluster_name}-nat"
  router                             = google_compute_router.attention.name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"
}

# Only traffic from inside the VPC (nodes, pods, services) and from Google's health checkers
# reaches the nodes; everything else is dropped by the implied deny-ingress rule.
resource "google_compute_firewall" "internal" {
  name      = "${var.cluster_name}-allow-internal"
  network   = google_compute_network.attention.id
  direction = "INGRESS"
  source_ranges = [
    "10.10.0.0/20",  # nodes
    "10.20.0.0/14",  # pods
    "172.16.0.0/28", # control plane (webhooks, kubelet)
  ]

  allow {
    protocol = "tcp"
  }
  allow {
    protocol = "udp"
  }
  allow {
    protocol = "icmp"
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}
