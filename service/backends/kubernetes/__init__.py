"""The `kubernetes` backend (runtime.md §4): one real cluster, driven through `lightkube`.

Its parts: the kinds it knows and their API paths (`kinds.py`), how failures are reported
(`errors.py`), the calls to the API server (`api.py`), the objects applied and the namespace's
record of them (`objects.py`), reading a cluster's GPU capacity (`capacity.py`), a task's files
through its pod's sidecar (`task_files.py`) and the adapter itself (`adapter.py`, where the
contract is described).
"""

from service.backends.kubernetes.adapter import (
    DEFAULT_TIMEOUT,
    FIELD_MANAGER,
    KubernetesAdapter,
)
from service.backends.kubernetes.errors import KubernetesError, is_retryable
from service.backends.kubernetes.kinds import KNOWN_KINDS, KindInfo, guess_plural, kind_info
from service.backends.kubernetes.objects import APPLIED_ANNOTATION
from service.core.kube import MANAGED_BY_LABEL

__all__ = [
    "APPLIED_ANNOTATION",
    "DEFAULT_TIMEOUT",
    "FIELD_MANAGER",
    "KNOWN_KINDS",
    "MANAGED_BY_LABEL",
    "KindInfo",
    "KubernetesAdapter",
    "KubernetesError",
    "guess_plural",
    "is_retryable",
    "kind_info",
]
