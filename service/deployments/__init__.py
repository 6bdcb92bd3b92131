"""Deployments: desired state recorded by the API, driven to reality by the reconciler."""
