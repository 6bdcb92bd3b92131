"""What the reconciler asks the invocation plane before tearing a draining instance down.

`Activity` is the whole interface: requests in flight per instance and requests waiting per
version. The invocation plane's dispatchers implement it (`LocalDispatcher`: this process's
counts; `RedisDispatcher`/`RedisActivity`: every replica's, through the shared Redis keys). A
reconciler with no view of the plane (no plane in its process and no `NVCF_REDIS_URL`) gets
None: it sees no request in flight, so a drain only waits for routes to forget the instance
(the route-cache period). When reading fails, drains end at the drain timeout. Without Redis,
several replicas (or `nvcf-server invoke` processes) each see only their own requests: an
instance may be torn down while another process still has a request on it (that request
fails; a request not yet sent is retried once on another instance).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from service.deployments.models import Deployment, Instance
from service.health.machine import Phase

log = logging.getLogger("nvcf.reconciler")


class Activity(Protocol):
    async def requests_in_flight(
        self, instance_ids: Sequence[uuid.UUID]
    ) -> Mapping[uuid.UUID, int]:
        """Requests running on each instance (absent: none)."""
        ...

    async def requests_waiting(self, version_ids: Sequence[uuid.UUID]) -> Mapping[uuid.UUID, int]:
        """Requests waiting in each version's queue (absent: none)."""
        ...


@dataclass(frozen=True)
class Loads:
    """One unit's reading of `Activity`; `known` False: no reading (drains time out)."""

    in_flight: dict[uuid.UUID, int] = field(default_factory=dict)
    waiting: dict[uuid.UUID, int] = field(default_factory=dict)
    known: bool = True


def drain_since(dep: Deployment, row: Instance, *, tearing_down: bool) -> datetime | None:
    """When the instance started draining; None when it is torn down at once (not serving,
    or an immediate undeploy)."""
    if row.drain_since is not None:
        return row.drain_since
    if tearing_down and row.phase == Phase.RUNNING.value:
        return dep.drain_since  # graceful undeploy (None: immediate)
    return None


async def read_loads(
    activity: Activity | None,
    instance_ids: Sequence[uuid.UUID],
    version_ids: Sequence[uuid.UUID],
) -> Loads:
    """One reading of `activity` for the draining instances (nothing to read: no call). No
    activity: none in flight. A failed read: unknown (the drain timeout ends those drains)."""
    if not instance_ids or activity is None:
        return Loads()
    try:
        return Loads(
            in_flight=dict(await activity.requests_in_flight(instance_ids)),
            waiting=dict(await activity.requests_waiting(version_ids)),
        )
    except Exception as exc:
        log.warning("reading requests in flight failed: %s", exc)
        return Loads(known=False)


__all__ = ["Activity", "Loads", "drain_since", "read_loads"]
