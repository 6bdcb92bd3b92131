"""Queues and per-instance concurrency shared through a real Redis: two dispatchers play two
replicas, then two apps on one database and one Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from service.core.errors import ServiceUnavailable, TooManyRequests
from service.invocation.dispatch import QueueTimeout
from service.invocation.dispatch_redis import RedisActivity, RedisDispatcher
from service.invocation.routing import InstanceRoute, Target
from tests.support.app import ClientFactory, SettingsFactory
from tests.support.e2e import V, eventually
from tests.support.invocation import (
    FAST,
    deployed,
    invocation_app,
    pexec_url,
    route,
    spec,
    write_catalog,
)
from tests.support.invocation import target as support_target
from tests.support.redis import RedisServer
from tests.support.server import free_port
from tests.support.upstream import UpstreamServer


def target(*instances: InstanceRoute) -> Target:
    return support_target(*instances, fresh=True)  # one Redis serves every test


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[list[RedisDispatcher]]:
    made = [RedisDispatcher(redis_server.url, queue_max=1, lease_seconds=1) for _ in range(3)]
    for d in made[:2]:
        await d.start()  # the third never renews: it plays a replica that died
    yield made
    for d in made:
        await d.aclose()


async def test_a_slot_freed_on_one_replica_goes_to_the_head_waiting_on_another(
    replicas: list[RedisDispatcher],
) -> None:
    one, two, _ = replicas
    inst = route()
    t = target(inst)
    first, second = uuid.uuid4(), uuid.uuid4()
    assert (await (await one.enqueue(first, t)).wait(1)).id == inst.id
    waiting = await two.enqueue(second, t)
    assert (await one.depth(t.version_id), await two.depth(t.version_id)) == (1, 1)
    assert await one.position(second) == 1
    with pytest.raises(TooManyRequests):
        await one.enqueue(uuid.uuid4(), t)  # queue_max 1
    pending = asyncio.ensure_future(waiting.wait(30))
    await asyncio.sleep(0)
    assert not pending.done()
    await one.release(t, inst.id, first)
    assert (await pending).id == inst.id  # woken by the release message
    assert await two.depth(t.version_id) == 0
    assert await two.position(second) is None
    assert two.in_flight(t.version_id) == 1 and one.in_flight(t.version_id) == 0


async def test_a_preferred_instance_with_room_takes_the_request(
    replicas: list[RedisDispatcher],
) -> None:
    one, two, _ = replicas
    a, b = route(), route(concurrency=2)
    t = target(a, b)
    assert (await (await one.enqueue(uuid.uuid4(), t, prefer=[a.id])).wait(1)).id == a.id
    assert (await (await two.enqueue(uuid.uuid4(), t, prefer=[a.id])).wait(1)).id == b.id
    assert (await (await one.enqueue(uuid.uuid4(), t, prefer=[b.id])).wait(1)).id == b.id


async def test_a_dead_replicas_slot_and_place_expire(replicas: list[RedisDispatcher]) -> None:
    one, _, dead = replicas
    inst = route()
    t = target(inst)
    await (await dead.enqueue(uuid.uuid4(), t)).wait(1)  # held, never renewed
    await dead.enqueue(uuid.uuid4(), t)  # a place, never renewed either
    # The dead replica's slot lease runs out: a live replica's request takes the instance.
    late = uuid.uuid4()

    async def taken() -> bool:
        try:
            ticket = await one.enqueue(late, t)
        except TooManyRequests:
            return False  # the ghost still holds the one place of the queue
        try:
            await ticket.wait(5)
        except QueueTimeout:
            return False
        return True

    await eventually(taken, seconds=30)


async def test_waiting_times_out_and_leaves_the_queue(replicas: list[RedisDispatcher]) -> None:
    one, two, _ = replicas
    t = target(route())
    await (await one.enqueue(uuid.uuid4(), t)).wait(1)
    ticket = await two.enqueue(uuid.uuid4(), t)
    with pytest.raises(QueueTimeout):
        await ticket.wait(0.05)
    assert await one.depth(t.version_id) == 0


# ------------------------------------------------------------------------------ two apps


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer().start()
    yield server
    server.stop()


async def test_two_replicas_share_one_instances_concurrency(
    client_factory: ClientFactory,
    make_settings: SettingsFactory,
    tmp_path: Path,
    redis_server: RedisServer,
    upstream: UpstreamServer,
) -> None:
    first = await invocation_app(
        client_factory, tmp_path, upstream=upstream.url, redis_url=redis_server.url
    )
    fn = await deployed(first, specs=[spec(maxRequestConcurrency=1)])
    second = await client_factory(
        make_settings(
            data_dir=tmp_path / "replica-2",
            clusters_file=write_catalog(tmp_path, upstream=upstream.url),
            reconciler_enabled=False,
            redis_url=redis_server.url,
            **FAST,
        )
    )
    upstream.hold()
    on_first = asyncio.ensure_future(first.post(pexec_url(fn), json={"on": 1}))

    async def arrived() -> bool:
        return upstream.arrived == 1

    await eventually(arrived)
    on_second = asyncio.ensure_future(second.post(pexec_url(fn), json={"on": 2}))

    async def queued() -> bool:
        resp = await first.get(f"{V}/queues/functions/{fn['id']}")
        return bool(resp.json()["queues"][0]["queueDepth"] == 1)

    await eventually(queued)
    assert upstream.arrived == 1  # the second replica's request waits for the one slot
    upstream.release()
    answers = [await on_first, await on_second]
    assert [a.status_code for a in answers] == [200, 200]
    assert [a.json()["echo"]["on"] for a in answers] == [1, 2]


async def test_an_unreachable_redis_is_503() -> None:
    dispatcher = RedisDispatcher(f"redis://127.0.0.1:{free_port()}/0", queue_max=1, lease_seconds=1)
    try:
        with pytest.raises(ServiceUnavailable, match="Redis"):
            await dispatcher.enqueue(uuid.uuid4(), target(route()))
    finally:
        await dispatcher.aclose()


async def test_the_drain_sees_every_replicas_requests(
    replicas: list[RedisDispatcher], redis_server: RedisServer
) -> None:
    """What a reconciler asks before tearing a draining instance down (reconcile/drain.py):
    requests in flight per instance and waiting per version, whichever replica holds them."""
    one, two, _ = replicas
    busy, idle = route(), route()
    t = target(busy)
    first = uuid.uuid4()
    assert (await (await one.enqueue(first, t)).wait(1)).id == busy.id
    waiting = await two.enqueue(uuid.uuid4(), t)  # waits: busy has one slot
    reader = RedisActivity(redis_server.url)
    try:
        for view in (one, two, reader):
            assert await view.requests_in_flight([busy.id, idle.id]) == {busy.id: 1}
            assert await view.requests_waiting([t.version_id]) == {t.version_id: 1}
        await one.release(t, busy.id, first)
        await waiting.wait(30)  # the waiter took the slot: still one in flight, none waiting
        assert await reader.requests_in_flight([busy.id]) == {busy.id: 1}
        assert await reader.requests_waiting([t.version_id]) == {}
        assert await reader.requests_in_flight([]) == {}
    finally:
        await reader.aclose()


async def test_requests_arriving_together_share_round_trips_and_survive_a_script_flush(
    replicas: list[RedisDispatcher], redis_server: RedisServer
) -> None:
    one, two, _ = replicas
    instances = [route(concurrency=4) for _ in range(2)]
    t = target(*instances)
    ids = [uuid.uuid4() for _ in range(8)]
    # eight requests at once: every slot of the two instances, in one or two round trips
    tickets = await asyncio.gather(*(one.enqueue(i, t) for i in ids))
    granted = [await ticket.wait(1) for ticket in tickets]
    assert sorted(str(g.id) for g in granted) == sorted([str(i.id) for i in instances] * 4)
    assert one.in_flight(t.version_id) == 8
    # Redis forgets the scripts (a restart, SCRIPT FLUSH): they are loaded again
    client = Redis.from_url(redis_server.url)
    await client.script_flush()
    await client.aclose()
    waiting = await two.enqueue(uuid.uuid4(), t)  # full: it waits
    for request_id, instance in zip(ids, granted, strict=True):
        await one.release(t, instance.id, request_id)  # not awaited by Redis: sent in order
    taken = await waiting.wait(5)
    assert taken.id in {i.id for i in instances}

    async def only_the_waiter_holds_a_slot() -> bool:
        return await one.requests_in_flight([i.id for i in instances]) == {taken.id: 1}

    await eventually(only_the_waiter_holds_a_slot)


async def test_waiting_requests_are_served_by_priority_then_arrival(
    redis_server: RedisServer,
) -> None:
    d = RedisDispatcher(redis_server.url, queue_max=10, lease_seconds=5)
    await d.start()
    try:
        inst = route()
        t = target(inst)
        holder = uuid.uuid4()
        await (await d.enqueue(holder, t, priority=0)).wait(1)  # the one slot, taken
        ids = {name: uuid.uuid4() for name in ("none", "p5", "p1-first", "p1-second", "p0")}
        priorities = {"none": None, "p5": 5, "p1-first": 1, "p1-second": 1, "p0": 0}
        tickets = {n: await d.enqueue(ids[n], t, priority=priorities[n]) for n in ids}
        positions = {n: await d.position(ids[n]) for n in ids}
        assert positions == {"p0": 1, "p1-first": 2, "p1-second": 3, "p5": 4, "none": 5}
        waits = {asyncio.ensure_future(tk.wait(30)): n for n, tk in tickets.items()}
        served: list[str] = []
        while waits:
            await d.release(t, inst.id, holder)
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1
            served.append(waits.pop(done.pop()))
            holder = ids[served[-1]]
        assert served == ["p0", "p1-first", "p1-second", "p5", "none"]
    finally:
        await d.aclose()
