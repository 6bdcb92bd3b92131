"""The gRPC entry's sessions: in memory for one replica, and in a real Redis shared by two
stores playing two replicas — resumable while a call is open and for the idle time after,
NotFound once ended, for an unknown id or an instance no longer Running; a replica that dies
keeps its sessions no longer than its lease."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from service.core.errors import NotFound, ServiceUnavailable
from service.invocation.sessions import LocalSessions, RedisSessions
from tests.support.e2e import eventually
from tests.support.invocation import route, target
from tests.support.redis import RedisServer
from tests.support.server import free_port

ONE, TWO = route(1), route(2)
BOTH = target(ONE, TWO)


async def live_on(sessions: LocalSessions | RedisSessions, session: uuid.UUID) -> bool:
    try:
        return await sessions.others(session, BOTH) == [TWO.id]
    except NotFound:
        return False


async def test_one_replicas_session_lives_while_a_call_is_open() -> None:
    sessions = LocalSessions(idle_seconds=0)
    session, first, second = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await sessions.join(session, ONE.id, first)
    await sessions.join(session, ONE.id, second)
    assert await live_on(sessions, session)
    sessions.leave(session, first)
    assert await live_on(sessions, session)
    sessions.leave(session, second)
    with pytest.raises(NotFound, match="no existing session found"):
        await sessions.others(session, BOTH)
    with pytest.raises(NotFound):
        await sessions.others(uuid.uuid4(), BOTH)


async def test_an_ended_session_stays_for_the_idle_time_on_its_running_instance() -> None:
    sessions = LocalSessions(idle_seconds=60)
    session, call = uuid.uuid4(), uuid.uuid4()
    await sessions.join(session, ONE.id, call)
    sessions.leave(session, call)
    assert await live_on(sessions, session)
    with pytest.raises(NotFound):  # its instance is no longer Running
        await sessions.others(session, target(TWO))
    gone = LocalSessions(idle_seconds=0.05)
    await gone.join(session, ONE.id, call)
    gone.leave(session, call)

    async def ended() -> bool:
        return not await live_on(gone, session)

    await eventually(ended)


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[list[RedisSessions]]:
    made = [RedisSessions(redis_server.url, lease_seconds=1, idle_seconds=idle) for idle in (0, 60)]
    for sessions in made:
        await sessions.start()
    try:
        yield made
    finally:
        for sessions in made:
            await sessions.aclose()


async def test_a_session_is_every_replicas(replicas: list[RedisSessions]) -> None:
    ends_at_once, keeps = replicas
    session, call, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await ends_at_once.join(session, ONE.id, call)
    assert await live_on(keeps, session)
    # resumed on the other replica; the first call ends: the session lives on
    await keeps.join(session, ONE.id, other)
    ends_at_once.leave(session, call)
    assert await live_on(ends_at_once, session)
    keeps.leave(session, other)  # the last call, on a replica with an idle time
    assert await live_on(ends_at_once, session)
    # a session whose last call ends on a replica with no idle time ends
    ended_id, call = uuid.uuid4(), uuid.uuid4()
    await ends_at_once.join(ended_id, TWO.id, call)
    assert await keeps.others(ended_id, BOTH) == [ONE.id]
    ends_at_once.leave(ended_id, call)

    async def ended() -> bool:
        try:
            await keeps.others(ended_id, BOTH)
        except NotFound:
            return True
        return False

    await eventually(ended)
    with pytest.raises(NotFound):
        await keeps.others(ended_id, BOTH)


async def test_a_dead_replicas_session_ends_with_its_lease(
    replicas: list[RedisSessions], redis_server: RedisServer
) -> None:
    survivor = replicas[0]
    dying = RedisSessions(redis_server.url, lease_seconds=1, idle_seconds=0)
    await dying.start()
    session = uuid.uuid4()
    await dying.join(session, ONE.id, uuid.uuid4())
    assert await live_on(survivor, session)
    await dying.aclose()  # gone without ending its call: nobody renews it

    async def ended() -> bool:
        return not await live_on(survivor, session)

    await eventually(ended)


async def test_redis_unreachable_is_503_for_a_resumption_and_never_fails_a_call() -> None:
    sessions = RedisSessions(f"redis://127.0.0.1:{free_port()}/0", lease_seconds=1, idle_seconds=0)
    try:
        session = uuid.uuid4()
        with pytest.raises(ServiceUnavailable, match="Redis"):
            await sessions.others(session, BOTH)
        await sessions.join(session, ONE.id, uuid.uuid4())  # logged, not raised
    finally:
        await sessions.aclose()
