"""The autoscaler: scaling policies (policy.py), the pure decision (decide.py), its SQL
(store.py), the loop service (loop.py), and the request/response shapes of NVCF's
autoscalingConfiguration (schemas.py). docs/autoscaling.md tells the whole story."""
