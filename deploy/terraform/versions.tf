# GKE cluster with an NVIDIA L4 node pool for attention-server (DESIGN.md §12; deploy/README.md).
# Not applied from CI (no cloud access there): CI parses and scans it (scripts/deploy_checks.sh).
terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 8.0"
    }
  }
}

provider "google" {
  project = var.project_id
  region  = var.region
}
