"""Deployment files: Dockerfiles, Kubernetes manifests, Prometheus and Grafana (with the dashboard builder)."""
