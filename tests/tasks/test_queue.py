"""The queue's order: accounts take turns (oldest waiting first), each account's tasks in the
order they were created (tasks/test_loop_queue.py: the loop's read of it in SQL, and an
account held back)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from service.tasks.queue import Waiting, fair_order

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def waiting(account: str, minute: int) -> Waiting:
    return Waiting(uuid.uuid4(), account, T0 + timedelta(minutes=minute))


def test_accounts_take_turns_and_each_keeps_its_own_order() -> None:
    a1, a2, a3 = waiting("a", 0), waiting("a", 1), waiting("a", 2)
    b1, b2 = waiting("b", 5), waiting("b", 6)
    c1 = waiting("c", 3)
    order = fair_order([b2, a3, c1, a1, b1, a2])
    assert order == [a1, c1, b1, a2, b2, a3]
