"""History of removed deployments (service/deployments/history.py): the timeline and the failed
instances stay readable, for the deployment's account only, until the retention expires; the
purge then deletes them in bounded batches and costs one index probe when nothing expired.
On both databases."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, select, update

from service.core.db import utcnow
from service.deployments.history import HistoryConfig, HistoryPurger
from service.deployments.models import (
    Deployment,
    DeploymentEvent,
    DeploymentHistory,
    DeploymentSpec,
    Instance,
)
from tests.support.api import bearer, create_fn, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V, dep_url, eventually, until_status, write_catalog

H100 = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 1}
FAST = {
    "reconcile_interval": 0.05,
    "reconcile_resync_seconds": 0.1,
    "health_image_pull_timeout": 0.5,
    "health_pod_scheduling_timeout": 1.0,
}
DAY = 86400.0


async def _failing_deployment(client: AppClient) -> tuple[dict[str, Any], str]:
    """A deployment whose only instance fails (image pull) and whose version is in ERROR;
    (function, deployment id)."""
    fn = await create_fn(client)
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})
    assert resp.status_code == 200, resp.text
    dep_id = resp.json()["deployment"]["deploymentId"]
    # Container functions offer no way to set pod annotations: inject the fault into the
    # stored objects before the reconciler starts.
    async with client.app.state.sessionmaker() as session, session.begin():
        spec = (await session.execute(select(DeploymentSpec))).scalar_one()
        objects = json.loads(json.dumps(spec.objects))
        for obj in objects:
            template = obj.get("spec", {}).get("template")
            if template is not None:
                meta = template.setdefault("metadata", {})
                meta.setdefault("annotations", {})["sim.nvcf.io/fault"] = "ImagePullBackOff"
        await session.execute(
            update(DeploymentSpec).where(DeploymentSpec.id == spec.id).values(objects=objects)
        )
    reconciler = client.app.state.reconciler
    assert reconciler is not None
    reconciler.start()
    await until_status(client, fn, "ERROR")
    return fn, dep_id


async def _count(client: AppClient, model: Any, **where: Any) -> int:
    async with client.app.state.sessionmaker() as session:
        stmt = select(func.count()).select_from(model)
        for name, value in where.items():
            stmt = stmt.where(getattr(model, name) == value)
        return int((await session.execute(stmt)).scalar_one())


async def test_removed_deployment_keeps_timeline_and_failed_instances_until_retention(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await client_factory(
        clusters_file=write_catalog(tmp_path), reconciler_enabled=False, **FAST
    )
    fn, dep_id = await _failing_deployment(client)
    resp = await client.delete(dep_url(fn))
    assert resp.status_code == 200, resp.text
    history_url = f"{dep_url(fn)}/history"

    async def removed() -> list[dict[str, Any]]:
        resp = await client.get(history_url)
        assert resp.status_code == 200, resp.text
        return list(resp.json()["deployments"])

    [listed] = await eventually(removed)
    uid = uuid.UUID(dep_id)
    assert await _count(client, Deployment, id=uid) == 0
    assert await _count(client, Instance, deployment_id=uid) == 0
    assert (await client.get(dep_url(fn))).status_code == 404  # no live deployment

    # the removed deployment, its failed instance and why it failed
    got = (await client.get(f"{V}/deployments/{dep_id}")).json()["deployment"]
    assert got == listed
    assert got["deploymentId"] == dep_id and got["functionStatus"] == "INACTIVE"
    assert got["instances"] == []
    [failed] = got["failedInstances"]
    assert failed["phase"] == "Failed" and failed["reason"] == "ImagePullIssues"
    assert got["deploymentSpecifications"][0]["gpu"] == "H100"
    assert failed["gpuSpecificationId"] == got["deploymentSpecifications"][0]["gpuSpecificationId"]
    assert "ImagePullIssues" in got["healthInfo"][0]["error"]
    removed_at = datetime.fromisoformat(got["removedAt"])
    expires_at = datetime.fromisoformat(got["historyExpiresAt"])
    assert expires_at - removed_at == timedelta(days=7)  # the default retention

    # the whole timeline, ending with the removal
    events_url = f"{V}/deployments/{dep_id}/events"
    events = (await client.get(events_url)).json()["events"]
    kinds = [e["kind"] for e in events]
    assert kinds[:2] == ["validation", "dispatch"]
    assert any(e.get("reason") == "ImagePullIssues" for e in events)
    assert events[-1]["kind"] == "teardown" and events[-1]["reason"] == "Removed"
    assert got["historyExpiresAt"] in events[-1]["message"]
    paged = (await client.get(events_url, params={"limit": 2})).json()
    assert [e["kind"] for e in paged["events"]] == kinds[:2] and paged["nextCursor"]

    # another account sees none of it
    other = bearer(await new_key(client, ["deploy_function", "list_functions"], account="acct-b"))
    assert (await client.get(events_url, headers=other)).status_code == 404
    assert (await client.get(f"{V}/deployments/{dep_id}", headers=other)).status_code == 404
    assert (await client.get(history_url, headers=other)).status_code == 404

    # the running purge leaves what has not expired
    n_events = len(events)
    purger = client.app.state.history_purger
    assert purger is not None
    assert (await purger.purge()).deployments == 0  # nothing has expired yet
    assert await _count(client, DeploymentEvent, deployment_id=uid) == n_events

    # after the retention: gone, by a purge on a clock past the expiry (no sleeping)
    late = HistoryPurger(
        client.app.state.sessionmaker, clock=lambda: expires_at + timedelta(seconds=1)
    )
    report = await late.purge()
    assert (report.deployments, report.events) == (1, n_events)
    assert await _count(client, DeploymentHistory) == 0
    assert await _count(client, DeploymentEvent, deployment_id=uid) == 0
    assert (await client.get(events_url)).status_code == 404
    assert (await client.get(f"{V}/deployments/{dep_id}")).status_code == 404
    assert (await client.get(history_url)).json() == {"deployments": []}


# --- history rows written directly: reads, isolation, the purge ------------------------------


async def _add_history(
    client: AppClient,
    *,
    expires_in: float,
    events: int = 3,
    account: str = "nvcf-default",
    function_id: uuid.UUID | None = None,
    version_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """A removed deployment's history row (expiring `expires_in` seconds from now) and
    `events` timeline entries."""
    now = utcnow()
    dep_id = uuid.uuid4()
    async with client.app.state.sessionmaker() as session, session.begin():
        session.add(
            DeploymentHistory(
                id=dep_id,
                account_id=account,
                function_id=function_id or uuid.uuid4(),
                version_id=version_id or uuid.uuid4(),
                function_name="gone",
                specifications=[],
                failed_instances=[],
                created_at=now - timedelta(hours=1),
                removed_at=now - timedelta(minutes=1),
                expires_at=now + timedelta(seconds=expires_in),
            )
        )
        session.add_all(
            DeploymentEvent(deployment_id=dep_id, at=now, kind="status", message=f"event {i}")
            for i in range(events)
        )
    return dep_id


async def test_expired_history_is_unreadable_before_the_purge_runs(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(reconciler_enabled=False)
    fresh = await _add_history(client, expires_in=DAY)
    stale = await _add_history(client, expires_in=-1)
    assert (await client.get(f"{V}/deployments/{fresh}/events")).status_code == 200
    for path in (f"{V}/deployments/{stale}", f"{V}/deployments/{stale}/events"):
        assert (await client.get(path)).status_code == 404


async def test_version_history_lists_removed_deployments_of_the_callers_version(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(reconciler_enabled=False)
    fn = await create_fn(client)
    fid, vid = uuid.UUID(fn["id"]), uuid.UUID(fn["versionId"])
    url = f"{dep_url(fn)}/history"
    assert (await client.get(url)).json() == {"deployments": []}  # owned, nothing removed
    first = await _add_history(client, expires_in=DAY, function_id=fid, version_id=vid)
    second = await _add_history(client, expires_in=DAY, function_id=fid, version_id=vid)
    await _add_history(client, expires_in=-1, function_id=fid, version_id=vid)  # expired
    await _add_history(client, expires_in=DAY, version_id=vid)  # another function id
    listed = (await client.get(url)).json()["deployments"]
    assert sorted(d["deploymentId"] for d in listed) == sorted([str(first), str(second)])
    page = (await client.get(url, params={"limit": 1})).json()
    assert len(page["deployments"]) == 1 and page["nextCursor"]
    rest = (await client.get(url, params={"limit": 1, "cursor": page["nextCursor"]})).json()
    assert [d["deploymentId"] for d in page["deployments"] + rest["deployments"]] == [
        d["deploymentId"] for d in listed
    ]

    # the version deleted: its history still answers; another account's: 404
    assert (await client.delete(f"{V}/functions/{fid}/versions/{vid}")).status_code == 204
    assert len((await client.get(url)).json()["deployments"]) == 2
    other = bearer(await new_key(client, ["deploy_function"], account="acct-b"))
    assert (await client.get(url, headers=other)).status_code == 404
    theirs = await _add_history(client, expires_in=DAY, account="acct-b")
    assert (await client.get(f"{V}/deployments/{theirs}/events")).status_code == 404
    mine = f"{V}/deployments/{first}/events"
    assert (await client.get(mine, headers=other)).status_code == 404


async def test_purge_deletes_expired_history_in_bounded_batches(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(reconciler_enabled=False)
    expired = [await _add_history(client, expires_in=-60, events=7) for _ in range(5)]
    kept = await _add_history(client, expires_in=DAY, events=4)
    purger = HistoryPurger(
        client.app.state.sessionmaker, HistoryConfig(batch=2, event_chunk=3, period=0)
    )
    report = await purger.purge()
    assert (report.deployments, report.events) == (5, 35)
    # 3 batches (2, 2, 1): each a read, ⌈14/3⌉ (or ⌈7/3⌉) event deletes, one entry delete
    assert report.transactions == 3 + (5 + 5 + 3) + 3
    assert await _count(client, DeploymentHistory) == 1
    assert await _count(client, DeploymentEvent) == 4
    for dep_id in expired:
        assert await _count(client, DeploymentEvent, deployment_id=dep_id) == 0
    assert await _count(client, DeploymentEvent, deployment_id=kept) == 4


async def test_purge_with_nothing_expired_is_one_index_probe(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(reconciler_enabled=False)
    for _ in range(20):
        await _add_history(client, expires_in=DAY, events=2)
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    engine = client.app.state.engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        report = await HistoryPurger(client.app.state.sessionmaker).purge()
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert (report.deployments, report.events, report.transactions) == (0, 0, 1)
    [statement] = [s for s in statements if not s.lstrip().upper().startswith(("BEGIN", "ROLL"))]
    assert "deployment_history.expires_at <=" in statement and "LIMIT" in statement.upper()


async def test_the_app_runs_the_purge_where_the_reconciler_runs(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(history_purge_seconds=0.05, history_retention_seconds=60)
    purger = client.app.state.history_purger
    assert purger is not None and purger.config.retention == 60
    reconciler = client.app.state.reconciler
    assert reconciler is not None and reconciler.config.history_retention == 60
    await _add_history(client, expires_in=-1)

    async def purged() -> bool:
        return await _count(client, DeploymentHistory) == 0

    await eventually(purged, seconds=10)
