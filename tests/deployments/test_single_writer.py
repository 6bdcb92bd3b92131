"""The one writer of deployment state (service/deployments/transitions/): a stored instance's
phase, condition and desired state, a stored deployment's desired state and a stored version's
status change only in that package. Two checks: the ORM attributes are watched while a function
goes through its life over the HTTP API with the reconciler running (deploy, ACTIVE, rescale,
secrets, undeploy, version delete), and no SQL `update(...).values(...)` outside the package
sets those columns (read from the source). Each is seen catching a write made elsewhere."""

from __future__ import annotations

import ast
import inspect
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, select
from sqlalchemy import inspect as orm_inspect
from sqlalchemy.orm import InstrumentedAttribute

from service.deployments.models import Deployment, Instance
from service.functions.models import FunctionVersion
from tests.support.api import create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V, dep_url, eventually, until_status, write_catalog

WRITER = "service.deployments.transitions"
WATCHED: list[InstrumentedAttribute[Any]] = [
    Instance.phase,
    Instance.condition,
    Instance.desired,
    Deployment.desired,
    FunctionVersion.status,
]
FAST = {
    "reconcile_interval": 0.05,
    "reconcile_resync_seconds": 0.1,
    "health_image_pull_timeout": 0.5,
    "health_pod_scheduling_timeout": 1.0,
}
H100 = {"gpu": "H100", "backend": "e2e", "minInstances": 1, "maxInstances": 2}


def _writer() -> str:
    """The module that assigned the attribute: the first frame outside SQLAlchemy above the
    listener."""
    here = inspect.currentframe()
    frame = here.f_back.f_back if here is not None and here.f_back is not None else None
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith("sqlalchemy"):
            return module
        frame = frame.f_back
    return "?"


@contextmanager
def writes() -> Iterator[list[tuple[str, str]]]:
    """(attribute, writing module) of every change of a watched attribute of a stored row."""
    seen: list[tuple[str, str]] = []
    listeners = []
    for attribute in WATCHED:
        name = f"{attribute.class_.__name__}.{attribute.key}"

        def listener(target: Any, value: Any, old: Any, initiator: Any, name: str = name) -> None:
            if orm_inspect(target).persistent:  # a new row's first values are not changes
                seen.append((name, _writer()))

        event.listen(attribute, "set", listener)
        listeners.append((attribute, listener))
    try:
        yield seen
    finally:
        for attribute, listener in listeners:
            event.remove(attribute, "set", listener)


def outside_the_writer(seen: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted({(a, m) for a, m in seen if m.startswith("service.") and WRITER not in m})


async def test_only_transitions_change_deployment_state(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await client_factory(clusters_file=write_catalog(tmp_path), **FAST)
    with writes() as seen:
        fn = await create_fn(client)
        resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [H100]})
        assert resp.status_code == 200, resp.text
        await until_status(client, fn, "ACTIVE")
        dep = resp.json()["deployment"]
        spec_id = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
        patched = await client.patch(
            f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{spec_id}",
            json={"minInstances": 2},
        )
        assert patched.status_code == 200, patched.text
        secrets = await client.put(
            f"{V}/secrets/functions/{fn['id']}/versions/{fn['versionId']}",
            json={"secrets": [{"name": "A", "value": "1"}]},
        )
        assert secrets.status_code == 204, secrets.text
        assert (await client.delete(dep_url(fn))).status_code == 200
        await until_status(client, fn, "INACTIVE")
        gone = await client.delete(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
        assert gone.status_code == 204
        await eventually(lambda: _no_instances(client))
    changed = {a for a, _ in seen}
    assert changed >= {"Instance.phase", "Instance.condition", "Deployment.desired"}
    assert outside_the_writer(seen) == []


async def _no_instances(client: AppClient) -> bool:
    async with client.app.state.sessionmaker() as session:
        return (await session.execute(select(Instance.id).limit(1))).first() is None


async def test_a_write_elsewhere_is_caught(client_factory: ClientFactory, tmp_path: Path) -> None:
    client = await client_factory(clusters_file=write_catalog(tmp_path), **FAST)
    fn = await create_fn(client)
    with writes() as seen:
        async with client.app.state.sessionmaker() as session:
            version = await session.get(FunctionVersion, uuid.UUID(fn["versionId"]))
            assert version is not None
            version.status = "ACTIVE"
            await session.rollback()
    assert seen == [("FunctionVersion.status", __name__)]
    assert outside_the_writer([("FunctionVersion.status", "service.functions.service")]) == [
        ("FunctionVersion.status", "service.functions.service")
    ]


SERVICE = Path(__file__).resolve().parents[2] / "service"
#: model -> the columns only the writer sets
COLUMNS = {
    "Instance": {"phase", "condition", "desired"},
    "Deployment": {"desired"},
    "FunctionVersion": {"status"},
}


def bulk_writes(source: str) -> list[tuple[str, str, int]]:
    """(model, column, line) of each `update(Model)....values(column=...)` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "values":
            continue
        receiver: ast.expr = node.func.value
        while isinstance(receiver, ast.Call | ast.Attribute):
            if (
                isinstance(receiver, ast.Call)
                and isinstance(receiver.func, ast.Name)
                and receiver.func.id == "update"
                and receiver.args
                and isinstance(receiver.args[0], ast.Name)
            ):
                model = receiver.args[0].id
                found += [
                    (model, k.arg, node.lineno)
                    for k in node.keywords
                    if k.arg in COLUMNS.get(model, set())
                ]
                break
            receiver = receiver.func if isinstance(receiver, ast.Call) else receiver.value
    return found


def test_no_bulk_write_of_deployment_state_outside_the_writer() -> None:
    offending = [
        f"{path.relative_to(SERVICE.parent)}:{line} sets {model}.{column}"
        for path in sorted(SERVICE.rglob("*.py"))
        if "transitions" not in path.relative_to(SERVICE).parts
        for model, column, line in bulk_writes(path.read_text())
    ]
    assert offending == []
    writer = SERVICE / "deployments" / "transitions" / "status.py"
    assert ("FunctionVersion", "status") in {(m, c) for m, c, _ in bulk_writes(writer.read_text())}


def test_the_source_check_sees_a_bulk_write() -> None:
    source = (
        "stmt = update(Instance).where(Instance.id == i).values(due_at=now)\n"
        "other = update(Instance).where(Instance.id == i).values(phase='Running', due_at=now)\n"
    )
    assert bulk_writes(source) == [("Instance", "phase", 2)]
