"""What autoscaling is, below everything that uses it: scaling policies (policy.py), the pure
decision (decide.py), and the request/response shapes of NVCF's autoscalingConfiguration
(schemas.py). The loop service that applies them is autoscaler/. docs/autoscaling.md tells the
whole story."""
