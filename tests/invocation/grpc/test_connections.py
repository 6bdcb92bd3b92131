"""The sessions of the callers' connections: one session per connection, a call arriving
while the connection's first is being opened joins it, a pin forgotten once its session
cannot be live, and never more pins than the bound."""

from __future__ import annotations

import asyncio
import uuid

from service.invocation.grpc.connections import Key, Pins


def key(n: int) -> Key:
    return (f"ipv4:10.0.0.1:{40000 + n}", "acct", str(uuid.UUID(int=1)), "")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_first_call_makes_the_pin_and_the_next_join_its_session() -> None:
    pins = Pins(ttl=60)
    session, claim = await pins.resolve(key(1))
    assert session is None and claim is not None
    waiting = asyncio.ensure_future(pins.resolve(key(1)))
    await asyncio.sleep(0)
    assert not waiting.done()  # the connection's first call is still being opened
    opened = uuid.uuid4()
    pins.settle(key(1), claim, opened, keep=True)
    assert await waiting == (opened, None)
    assert await pins.resolve(key(1)) == (opened, None)
    assert (await pins.resolve(key(2)))[0] is None  # another connection


async def test_a_first_call_that_failed_lets_the_next_make_the_pin() -> None:
    pins = Pins(ttl=60)
    _, claim = await pins.resolve(key(1))
    assert claim is not None
    waiting = asyncio.ensure_future(pins.resolve(key(1)))
    await asyncio.sleep(0)
    pins.settle(key(1), claim, None, keep=False)
    session, again = await waiting
    assert session is None and again is not None and again is not claim


async def test_a_per_call_function_is_remembered_as_not_pinned() -> None:
    pins = Pins(ttl=60)
    _, claim = await pins.resolve(key(1))
    assert claim is not None
    pins.settle(key(1), claim, None, keep=True)
    assert await pins.resolve(key(1)) == (None, None)


async def test_a_session_named_by_a_call_becomes_the_connections_until_forgotten() -> None:
    pins = Pins(ttl=60)
    named = uuid.uuid4()
    assert pins.pin(key(1), named) is True
    assert pins.pin(key(1), named) is False  # already: no second cookie
    assert await pins.resolve(key(1)) == (named, None)
    pins.forget(key(1), uuid.uuid4())  # another session: nothing changes
    assert await pins.resolve(key(1)) == (named, None)
    pins.forget(key(1), named)
    session, claim = await pins.resolve(key(1))
    assert session is None and claim is not None


async def test_a_pin_unused_for_its_ttl_is_forgotten_and_pins_are_bounded() -> None:
    clock = Clock()
    pins = Pins(ttl=10, limit=3, clock=clock)
    _, claim = await pins.resolve(key(0))
    assert claim is not None
    pins.settle(key(0), claim, uuid.uuid4(), keep=True)
    clock.now = 10.5
    session, claim = await pins.resolve(key(0))
    assert session is None and claim is not None  # its session cannot be live any more
    for n in range(1, 6):
        await pins.resolve(key(n))
    assert len(pins) == 3
    clock.now = 100.0
    await pins.resolve(key(9))
    assert len(pins) == 1  # the expired ones went with the next pin made
