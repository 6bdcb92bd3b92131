"""The invocation plane's guarantees: a refused connection is retried once elsewhere, request
state lives in the database (another replica answers a poll), a stopped replica's pending
requests end errored, and every bound (worker time, queue time, result size) holds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from httpx import ASGITransport

from service.app import create_app
from service.backends.protocol import InstanceSpec
from service.backends.simulated.adapter import SimulatedAdapter
from service.core.db import make_engine, make_sessionmaker, utcnow
from service.invocation.models import InvocationReplica, InvocationRequest
from tests.support.api import assert_problem
from tests.support.app import ADMIN_KEY, AppClient, ClientFactory, SettingsFactory
from tests.support.e2e import V, eventually
from tests.support.invocation import FAST, deployed, invocation_app, pexec_url, spec, write_catalog
from tests.support.upstream import UpstreamServer

SLOW = {"NVCF-POLL-SECONDS": "1", "X-Sim-Delay-Ms": "3000"}


def sim(client: AppClient) -> SimulatedAdapter:
    adapter = client.app.state.adapters.get("inv-0")
    assert isinstance(adapter, SimulatedAdapter)
    return adapter


async def vanish(client: AppClient, instance_id: str) -> None:
    """The instance's worker goes away while the database still says it runs."""
    await sim(client).delete(InstanceSpec(instance_id, "f", "v", "NCP.GPU.H100_1x", "H100", 1))


async def test_a_refused_connection_is_retried_once_on_another_instance(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(client_factory, tmp_path)
    fn = await deployed(client, specs=[spec(minInstances=2, maxInstances=2)])
    await client.app.state.reconciler.stop()  # nobody notices the vanished worker
    dead, alive = (i["instanceId"] for i in fn["deployment"]["instances"])
    await vanish(client, dead)
    answers = await asyncio.gather(*(client.post(pexec_url(fn), json={"n": n}) for n in range(2)))
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert {a.json()["instanceId"] for a in answers} == {alive}
    # With no other instance left, the request ends errored with the reason.
    await vanish(client, alive)
    resp = await client.post(pexec_url(fn), json={})
    problem = assert_problem(resp, 502)
    assert "could not be reached" in str(problem["detail"])
    assert "no simulated worker" in str(problem["detail"])
    assert resp.headers["nvcf-status"] == "errored"


async def test_another_replica_answers_a_poll(
    client_factory: ClientFactory, make_settings: SettingsFactory, tmp_path: Path
) -> None:
    first = await invocation_app(client_factory, tmp_path)
    fn = await deployed(first)
    second = await client_factory(
        make_settings(
            data_dir=tmp_path / "replica-2",
            clusters_file=write_catalog(tmp_path),
            reconciler_enabled=False,
            **FAST,
        )
    )
    assert second.app.state.invocation.owner.value != first.app.state.invocation.owner.value
    resp = await first.post(pexec_url(fn), json={"from": "first"}, headers=SLOW)
    assert resp.status_code == 202
    request_id = resp.headers["nvcf-reqid"]
    status = await second.get(f"{V}/pexec/status/{request_id}")
    assert status.status_code == 200, status.text
    assert status.headers["nvcf-status"] == "fulfilled"
    assert status.json()["echo"] == {"from": "first"}
    wrapped = await second.get(f"{V}/exec/status/{request_id}")
    assert wrapped.json()["response"]["echo"] == {"from": "first"}


async def test_pending_requests_of_a_stopped_replica_end_errored(
    client: AppClient,
) -> None:
    plane = client.app.state.invocation
    request_id = uuid.uuid4()
    long_ago = utcnow() - timedelta(hours=1)
    async with client.app.state.sessionmaker() as session, session.begin():
        session.add(InvocationReplica(owner="gone:1", heartbeat_at=long_ago, started_at=long_ago))
        session.add(
            InvocationRequest(
                id=request_id,
                account_id="nvcf-default",
                function_id=uuid.uuid4(),
                version_id=uuid.uuid4(),
                owner="gone:1",
                state="running",
                created_at=utcnow(),
                updated_at=utcnow(),
                expires_at=utcnow() + timedelta(hours=1),
            )
        )
    resp = await client.get(f"{V}/pexec/status/{request_id}")
    problem = assert_problem(resp, 503)
    assert "gone:1" in str(problem["detail"]) and "stopped" in str(problem["detail"])
    assert resp.headers["nvcf-status"] == "errored"
    # The sweep ends what no poll touched.
    other = uuid.uuid4()
    async with client.app.state.sessionmaker() as session, session.begin():
        session.add(
            InvocationRequest(
                id=other,
                account_id="nvcf-default",
                function_id=uuid.uuid4(),
                version_id=uuid.uuid4(),
                owner="gone:1",
                state="queued",
                created_at=utcnow(),
                updated_at=utcnow(),
                expires_at=utcnow() + timedelta(hours=1),
            )
        )
    assert await plane.store.end_dead() == 1
    stored = await plane.store.read(other)
    assert stored is not None and stored.state == "errored"
    assert stored.outcome is not None and "gone:1" in str(stored.outcome.error)


async def test_a_restarted_server_ends_its_previous_runs_requests(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = make_settings(clusters_file=write_catalog(tmp_path), **FAST)
    request_id = uuid.uuid4()
    app = create_app(settings)
    async with LifespanManager(app):
        owner = app.state.invocation.owner
        assert owner.persistent
        async with app.state.sessionmaker() as session, session.begin():
            session.add(
                InvocationRequest(
                    id=request_id,
                    account_id="nvcf-default",
                    function_id=uuid.uuid4(),
                    version_id=uuid.uuid4(),
                    owner=owner.value,
                    state="running",
                    created_at=utcnow(),
                    updated_at=utcnow(),
                    expires_at=utcnow() + timedelta(hours=1),
                )
            )
        owner_id = owner.value
    # The process "crashed" with that request running; the same data dir starts again.
    again = create_app(settings)
    async with LifespanManager(again) as manager:
        assert again.state.invocation.owner.value == owner_id
        async with AppClient(
            transport=ASGITransport(app=manager.app),
            base_url="http://nvcf.test",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as client:
            resp = await client.get(f"{V}/pexec/status/{request_id}")
            problem = assert_problem(resp, 503)
            assert "restarted" in str(problem["detail"])


async def test_a_worker_that_takes_too_long_ends_504(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(client_factory, tmp_path, invoke_worker_timeout_seconds=1)
    fn = await deployed(client)
    resp = await client.post(pexec_url(fn), json={}, headers={"X-Sim-Delay-Ms": "30000"})
    problem = assert_problem(resp, 504)
    assert "did not answer within 1 s" in str(problem["detail"])
    assert resp.headers["nvcf-status"] == "errored"


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer().start()
    yield server
    server.stop()


async def test_a_detached_request_whose_worker_stalls_mid_answer_ends_504(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client = await invocation_app(
        client_factory, tmp_path, upstream=upstream.url, invoke_worker_timeout_seconds=5
    )
    fn = await deployed(client)
    upstream.hold()  # no head before the caller's poll time: the request is detached
    resp = await client.post(
        pexec_url(fn),
        json={"x_upstream_trickle": 1_000_000},
        headers={"NVCF-POLL-SECONDS": "1"},
    )
    assert resp.status_code == 202
    request_id = resp.headers["nvcf-reqid"]
    upstream.release()  # the head, then a declared megabyte that never arrives in time
    assert await asyncio.to_thread(upstream.trickling.wait, 30)

    async def ended() -> httpx.Response | None:
        status = await client.get(f"{V}/pexec/status/{request_id}")
        return None if status.status_code == 202 else status

    status = await eventually(ended)
    problem = assert_problem(status, 504)
    assert "did not answer within 5 s" in str(problem["detail"])
    assert status.headers["nvcf-status"] == "errored"
    assert await asyncio.to_thread(upstream.trickle_cut.wait, 30)  # the worker is let go
    again = await client.post(pexec_url(fn), json={"after": True})
    assert again.status_code == 200 and again.json()["echo"] == {"after": True}


async def test_bounds_of_result_size_and_queue_time(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(
        client_factory,
        tmp_path,
        invoke_result_max_bytes=64,
        invoke_queue_timeout_seconds=0.2,
        autoscale_enabled=False,  # nothing starts an instance for the queued request below
    )
    fn = await deployed(client)
    # Larger than NVCF-MAX-RESPONSE-SIZE-BYTES: a large result (a worker on this machine,
    # tests/invocation/test_assets.py), for a poll, ...
    resp = await client.post(
        pexec_url(fn),
        json={"pad": "x" * 200},
        headers={"NVCF-POLL-SECONDS": "1", "X-Sim-Delay-Ms": "1500"},
    )
    assert resp.status_code == 202
    status = await client.get(f"{V}/pexec/status/{resp.headers['nvcf-reqid']}")
    assert status.status_code == 302 and "/storage/results/" in status.headers["location"]
    # ... the wrapped form ...
    wrapped = await client.post(
        f"{V}/exec/functions/{fn['id']}", json={"requestBody": {"pad": "x" * 200}}
    )
    assert wrapped.status_code == 200
    assert wrapped.json()["status"] == "fulfilled" and wrapped.json()["responseReference"]
    # ... and a waiting caller.
    resp = await client.post(pexec_url(fn), json={"pad": "x" * 200})
    assert resp.status_code == 302
    # ACTIVE with no Running instance (minInstances 0) and no autoscaler to start one: nobody
    # takes the request in time.
    idle = await deployed(client, specs=[spec(minInstances=0)])
    problem = assert_problem(await client.post(pexec_url(idle), json={}), 503)
    assert "no instance" in str(problem["detail"])


async def test_shutting_down_ends_running_requests_errored(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = make_settings(clusters_file=write_catalog(tmp_path), **FAST)
    app = create_app(settings)
    async with (
        LifespanManager(app) as manager,
        AppClient(
            transport=ASGITransport(app=manager.app),
            base_url="http://nvcf.test",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as client,
    ):
        fn = await deployed(client)
        resp = await client.post(
            pexec_url(fn),
            json={},
            headers={"NVCF-POLL-SECONDS": "1", "X-Sim-Delay-Ms": "60000"},
        )
        assert resp.status_code == 202
        request_id = uuid.UUID(resp.headers["nvcf-reqid"])
    engine = make_engine(settings.effective_database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            row = await session.get(InvocationRequest, request_id)
    finally:
        await engine.dispose()
    assert row is not None and row.state == "errored"
    assert row.error is not None and "shut down" in row.error
