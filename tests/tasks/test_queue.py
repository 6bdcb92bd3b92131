"""The queue's order: accounts take turns (oldest waiting first), each account's tasks in the
order they were created, and a task that cannot start holds back its account's later ones."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from service.tasks.queue import Turns, Waiting, fair_order

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def waiting(account: str, minute: int) -> Waiting:
    return Waiting(uuid.uuid4(), account, T0 + timedelta(minutes=minute))


def test_accounts_take_turns_and_each_keeps_its_own_order() -> None:
    a1, a2, a3 = waiting("a", 0), waiting("a", 1), waiting("a", 2)
    b1, b2 = waiting("b", 5), waiting("b", 6)
    c1 = waiting("c", 3)
    order = fair_order([b2, a3, c1, a1, b1, a2])
    assert order == [a1, c1, b1, a2, b2, a3]


def test_a_held_account_starts_none_of_its_later_tasks() -> None:
    a1, a2 = waiting("a", 0), waiting("a", 1)
    b1 = waiting("b", 2)
    turns = Turns([a1, a2, b1])
    seen = []
    for item in turns:
        seen.append(item)
        if item is a1:
            turns.hold("a")
    assert seen == [a1, b1]
