"""The loop that carries a canary release: a restart of the server mid-release resumes at the
same step with what was measured of it; a step does not advance while the canary has no
Running instance; two loops (replicas) take each decision once, on every replica's figures."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy import update

from service.app import create_app
from service.core.db import make_sessionmaker, utcnow
from service.core.settings import Settings
from service.deployments import transitions
from service.deployments.canary import Phase as CanaryPhase
from service.deployments.canary import State as CanaryState
from service.deployments.canary_figures import Tally, report, watched
from service.deployments.canary_loop import CanaryLoop
from service.deployments.models import CanaryRelease, Deployment, Instance
from service.deployments.reconcile.store import ReconcileStore
from service.functions.models import FunctionVersion
from service.health.conditions import Phase
from tests.support.app import ADMIN_KEY, AppClient, SettingsFactory, without_reconciler
from tests.support.e2e import V, dep_url, until_status
from tests.support.invocation import FAST, deployed, pexec_url, spec, write_catalog
from tests.support.races import writers
from tests.support.reconcile import ACCOUNT, add_version
from tests.support.upstream import UpstreamServer

PLAN: dict[str, Any] = {
    "steps": [
        {"weight": 50, "requests": 10},
        {"weight": 60, "requests": 20},
        {"weight": 70, "requests": 10},
    ],
    # the analysis is not what these tests are about: it passes whatever the noise
    "analysis": {"minRequests": 10, "maxErrorRateIncrease": 1, "maxLatencyRatio": 100},
}


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer().start()
    yield server
    server.stop()


@pytest.fixture
def settings(make_settings: SettingsFactory, tmp_path: Path, upstream: UpstreamServer) -> Settings:
    return make_settings(
        clusters_file=write_catalog(tmp_path, upstream=upstream.url),
        **FAST,
        invoke_route_cache_seconds=60,
        canary_interval=3600,
        jwt_secret=None,
    )


@asynccontextmanager
async def server(settings: Settings) -> AsyncIterator[AppClient]:
    """One run of the server process on `settings`' database and data directory."""
    app = create_app(settings)
    async with (
        LifespanManager(app, startup_timeout=120, shutdown_timeout=120) as manager,
        AppClient(
            transport=httpx.ASGITransport(app=manager.app),
            base_url="http://nvcf.test",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as client,
    ):
        client.app = app
        yield client


async def released(client: AppClient) -> tuple[dict[str, Any], dict[str, Any]]:
    """A stable version and a canary of the same function, its release started."""
    stable = await deployed(client)
    resp = await client.post(
        f"{V}/functions/{stable['id']}/versions",
        json={"name": stable["name"], "inferenceUrl": "/echo", "containerImage": "nvcr.io/a/b:2"},
    )
    assert resp.status_code == 200, resp.text
    canary = dict(resp.json()["function"])
    resp = await client.post(dep_url(canary), json={"deploymentSpecifications": [spec()]})
    assert resp.status_code == 200, resp.text
    await until_status(client, canary, "ACTIVE")
    resp = await client.post(
        f"{V}/functions/{stable['id']}/canary",
        json={"versionId": canary["versionId"], "plan": PLAN},
    )
    assert resp.status_code == 200, resp.text
    await client.app.state.invocation.figures.publish()
    return stable, canary


async def on_canary(client: AppClient, fn: dict[str, Any], canary: dict[str, Any], n: int) -> None:
    """Versionless invocations until `n` were answered by the canary."""
    landed = 0
    while landed < n:
        resp = await client.post(pexec_url(fn, version=False), json={})
        if resp.status_code == 200:
            landed += resp.json()["headers"]["NVCF-FUNCTION-VERSION-ID"] == canary["versionId"]


async def reading(client: AppClient, fn: dict[str, Any]) -> dict[str, Any]:
    """This replica's report, one reading of the releases, and the release as shown."""
    await client.app.state.invocation.figures.publish()
    await client.app.state.canary.round()
    return await shown(client, fn)


async def shown(client: AppClient, fn: dict[str, Any]) -> dict[str, Any]:
    resp = await client.get(f"{V}/functions/{fn['id']}/canary")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def test_a_restart_mid_release_resumes_at_the_same_step(settings: Settings) -> None:
    async with server(settings) as client:
        stable, canary = await released(client)
        await on_canary(client, stable, canary, 10)
        assert (await reading(client, stable))["step"] == 2
        await on_canary(client, stable, canary, 10)
        await client.app.state.invocation.figures.publish()
    # the process stopped half-way through step 2; the same database starts again
    async with server(settings) as client:
        resumed = await shown(client, stable)
        assert (resumed["phase"], resumed["step"], resumed["weight"]) == ("RUNNING", 2, 60)
        assert resumed["analysis"]["canary"]["requests"] >= 10
        await until_status(client, canary, "ACTIVE")
        await client.app.state.invocation.figures.publish()
        # the half measured before the restart and the half after make the step's 20
        await on_canary(client, stable, canary, 20 - resumed["analysis"]["canary"]["requests"])
        assert (await reading(client, stable))["step"] == 3


async def test_a_step_does_not_advance_while_the_canary_has_no_running_instance(
    settings: Settings,
) -> None:
    async with server(settings) as client:
        stable, canary = await released(client)
        await on_canary(client, stable, canary, 10)
        await without_reconciler(client)
        resp = await client.get(dep_url(canary))
        deployment_id = uuid.UUID(resp.json()["deployment"]["deploymentId"])

        async def phase(value: Phase) -> None:
            async with client.app.state.sessionmaker() as session, session.begin():
                await session.execute(
                    update(Instance)
                    .where(Instance.deployment_id == deployment_id)
                    .values(phase=value)
                )

        await phase(Phase.STARTING)
        held = await reading(client, stable)
        assert (held["phase"], held["step"], held["analysis"]["canary"]["requests"]) == (
            "RUNNING",
            1,
            10,
        )
        await phase(Phase.RUNNING)
        assert (await reading(client, stable))["step"] == 2


async def test_two_replicas_sum_their_figures_and_take_each_decision_once(
    settings: Settings,
) -> None:
    async with server(settings) as client:
        stable, canary = await released(client)
        maker = client.app.state.sessionmaker
        # two replicas each measured half of the step's requests
        for owner in ("replica-a", "replica-b"):
            tally = Tally()
            for _ in range(5):
                tally.add(False, 0.01)
            async with maker() as session, session.begin():
                releases = await watched(session)
                await report(session, owner, {uuid.UUID(canary["versionId"]): tally}, releases)
        loops = [CanaryLoop(maker, period=3600), CanaryLoop(maker, period=3600)]
        decisions = await asyncio.gather(*(loop.round() for loop in loops))
        assert sorted(len(d) for d in decisions) == [0, 1]
        after = await shown(client, stable)
        assert after["step"] == 2
        reasons = [
            e["reason"]
            for e in (
                await client.get(f"{V}/deployments/{await dep_id(client, canary)}/events")
            ).json()["events"]
            if e["kind"] == "canary"
        ]
        assert reasons == ["CanaryStarted", "CanaryAdvanced"]


async def dep_id(client: AppClient, fn: dict[str, Any]) -> str:
    resp = await client.get(dep_url(fn))
    return str(resp.json()["deployment"]["deploymentId"])


async def test_a_rollback_that_undeploys_the_canary_and_a_reconciler_pass_both_complete(
    database_url: str,
) -> None:
    async with writers(database_url) as w:
        maker = make_sessionmaker(w.engine)
        now = utcnow()
        async with maker() as session, session.begin():
            fid, stable = await add_version(session, status="ACTIVE")
            canary = uuid.uuid4()
            session.add(
                FunctionVersion(
                    id=canary, function_id=fid, account_id=ACCOUNT, name="fn", status="ACTIVE",
                    inference_url="/infer", inference_port=8000, api_body_format="CUSTOM",
                    function_type="DEFAULT", health={}, description="", tags=[],
                )
            )  # fmt: skip
            deployments = {}
            for vid in (stable, canary):
                deployments[vid] = uuid.uuid4()
                session.add(
                    Deployment(
                        id=deployments[vid], account_id=ACCOUNT, function_id=fid, version_id=vid,
                        function_name="fn", desired="deployed", feature_flags={}, generation=1,
                    )
                )  # fmt: skip
            release = CanaryRelease(
                function_id=fid, active_function_id=fid, canary_version_id=canary,
                stable_version_id=stable, plan=PLAN, undeploy_on_rollback=True,
                phase="RUNNING", step=0, step_started_at=now,
            )  # fmt: skip
            session.add(release)
        store = ReconcileStore(maker, "test", 30)
        async with maker() as finishing:
            # the reconciler's T3 over the canary's deployment holds the canary version
            await store.lock_versions(finishing, [canary])

            async def roll_back() -> bool:
                async with maker() as session, session.begin():
                    row = await session.get_one(CanaryRelease, release.id)
                    state = CanaryState(CanaryPhase.ROLLED_BACK, 0, now)
                    return await transitions.write_state(
                        session, row, state, message="rolled back", now=now
                    )

            rolling_back = asyncio.create_task(roll_back())
            await w.until_waiting()
            await store.lock_deployments(finishing, [deployments[canary]], skip_locked=False)
            await finishing.commit()
        assert await rolling_back
        async with maker() as session:
            assert (await session.get_one(CanaryRelease, release.id)).phase == "ROLLED_BACK"
            undeployed = await session.get_one(Deployment, deployments[canary])
            assert undeployed.desired == "deleting"
