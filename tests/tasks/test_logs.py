"""A task's log through the route that reads it as an instance's: its container's lines while
it runs (the simulated runner prints its script's steps), none once it ended and left."""

from __future__ import annotations

from pathlib import Path

from tests.support.app import ClientFactory
from tests.support.e2e import eventually
from tests.support.helm_e2e import fast_catalog
from tests.support.tasks import BASE, script


async def test_a_running_tasks_log_shows_its_containers_lines(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await client_factory(clusters_file=fast_catalog(tmp_path), tasks_interval=0.05)
    hang = script(
        steps=[{"after": 0.2, "percent": 10, "name": "ckpt-1", "files": {"w.bin": "one"}}],
        exitAfter=None,
    )
    body = {"name": "logs", **{k: v for k, v in BASE.items() if k != "name"}}
    resp = await client.post("/v1/nvct/tasks", json={**body, "containerEnvironment": hang})
    assert resp.status_code == 200, resp.text
    path = f"/v1/nvct/tasks/{resp.json()['task']['id']}"

    async def at_ten() -> bool:
        return bool((await client.get(path)).json()["task"].get("percentComplete") == 10)

    await eventually(at_ten)
    logs = await client.get(f"{path}/logs", params={"container": "task"})
    assert logs.status_code == 200, logs.text
    assert logs.headers["content-type"].startswith("text/plain")
    assert "INFO     progress 10%, checkpoint ckpt-1 (1 files)" in logs.text.splitlines()
    labelled = (await client.get(f"{path}/logs")).text
    assert "/task] INFO     Starting task container task (nvcr.io/acme/trainer:1.0)" in labelled

    assert (await client.post(f"{path}/cancel")).status_code == 200

    async def gone() -> bool:
        return (await client.get(f"{path}/logs")).text == ""

    await eventually(gone)
