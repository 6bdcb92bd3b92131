"""The simulated cluster's settings and state: fault annotations, delays, and the namespaces,
workloads, pods and nodes the scheduler, the pod timeline and status rendering work on."""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from service.backends.protocol import InstanceSpec
from service.backends.simulated.tasks import TaskScript
from service.health.observed import ObjectRef, format_time

Clock = Callable[[], datetime]

FAULT_ANNOTATION = "sim.nvcf.io/fault"
READY_AFTER_ANNOTATION = "sim.nvcf.io/ready-after"
FAIL_AFTER_ANNOTATION = "sim.nvcf.io/fail-after"
#: the fault hits only the first N instances of the function version this cluster starts
FAULT_INSTANCES_ANNOTATION = "sim.nvcf.io/fault-instances"
FAULTS = frozenset(
    {"ImagePullBackOff", "CrashLoopBackOff", "Unschedulable", "NeverReady", "FailAfterReady"}
)
DEFAULT_FAIL_AFTER = 5.0
PROGRESS_DEADLINE_DEFAULT = 600.0
CRASH_BACKOFF_CAP = 300.0  # kubelet's maximum container restart back-off

# Kubernetes' "safe" alphabet for generated name suffixes (no vowels, no look-alikes).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
WORKLOAD_KINDS = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "Job", "Pod"})


def parse_duration(text: str) -> float:
    """`3s`, `500ms`, `2m`, `1h` or a bare number of seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"invalid duration {text!r}: expected e.g. 3s, 500ms, 2m, 1h")
    value = float(match.group(1))
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SimulationDelays:
    """How long the simulated scheduler, image pulls and readiness take (seconds)."""

    schedule_seconds: float = 0.5
    pull_seconds: float = 1.0
    ready_seconds: float = 1.0


def as_map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def name_suffix(seed: str, length: int) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_NAME_ALPHABET[b % len(_NAME_ALPHABET)] for b in digest[:length])


def ts(value: datetime) -> str:
    return format_time(value)


def secs(value: float) -> timedelta:
    return timedelta(seconds=value)


@dataclass
class Node:
    name: str
    gpu: str
    gpus: int
    labels: dict[str, str]
    allocated: int = 0

    @property
    def free(self) -> int:
        return self.gpus - self.allocated


@dataclass
class SimPod:
    name: str
    uid: str
    seq: int
    owner_kind: str
    owner_name: str
    owner_uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]
    created_at: datetime
    gpus: int
    fault: str | None
    ready_after: float
    fail_after: float
    node: str | None = None
    scheduled_at: datetime | None = None
    unschedulable_since: datetime | None = None
    schedule_message: str = ""
    released: bool = False
    removed: bool = False  # no longer in its namespace (deleted, replaced or overwritten)
    matching: tuple[int, ...] | None = None  # indices of nodes its affinity allows (cached)
    matching_set: frozenset[int] | None = None  # the same, for membership tests
    namespace: str = ""
    #: a task container's script (simulated/tasks.py), and when its Job asked it to stop
    script: TaskScript | None = None
    stop_at: datetime | None = None

    @property
    def restart_policy(self) -> str:
        return str(self.spec.get("restartPolicy") or "Always")

    @property
    def in_job(self) -> bool:
        return self.owner_kind == "Job"


@dataclass
class Workload:
    kind: str
    name: str
    uid: str
    created_at: datetime
    template_key: str
    pods: list[str] = field(default_factory=list)
    replica_set: str = ""  # Deployments: the name of the ReplicaSet it created
    replica_set_uid: str = ""


@dataclass
class Namespace:
    instance: InstanceSpec
    created_at: datetime
    objects: dict[ObjectRef, dict[str, Any]] = field(default_factory=dict)
    workloads: dict[ObjectRef, Workload] = field(default_factory=dict)
    pods: dict[str, SimPod] = field(default_factory=dict)
    generation: int = 0


def object_uid(cluster: str, ns: Namespace, *parts: object) -> str:
    """A uid stable for the cluster, namespace, workload generation and `parts`."""
    seed = "/".join([cluster, ns.instance.namespace, str(ns.generation), *map(str, parts)])
    return str(uuid.uuid5(uuid.NAMESPACE_URL, seed))
