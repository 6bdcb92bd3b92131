"""A task's log through the route that reads it as an instance's: its container's lines while
it runs (the simulated runner prints its script's steps), and the last of them kept once it
ended and left its cluster."""

from __future__ import annotations

from pathlib import Path

from tests.support.app import ClientFactory
from tests.support.e2e import eventually
from tests.support.helm_e2e import fast_catalog
from tests.support.tasks import BASE, script


async def test_a_tasks_log_shows_its_lines_while_it_runs_and_keeps_them_after_it_ends(
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

    async def left() -> bool:
        events = (await client.get(f"{path}/events")).json()["events"]
        return any(e["message"] == "Task container stopped" for e in events)

    await eventually(left)
    # its objects are gone from the cluster: the lines kept as they left are shown
    kept = await client.get(f"{path}/logs", params={"container": "task"})
    assert kept.status_code == 200, kept.text
    lines = kept.text.splitlines()
    assert lines[0].endswith(
        "/task] INFO     Starting task container task (nvcr.io/acme/trainer:1.0)"
    )
    assert any(
        x.endswith("/task] INFO     progress 10%, checkpoint ckpt-1 (1 files)") for x in lines
    )
    assert lines[-1].endswith("task container exited with code 143"), lines
    tail = await client.get(f"{path}/logs", params={"tailLines": 1})
    assert tail.text.splitlines() == [lines[-1]]
    assert (await client.get(f"{path}/logs", params={"container": "sidecar"})).text == ""
