"""Change feeds: how an adapter tells the reconciler which instances changed (runtime.md §3).

The reconciler re-observes a Running instance with no health timer pending only when its
adapter reports a change of it (a pod, a controller or an event of its namespace; in the
simulated cluster a step of its timeline or a fault annotation), and otherwise at a long
safety-net period. An adapter implements `ChangeFeed` by keeping a `ChangeLog`: it marks the
instances whose objects changed, and asks for a full re-observation of its cluster when it may
have missed changes (its watch was lost and re-established). The reconciler takes the marks
on each pass (`take_changes`) and sleeps no longer than `next_change`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from service.core.kube import NAMESPACE_PREFIX


@dataclass
class Changes:
    """What changed on one cluster since the last take: instance ids (as the adapter knows
    them, `InstanceSpec.instance_id`), and whether every instance must be re-observed."""

    instance_ids: set[str] = field(default_factory=set)
    resync: bool = False


class ChangeLog:
    """The marks an adapter accumulates between two takes; `wake` (set by the reconciler)
    is called when a mark arrives between passes. One event loop; not thread-safe."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._resync = False
        self.wake: Callable[[], None] | None = None

    def mark(self, instance_id: str) -> None:
        self._ids.add(instance_id)
        if self.wake is not None:
            self.wake()

    def mark_namespace(self, namespace: str) -> None:
        """Mark the instance of an instance namespace (`sr-<id>`); other namespaces are not
        the service's and are ignored."""
        if namespace.startswith(NAMESPACE_PREFIX) and len(namespace) > len(NAMESPACE_PREFIX):
            self.mark(namespace[len(NAMESPACE_PREFIX) :])

    def mark_resync(self) -> None:
        self._resync = True
        if self.wake is not None:
            self.wake()

    def take(self) -> Changes:
        taken = Changes(self._ids, self._resync)
        self._ids, self._resync = set(), False
        return taken


@runtime_checkable
class ChangeFeed(Protocol):
    """Optional capability of a `BackendAdapter`: it reports which instances changed."""

    name: str

    def watch_changes(self, wake: Callable[[], None]) -> None:
        """Start reporting changes (the Kubernetes adapter starts its watches); `wake` is
        called, on the event loop, when changes are waiting to be taken."""
        ...

    def take_changes(self, now: datetime) -> Changes:
        """The changes since the last call (changes due by `now` for a timeline)."""
        ...

    def next_change(self) -> datetime | None:
        """When the next change is known to happen by time alone (None: none known)."""
        ...
