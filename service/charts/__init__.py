"""Helm chart pipeline: fetch, check, render and restrict charts (helm.md)."""
