"""The Kubernetes-compatible HTTP API: the versioned objects and the jobs, as kubectl and client-go expect them."""
