"""`nvcf task ...` against a real server (simulated clusters, their task runner's scripts): a
task followed with `--wait` to COMPLETED, its percent and checkpoints shown as they come; one
that errs (exit 3 with its reason); a wait that times out (exit 4); a canceled task (exit 3
with its timeline); list, get, events, results, cancel, delete; a body file under options;
`-o json`; usage errors; a running task's logs, followed to its end, then kept after it."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.client_cli.tasks import progress_line
from tests.support.client_cli import Nvcf, served

H100 = ("--gpu", "H100", "--instance-type", "NCP.GPU.H100_1x")
L40S = ("--gpu", "L40S", "--instance-type", "DGXC.GPU.L40S_1x")
#: the simulated task runner's script (service/backends/simulated/tasks.py): 10 → 50 with
#: checkpoint ckpt-1 → 100 with checkpoint ckpt-2, then exit 0
CHECKPOINTS = {
    "steps": [
        {"after": 0.2, "percent": 10},
        {"after": 0.3, "percent": 50, "name": "ckpt-1", "files": {"w.bin": "one"}},
        # ckpt-1 stays the current result for a second: many passes of the task loop read it
        {"after": 1.0, "percent": 100, "name": "ckpt-2", "files": {"w.bin": "two"}},
    ],
    "exitAfter": 0.1,
}
#: 20, then an exit with code 1 without completing
FAILS = {"steps": [{"after": 0.1, "percent": 20}], "exitAfter": 0.1, "exitCode": 1}
#: 10, then three seconds more before its exit: its log is read, then followed to the end
LOGGED = {"steps": [{"after": 0.2, "percent": 10}], "exitAfter": 8}
#: on sim-fast a task without a script completes after half a second; on sim-slow it runs
#: for an hour
CATALOG = {
    "clusterGroups": [
        {
            "name": "nvcf-default",
            "clusters": [
                {
                    "name": name,
                    "adapter": "simulated",
                    "provider": provider,
                    "region": "us-east-1",
                    "k8sVersion": "1.30.0",
                    "nodes": [
                        {"gpu": gpu, "gpusPerNode": 1, "count": 4, "cpu": 16, "memory": "128Gi"}
                    ],
                    "simulation": {
                        "scheduleSeconds": 0.1,
                        "pullSeconds": 0.1,
                        "readySeconds": ready,
                    },
                }
                for name, provider, gpu, ready in (
                    ("sim-fast", "NCP", "H100", 0.5),
                    ("sim-slow", "DGXC", "L40S", 3600),
                )
            ],
        }
    ]
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("server")
    catalog = data / "clusters.yaml"
    catalog.write_text(yaml.safe_dump(CATALOG))
    with served(data, NVCF_TASKS_INTERVAL="0.05", NVCF_CLUSTERS_FILE=str(catalog)) as url:
        yield url


@pytest.fixture
def nvcf(server: str, tmp_path: Path) -> Nvcf:
    return Nvcf(server, tmp_path / "config")


def task_args(
    name: str, gpu: tuple[str, ...] = H100, script: dict[str, Any] | None = None
) -> tuple[str, ...]:
    image = "nvcr.io/acme/trainer:1.0"
    args = ("task", "create", "--name", name, *gpu, "--image", image, "--result-strategy", "none")
    return (*args, "--env", f"SIM_TASK_SCRIPT={json.dumps(script)}") if script else args


def test_create_wait_follows_a_task_to_completed(nvcf: Nvcf) -> None:
    done = nvcf(*task_args("train"), "--wait", "--timeout", "60")
    assert done.exit_code == 0, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert lines[0].startswith("created task ")
    task_id = lines[0].split()[2]
    assert lines[-1] == f"task {task_id} COMPLETED 100%"
    assert "COMPLETED" in done.stdout and task_id in done.stdout

    got = nvcf.json("task", "get", task_id)["task"]
    assert (got["status"], got["percentComplete"]) == ("COMPLETED", 100)
    assert nvcf.json("task", "results", task_id) == {"results": []}
    events = nvcf.json("task", "events", task_id)["events"]
    assert len(events) >= 3 and all(e["taskId"] == task_id for e in events)
    shown = nvcf("task", "events", task_id)
    assert shown.exit_code == 0 and events[-1]["message"] in shown.stdout
    listed = nvcf.json("task", "list", "--status", "COMPLETED")["tasks"]
    assert task_id in [t["id"] for t in listed]
    table = nvcf("task", "list")
    assert table.exit_code == 0 and task_id in table.stdout and "COMPLETED" in table.stdout


def test_wait_shows_percent_and_checkpoints_as_they_come(nvcf: Nvcf) -> None:
    done = nvcf(*task_args("checkpoints", script=CHECKPOINTS), "--wait", "-o", "json")
    assert done.exit_code == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["task"]["status"] == "COMPLETED"
    assert [r["name"] for r in body["results"]] == ["ckpt-1", "ckpt-2"]
    task_id = body["task"]["id"]
    lines = done.stderr.splitlines()
    assert lines[-1] == f"task {task_id} COMPLETED 100%; checkpoints: ckpt-1, ckpt-2"
    # a line at each change seen, in order: the percent never goes down
    percents = [int(m) for line in lines for m in re.findall(r" (\d+)%", line)]
    assert percents == sorted(percents) and percents[-1] == 100
    table = nvcf("task", "results", task_id)
    assert table.exit_code == 0 and "ckpt-2" in table.stdout


def test_a_task_that_errs_exits_3_with_its_reason(nvcf: Nvcf) -> None:
    done = nvcf(*task_args("fails", script=FAILS), "--wait", "--timeout", "60")
    assert done.exit_code == 3, (done.stdout, done.stderr)
    assert "ended ERRORED: the container exited with code 1" in done.stderr


def test_the_progress_line_names_percent_and_checkpoints() -> None:
    task = {"id": "t-1", "status": "RUNNING", "percentComplete": 50}
    assert progress_line(task, ["ckpt-1", "ckpt-2"]) == (
        "task t-1 RUNNING 50%; checkpoints: ckpt-1, ckpt-2"
    )
    assert progress_line({"id": "t-1", "status": "QUEUED"}, []) == "task t-1 QUEUED"


def test_wait_times_out_with_exit_4_then_a_canceled_task_exits_3(nvcf: Nvcf) -> None:
    task_id = nvcf.json(*task_args("hangs", L40S))["task"]["id"]
    timed_out = nvcf("task", "get", task_id, "--wait", "--timeout", "0.5")
    assert timed_out.exit_code == 4, (timed_out.stdout, timed_out.stderr)
    assert "timed out after 0.5s" in timed_out.stderr

    canceled = nvcf.json("task", "cancel", task_id)["task"]
    assert canceled["id"] == task_id
    ended = nvcf("task", "get", task_id, "--wait", "--timeout", "60")
    assert ended.exit_code == 3, (ended.stdout, ended.stderr)
    assert f"task {task_id} ended CANCELED" in ended.stderr
    timeline = nvcf.json("task", "events", task_id)["events"]
    assert timeline[-1]["message"] in ended.stdout  # the timeline is printed
    deleted = nvcf("task", "delete", task_id)
    assert deleted.exit_code == 0 and f"deleted task {task_id}" in deleted.stderr
    gone = nvcf("task", "get", task_id)
    assert gone.exit_code == 1 and "404" in gone.stderr


def test_a_body_file_with_options_over_it(nvcf: Nvcf, tmp_path: Path) -> None:
    body = {
        "name": "from-file",
        "gpuSpecification": {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x"},
        "containerImage": "nvcr.io/acme/trainer:1.0",
        "resultHandlingStrategy": "NONE",
        "secrets": [{"name": "TOKEN", "value": "old"}, {"name": "OTHER", "value": "x"}],
        "tags": ["a"],
    }
    path = tmp_path / "task.json"
    path.write_text(json.dumps(body))
    task = nvcf.json(
        "task", "create", "-f", str(path), "--name", "overridden", "--secret", "TOKEN=new"
    )["task"]
    assert task["name"] == "overridden"
    assert task["tags"] == ["a"]
    shown = nvcf.json("task", "get", task["id"], "--include-secrets")["task"]
    assert sorted(shown["secrets"]) == ["OTHER", "TOKEN"]
    nvcf("task", "delete", task["id"])


def test_bad_input_is_a_usage_error_or_every_violation(nvcf: Nvcf) -> None:
    bad_env = nvcf("task", "create", "--name", "x", *H100, "--env", "NOEQUALS")
    assert bad_env.exit_code == 2 and "NAME=VALUE" in bad_env.stderr
    bad_model = nvcf("task", "create", "--name", "x", *H100, "--model", "only-a-name")
    assert bad_model.exit_code == 2 and "name:version:uri" in bad_model.stderr
    refused = nvcf("task", "create", "--name", "bad name!", "--gpu", "H100")
    assert refused.exit_code == 1
    assert "name" in refused.stderr and "instanceType" in refused.stderr


def test_logs_of_a_running_task_then_followed_to_its_end(nvcf: Nvcf) -> None:
    task_id = nvcf.json(*task_args("logged", script=LOGGED))["task"]["id"]
    deadline = time.monotonic() + 30
    while nvcf.json("task", "get", task_id)["task"].get("percentComplete") != 10:
        assert time.monotonic() < deadline, "the task never reached 10%"
        time.sleep(0.05)

    shown = nvcf("task", "logs", task_id, "--tail", "50", "--since", "10m", "--timestamps")
    assert shown.exit_code == 0, shown.stderr
    # as printed, each line labelled with its container, then its time
    started = r"\[task-\w+/task\] \d{4}-\d\d-\d\dT\S+ INFO     Starting task container task "
    assert re.match(started, shown.stdout), shown.stdout
    one = nvcf("task", "logs", task_id, "-c", "task")
    assert "INFO     progress 10%" in one.stdout.splitlines()
    assert nvcf.json("task", "logs", task_id, "-c", "task", "--tail", "1") == {
        "line": one.stdout.splitlines()[-1]
    }

    followed = nvcf("task", "logs", task_id, "-f", "-c", "task")  # returns when the task ends
    assert followed.exit_code == 0, followed.stderr
    assert "INFO     progress 10%" in followed.stdout.splitlines()

    # once it ended and left its cluster, the lines kept as it left
    removed = "Task objects removed from the cluster"
    while removed not in [e["message"] for e in nvcf.json("task", "events", task_id)["events"]]:
        assert time.monotonic() < deadline + 30, "the task's objects were never removed"
        time.sleep(0.05)
    kept = nvcf("task", "logs", task_id, "-c", "task")
    assert kept.exit_code == 0, kept.stderr
    assert kept.stdout.splitlines()[-1].endswith("INFO     task container exited with code 0")
    assert any(x.endswith("INFO     progress 10%") for x in kept.stdout.splitlines())

    bad = nvcf("task", "logs", task_id, "--since", "soon")
    assert bad.exit_code == 2 and "--since 'soon'" in bad.stderr
    missing = nvcf("task", "logs", "00000000-0000-0000-0000-000000000000")
    assert missing.exit_code == 1 and "404" in missing.stderr
