"""When a settled Running instance is re-observed as a safety net (runtime.md §3).

Changes reach the reconciler through the adapters' change feeds (backends/changes.py); the
resync only catches what a feed could have missed. Each instance has a fixed slot in the
period (from its id), so a fleet's resyncs are spread evenly over the period instead of
coming due together, and two resyncs of one instance are at least half a period apart.
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta

#: slots of a period: the fleet is re-observed a 64th at a time
SLOTS = 64


def next_resync(instance_id: uuid.UUID, now: datetime, period: float) -> datetime:
    """The instance's next slot at least half a period after `now` (`now` for period 0)."""
    if period <= 0:
        return now
    epoch = now.timestamp()
    slot = math.floor(epoch / period) * period + (instance_id.int % SLOTS) * period / SLOTS
    while slot < epoch + period / 2:
        slot += period
    return now + timedelta(seconds=slot - epoch)
