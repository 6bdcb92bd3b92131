"""The `simulated` backend: an in-process model of a Kubernetes cluster (runtime.md §4).

Applied workloads get pods; pods request `nvidia.com/gpu` and are scheduled onto nodes of the
cluster's node shapes (honouring node affinity on `nvca.nvcf.nvidia.io/instance-type`), then move
through the phases and conditions a kubelet reports, on the configured delays. Nothing runs in
the background: every call first brings the model up to the injected clock's `now`, and pod
status is computed from each pod's timeline, so a fake clock can jump arbitrarily far.

Fault injection through pod-template annotations: `sim.nvcf.io/fault` (ImagePullBackOff,
CrashLoopBackOff, Unschedulable, NeverReady, FailAfterReady), `sim.nvcf.io/ready-after` and
`sim.nvcf.io/fail-after` (durations such as `3s`, `500ms`, `2m`).

Modules: `adapter` (the adapter: apply/observe/delete/capacity/objects), `scheduler` (nodes,
GPU accounting, queues), `timeline` (pod phases over time, faults, delays), `status` and
`pods` (rendered objects, status and events), `model` (settings, annotations, state), `logs`
(what the containers printed).
"""
