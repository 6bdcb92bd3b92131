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

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


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


__all__ = ["Activity", "Loads"]
