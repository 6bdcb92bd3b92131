"""The order queued tasks are offered capacity in (pure): fair between accounts, first in first
out within one.

Accounts take turns, one task each per turn, in the order of their oldest waiting task; an
account's tasks come in the order they were created. A task that cannot be placed holds back
the later tasks of its account, so no task of an account starts before an earlier one of the
same account. `fair_order` is the order's definition; the task loop reads it a page at a time
in SQL (`repository.queued_in_turn`), held accounts left out, and stops reading once
`no_room` says no later task can fit.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from service.backends.protocol import Capacity


@dataclass(frozen=True)
class Waiting:
    task_id: uuid.UUID
    account_id: str
    created_at: datetime


def fair_order(waiting: Iterable[Waiting]) -> list[Waiting]:
    """Round robin over accounts (oldest waiting first), FIFO within each account."""
    per_account: OrderedDict[str, deque[Waiting]] = OrderedDict()
    for item in sorted(waiting, key=lambda w: (w.created_at, str(w.task_id))):
        per_account.setdefault(item.account_id, deque()).append(item)
    out: list[Waiting] = []
    while per_account:
        for account in list(per_account):
            queue = per_account[account]
            out.append(queue.popleft())
            if not queue:
                del per_account[account]
    return out


def no_room(capacities: Mapping[str, Capacity], clusters: int) -> bool:
    """Whether each of the `clusters` read at the pass's start is known to have no free GPU
    (then no later task fits either); one placed on since is read again, so not known."""
    known = len(capacities) >= clusters
    return known and all(c.free_gpus() == 0 for c in capacities.values())
