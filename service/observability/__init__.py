"""Telemetry endpoints (NVCF's bring-your-own-observability): a tenant's own logs, metrics and
traces receivers, their keys (encrypted), and the checks of the `telemetries` a function or a
task names (docs/telemetry-export.md)."""
