"""The order queued tasks are offered capacity in (pure): fair between accounts, first in first
out within one.

Accounts take turns, one task each per turn, in the order of their oldest waiting task; an
account's tasks come in the order they were created. A task that cannot be placed holds back
the later tasks of its account (`Turns.hold`), so no task of an account starts before an
earlier one of the same account.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime


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


class Turns:
    """Walk `fair_order(waiting)`, skipping the accounts held back in this pass."""

    def __init__(self, waiting: Iterable[Waiting]) -> None:
        #: every waiting task in its turn (held accounts' too)
        self.order = fair_order(waiting)
        self._held: set[str] = set()

    def hold(self, account_id: str) -> None:
        """The account's next task could not be placed: none of its later ones go first."""
        self._held.add(account_id)

    def __iter__(self) -> Iterator[Waiting]:
        for item in self.order:
            if item.account_id not in self._held:
                yield item
