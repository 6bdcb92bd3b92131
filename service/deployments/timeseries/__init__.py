"""A small time series per function version (the console's charts): requests, errors,
latency p50/p99, queue depth, requests in flight, Running instances and the autoscaler's
target, sampled from what the server already counts (store.py), served by router.py."""
