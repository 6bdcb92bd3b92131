"""Queues and concurrency: the dispatcher on its own, then end to end with a real upstream
worker that holds requests (so "2 in flight, 3 queued" is a state, not a timing)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.core.errors import TooManyRequests
from service.invocation.dispatch import LocalDispatcher, QueueTimeout
from tests.support.api import assert_problem, bearer, new_key
from tests.support.app import ClientFactory
from tests.support.e2e import V, eventually
from tests.support.invocation import (
    deployed,
    invocation_app,
    pexec_url,
    route,
    sample,
    spec,
    target,
)
from tests.support.upstream import UpstreamServer


async def test_fewest_in_flight_then_fifo_queue_then_full() -> None:
    a, b = route(1, 2), route(2, 1)
    t = target(a, b)
    d = LocalDispatcher(queue_max=2)
    got = [await (await d.enqueue(uuid.uuid4(), t)).wait(1) for _ in range(3)]
    assert sorted(i.id.int for i in got) == [1, 1, 2]  # a twice (room for 2), b once
    first, second = uuid.uuid4(), uuid.uuid4()
    t1 = await d.enqueue(first, t)
    t2 = await d.enqueue(second, t)
    assert (await d.depth(t.version_id), await d.position(first), await d.position(second)) == (
        2,
        1,
        2,
    )
    with pytest.raises(TooManyRequests):
        await d.enqueue(uuid.uuid4(), t)
    waits = [asyncio.ensure_future(t1.wait(5)), asyncio.ensure_future(t2.wait(5))]
    await d.release(t, b.id, uuid.uuid4())
    assert (await waits[0]).id == b.id  # the head of the queue takes the freed slot
    assert not waits[1].done()
    await d.release(t, a.id, uuid.uuid4())
    assert (await waits[1]).id == a.id
    assert d.in_flight(t.version_id) == 3
    assert await d.depth(t.version_id) == 0


async def test_a_preferred_instance_with_room_takes_the_request() -> None:
    """An entry's preference (the LLM gateway's sessions): the first preferred instance with a
    free slot, else the least loaded; a waiting request keeps its preference."""
    a, b, c = route(1, 1), route(2, 2), route(3, 1)
    t = target(a, b, c)
    d = LocalDispatcher(queue_max=2)
    assert (await (await d.enqueue(uuid.uuid4(), t, prefer=[c.id, a.id])).wait(1)).id == c.id
    assert (await (await d.enqueue(uuid.uuid4(), t, prefer=[c.id, a.id])).wait(1)).id == a.id
    assert (await (await d.enqueue(uuid.uuid4(), t, prefer=[c.id])).wait(1)).id == b.id
    assert (await (await d.enqueue(uuid.uuid4(), t)).wait(1)).id == b.id
    waiting = await d.enqueue(uuid.uuid4(), t, prefer=[c.id])
    pending = asyncio.ensure_future(waiting.wait(5))
    await d.release(t, c.id, uuid.uuid4())
    assert (await pending).id == c.id


async def test_the_drain_sees_requests_in_flight_and_waiting() -> None:
    """What a reconciler asks before tearing a draining instance down (reconcile/drain.py)."""
    busy, idle = route(1), route(2)
    t = target(busy)
    d = LocalDispatcher(queue_max=2)
    first = uuid.uuid4()
    await (await d.enqueue(first, t)).wait(1)
    waiting = await d.enqueue(uuid.uuid4(), t)
    assert await d.requests_in_flight([busy.id, idle.id]) == {busy.id: 1}
    assert await d.requests_waiting([t.version_id, uuid.UUID(int=9)]) == {t.version_id: 1}
    await d.release(t, busy.id, first)
    await waiting.wait(1)
    assert await d.requests_waiting([t.version_id]) == {}
    await d.release(t, busy.id, uuid.uuid4())
    assert await d.requests_in_flight([busy.id]) == {}


async def test_a_retry_goes_first_and_never_back_to_the_instance_that_refused() -> None:
    a, b = route(1), route(2)
    t = target(a, b)
    d = LocalDispatcher(queue_max=10)
    assert (await (await d.enqueue(uuid.uuid4(), t)).wait(1)).id == a.id
    assert (await (await d.enqueue(uuid.uuid4(), t)).wait(1)).id == b.id
    queued = await d.enqueue(uuid.uuid4(), t)
    retry = await d.enqueue(uuid.uuid4(), t, exclude=[a.id], front=True)
    # a is free, but the retry excludes it: the queued one gets it
    await d.release(t, a.id, uuid.uuid4())
    assert (await queued.wait(1)).id == a.id
    await d.release(t, b.id, uuid.uuid4())
    assert (await retry.wait(1)).id == b.id


async def test_waiting_times_out_and_cancelling_gives_the_slot_back() -> None:
    a = route(1)
    t = target(a)
    d = LocalDispatcher(queue_max=10)
    held = await d.enqueue(uuid.uuid4(), t)
    await held.wait(1)
    late = await d.enqueue(uuid.uuid4(), t)
    with pytest.raises(QueueTimeout):
        await late.wait(0.01)
    assert await d.depth(t.version_id) == 0
    gone = await d.enqueue(uuid.uuid4(), t)
    gone.cancel()
    assert await d.depth(t.version_id) == 0
    await d.release(t, a.id, uuid.uuid4())
    # Nothing waits: the next request gets the instance at once.
    assert (await (await d.enqueue(uuid.uuid4(), t)).wait(0)).id == a.id


async def test_new_instances_take_waiting_requests() -> None:
    t = target()  # ACTIVE with no Running instance yet (minInstances 0)
    d = LocalDispatcher(queue_max=10)
    ticket = await d.enqueue(uuid.uuid4(), t)
    assert [x.version_id for x in d.waiting_versions()] == [t.version_id]
    await d.update(target(route(7)))
    assert (await ticket.wait(1)).id.int == 7


# ------------------------------------------------------------------------------ end to end


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer().start()
    yield server
    server.stop()


async def test_concurrency_two_one_instance_five_requests(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client = await invocation_app(client_factory, tmp_path, upstream=upstream.url)
    fn = await deployed(client, specs=[spec(maxRequestConcurrency=2)])
    upstream.hold()

    async def one(i: int) -> httpx.Response:
        return await client.post(pexec_url(fn), json={"i": i}, headers={"NVCF-POLL-SECONDS": "1"})

    answers = await asyncio.gather(*(one(i) for i in range(5)))
    assert [a.status_code for a in answers] == [202] * 5
    ids = [a.headers["nvcf-reqid"] for a in answers]
    assert upstream.arrived == 2  # two in flight; the slots are full, nobody else got through

    queues = await client.get(f"{V}/queues/functions/{fn['id']}")
    assert queues.status_code == 200, queues.text
    assert queues.json() == {
        "functionId": fn["id"],
        "queues": [
            {
                "functionVersionId": fn["versionId"],
                "functionName": fn["name"],
                "functionStatus": "ACTIVE",
                "queueDepth": 3,
            }
        ],
    }
    one_version = await client.get(f"{V}/queues/functions/{fn['id']}/versions/{fn['versionId']}")
    assert one_version.json()["queues"][0]["queueDepth"] == 3
    positions: dict[str, int] = {}
    running = []
    for rid in ids:
        resp = await client.get(f"{V}/queues/{rid}/position")
        if resp.status_code == 200:
            body = resp.json()
            assert (body["functionId"], body["functionVersionId"]) == (fn["id"], fn["versionId"])
            positions[rid] = body["positionInQueue"]
        else:
            assert "running" in str(assert_problem(resp, 400)["detail"])
            running.append(rid)
    assert sorted(positions.values()) == [1, 2, 3] and len(running) == 2
    metrics = (await client.get("/metrics")).text
    labels = {"function_id": fn["id"], "version_id": fn["versionId"]}
    assert sample(metrics, "nvcf_invocation_in_flight", **labels) == 2
    assert sample(metrics, "nvcf_invocation_queue_depth", **labels) == 3

    upstream.release()
    results = [await client.get(f"{V}/pexec/status/{rid}") for rid in ids]
    assert [r.status_code for r in results] == [200] * 5
    assert sorted(r.json()["echo"]["i"] for r in results) == [0, 1, 2, 3, 4]
    assert upstream.arrived == 5
    metrics = (await client.get("/metrics")).text
    assert sample(metrics, "nvcf_invocation_requests_total", outcome="fulfilled", **labels) == 5
    assert sample(metrics, "nvcf_invocation_in_flight", **labels) == 0
    assert sample(metrics, "nvcf_invocation_queue_depth", **labels) == 0
    assert sample(metrics, "nvcf_invocation_duration_seconds_count", **labels) == 5


async def test_queue_overflow_is_429_and_queue_routes_need_their_scope(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client = await invocation_app(
        client_factory, tmp_path, upstream=upstream.url, invoke_queue_max=1
    )
    fn = await deployed(client)
    upstream.hold()
    first = asyncio.ensure_future(client.post(pexec_url(fn), json={}))

    async def arrived() -> bool:
        return upstream.arrived == 1

    await eventually(arrived)
    second = asyncio.ensure_future(client.post(pexec_url(fn), json={}))

    async def queued() -> bool:
        queues = (await client.get(f"{V}/queues/functions/{fn['id']}")).json()["queues"]
        return bool(queues[0]["queueDepth"] == 1)

    await eventually(queued)
    third = await client.post(pexec_url(fn), json={})
    problem = assert_problem(third, 429)
    assert "queue" in str(problem["detail"]) and third.headers["retry-after"] == "1"
    assert third.headers["nvcf-status"] == "errored"
    upstream.release()
    assert [(await f).status_code for f in (first, second)] == [200, 200]
    metrics = (await client.get("/metrics")).text
    assert sample(metrics, "nvcf_invocation_requests_total", outcome="queue_full") == 1

    key = await new_key(client, ["invoke_function"])
    assert_problem(await client.get(f"{V}/queues/functions/{fn['id']}", headers=bearer(key)), 403)
    assert_problem(await client.get(f"{V}/queues/{uuid.uuid4()}/position"), 404)
    assert_problem(await client.get(f"{V}/queues/functions/{uuid.uuid4()}"), 404)


async def test_waiting_requests_are_served_by_priority_then_arrival() -> None:
    inst = route(1, 1)
    t = target(inst)
    d = LocalDispatcher(queue_max=10)
    await (await d.enqueue(uuid.uuid4(), t, priority=0)).wait(1)  # the one slot, taken
    ids = {name: uuid.uuid4() for name in ("none", "p5", "p1-first", "p1-second", "p0")}
    priorities = {"none": None, "p5": 5, "p1-first": 1, "p1-second": 1, "p0": 0}
    tickets = {n: await d.enqueue(ids[n], t, priority=priorities[n]) for n in ids}
    positions = {n: await d.position(ids[n]) for n in ids}
    assert positions == {"p0": 1, "p1-first": 2, "p1-second": 3, "p5": 4, "none": 5}
    waits = {asyncio.ensure_future(tk.wait(5)): n for n, tk in tickets.items()}
    served = []
    while waits:
        await d.release(t, inst.id, uuid.uuid4())
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        served.append(waits.pop(done.pop()))
    assert served == ["p0", "p1-first", "p1-second", "p5", "none"]
