"""Metering (docs/usage.md): GPU-seconds per instance, invocations and tokens per account,
kept durably so that a bill can be made from them."""
