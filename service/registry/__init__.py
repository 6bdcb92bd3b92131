"""Registry credentials (api.md §5): per-account logins for chart and image registries."""
