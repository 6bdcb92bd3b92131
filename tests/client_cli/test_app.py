"""The `nvcf` command against a real server (the built-in simulated catalog): a container
function created, deployed with `--wait`, inspected, followed and undeployed; `-o json`; API
errors with every violation; login's file; help, exit codes and NO_COLOR."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

from service.client_cli.app import app
from tests.support.app import ADMIN_KEY
from tests.support.client_cli import Nvcf, served

ECHO = (
    "--image",
    "nvcr.io/acme/echo:1.0",
    "--inference-url",
    "/echo",
    "--inference-port",
    "8000",
)
H100 = ("--gpu", "H100", "--instance-type", "NCP.GPU.H100_1x")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with served(tmp_path_factory.mktemp("server")) as url:
        yield url


@pytest.fixture
def nvcf(server: str, tmp_path: Path) -> Nvcf:
    return Nvcf(server, tmp_path / "config")


def create(nvcf: Nvcf, name: str) -> tuple[str, str]:
    fn = nvcf.json("function", "create", "--name", name, *ECHO)["function"]
    return str(fn["id"]), str(fn["versionId"])


def test_create_deploy_wait_status_events_undeploy(nvcf: Nvcf) -> None:
    fid, vid = create(nvcf, "lifecycle")

    done = nvcf("deploy", fid, vid, *H100, "--min", "1", "--wait")
    assert done.exit_code == 0, done.stderr
    assert "Running" in done.stdout and "sim-ncp" in done.stdout  # the live view's last frame
    assert f"{vid} is ACTIVE" in done.stderr

    state = nvcf.json("status", fid, vid)
    assert state["function"]["status"] == "ACTIVE"
    dep = state["deployment"]
    assert [i["phase"] for i in dep["instances"]] == ["Running"]
    table = nvcf("status", fid, vid)
    assert table.exit_code == 0 and "ACTIVE" in table.stdout and "NCP.GPU.H100_1x" in table.stdout

    events = nvcf.json("events", dep["deploymentId"])["events"]
    assert {"instance", "status"} <= {e["kind"] for e in events}
    timeline = nvcf("events", dep["deploymentId"])
    assert timeline.exit_code == 0 and "→ ACTIVE" in timeline.stdout

    done = nvcf("undeploy", fid, vid, "--wait")
    assert done.exit_code == 0, done.stderr
    after = nvcf.json("status", fid, vid)
    assert after["deployment"] is None and after["function"]["status"] == "INACTIVE"
    # the deployment is gone, its timeline stays (history): --follow prints it and ends at once
    followed = nvcf("events", dep["deploymentId"], "--follow", "--timeout", "60")
    assert followed.exit_code == 0, followed.stderr
    assert "deployment removed" in followed.stdout


def test_deploy_wait_json_scale_and_timeout(nvcf: Nvcf) -> None:
    fid, vid = create(nvcf, "scaling")
    # --timeout 0 looks once: the simulated pods take longer than one request to be ready
    done = nvcf("deploy", fid, vid, *H100, "--wait", "--timeout", "0", "-o", "json")
    assert done.exit_code == 4 and "timed out" in done.stderr
    assert json.loads(done.stdout)["deployment"]["functionStatus"] == "DEPLOYING"

    waited = nvcf.json("scale", fid, vid, "--min", "2", "--max", "2", "--wait")
    dep = waited["deployment"]
    assert dep["functionStatus"] == "ACTIVE"
    assert [i["phase"] for i in dep["instances"]] == ["Running", "Running"]
    assert dep["deploymentSpecifications"][0]["minInstances"] == 2

    followed = nvcf("events", dep["deploymentId"], "--follow", "--timeout", "0", "-o", "json")
    assert followed.exit_code == 4
    lines = [json.loads(line) for line in followed.stdout.splitlines()]
    assert lines and all("kind" in e and "at" in e for e in lines)

    gone = nvcf.json("undeploy", fid, vid, "--graceful", "--wait")
    assert gone["function"]["id"] == fid


def test_function_commands_print_json_documents(nvcf: Nvcf) -> None:
    fid, vid = create(nvcf, "crud")
    listed = nvcf.json("function", "list", "--name", "crud")["functions"]
    assert [(f["id"], f["versionId"]) for f in listed] == [(fid, vid)]
    second = nvcf.json("function", "create", "--function-id", fid, "--name", "crud", *ECHO)
    versions = nvcf.json("function", "get", fid)["functions"]
    assert {v["versionId"] for v in versions} == {vid, second["function"]["versionId"]}
    changed = nvcf.json(
        "function", "update", fid, vid, "--description", "new words", "--tag", "a", "--tag", "b"
    )
    assert changed["function"]["description"] == "new words"
    assert nvcf.json("function", "get", fid, vid)["function"]["tags"] == ["a", "b"]
    assert nvcf.json("function", "delete", fid, vid) == {
        "deleted": {"functionId": fid, "versionId": vid}
    }
    missing = nvcf("function", "get", fid, vid, "-o", "json")
    assert missing.exit_code == 1 and missing.stdout == ""
    assert "404" in missing.stderr and "request id:" in missing.stderr


def test_revisions_rollback_and_configure(nvcf: Nvcf, tmp_path: Path) -> None:
    fid, vid = create(nvcf, "revisions")
    assert nvcf("deploy", fid, vid, *H100, "--min", "1").exit_code == 0
    [first] = nvcf.json("revisions", fid, vid)["revisions"]
    assert (first["revision"], first["current"], first["target"]) == (1, True, True)
    table = nvcf("revisions", fid, vid)
    assert table.exit_code == 0 and "current, target" in table.stdout

    done = nvcf.json("rollback", fid, vid, "1", "--wait")
    assert done["gpuSpecification"]["revision"] == 1
    missing = nvcf("rollback", fid, vid, "7")
    assert missing.exit_code == 1 and "no revision 7" in missing.stderr

    values = tmp_path / "values.yaml"
    values.write_text("replicaCount: 2\n")
    refused = nvcf("configure", fid, vid, "--values", str(values))
    assert refused.exit_code == 1 and "configuration" in refused.stderr
    assert "only for helm functions" in refused.stderr
    assert nvcf("configure", fid, vid).exit_code == 2  # nothing to change


def test_api_errors_print_every_violation(nvcf: Nvcf) -> None:
    done = nvcf("function", "create", "--name", "bad name!", "--inference-port", "99999")
    assert done.exit_code == 1 and done.stdout == ""
    assert "400 Bad Request (4 violations)" in done.stderr
    for field in ("name:", "inferenceUrl:", "inferencePort:", "containerImage:"):
        assert f"  - {field}" in done.stderr


def test_login_saves_the_key_with_mode_0600_and_never_prints_it(nvcf: Nvcf) -> None:
    done = nvcf("login", "--url", nvcf.url, "--key", ADMIN_KEY, logged_in=False)
    assert done.exit_code == 0, done.stderr
    assert ADMIN_KEY not in done.stdout + done.stderr
    path = nvcf.config_home / "nvcf" / "config.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert json.loads(path.read_text()) == {"url": nvcf.url, "apiKey": ADMIN_KEY}
    # the saved profile is used ...
    listed = nvcf("function", "list", "-o", "json", logged_in=False)
    assert listed.exit_code == 0 and "functions" in json.loads(listed.stdout)
    # ... unless the environment says otherwise
    other = nvcf("function", "list", logged_in=False, env={"NVCF_API_KEY": "nvapi-wrong"})
    assert other.exit_code == 1 and "401" in other.stderr

    as_json = nvcf("login", "--url", nvcf.url, "--key", ADMIN_KEY, "-o", "json", logged_in=False)
    assert as_json.exit_code == 0 and ADMIN_KEY not in as_json.stdout + as_json.stderr
    assert json.loads(as_json.stdout)["configFile"] == str(path)

    # the key, prompted for, is not echoed either
    prompted = nvcf("login", "--url", nvcf.url, logged_in=False, input=ADMIN_KEY + "\n")
    assert prompted.exit_code == 0 and ADMIN_KEY not in prompted.stdout + prompted.stderr

    path.unlink()
    bad = nvcf("login", "--url", nvcf.url, "--key", "nvapi-not-a-key-xyz", logged_in=False)
    assert bad.exit_code == 1 and "401" in bad.stderr
    assert "nvapi-not-a-key-xyz" not in bad.stdout + bad.stderr
    assert not path.exists()
    assert nvcf("function", "list", logged_in=False).exit_code == 2  # not logged in: usage


def test_help_of_every_command_lists_the_exit_codes(nvcf: Nvcf) -> None:
    def commands(group: typer.Typer, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        yield prefix
        for info in group.registered_commands:
            callback = info.callback.__name__.replace("_", "-") if info.callback else ""
            yield (*prefix, info.name or callback)
        for sub in group.registered_groups:
            assert sub.typer_instance is not None and sub.name
            yield from commands(sub.typer_instance, (*prefix, sub.name))

    seen = list(commands(app, ()))
    assert ("deploy",) in seen and ("chart", "validate") in seen and ("function", "list") in seen
    for words in seen:
        done = nvcf(*words, "--help")
        assert done.exit_code == 0, words
        text = " ".join(done.stdout.split())
        assert "Exit codes: 0 ok; 1 API" in text and "4 timed out" in text, words


def test_no_color_turns_styling_off(nvcf: Nvcf) -> None:
    create(nvcf, "colors")
    colored = nvcf("function", "list", env={"FORCE_COLOR": "1"})
    assert colored.exit_code == 0 and "\x1b[" in colored.stdout
    plain = nvcf("function", "list", env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert plain.exit_code == 0 and "colors" in plain.stdout and "\x1b[" not in plain.stdout


def test_the_client_loads_nothing_of_the_server() -> None:
    code = (
        "import sys, service.client_cli.app\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'fastapi', 'sqlalchemy', 'starlette', 'uvicorn', 'lightkube'} "
        "or (m.startswith('service.') and not m.startswith('service.client_cli')))\n"
        "print(bad)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_invoke_prints_the_answer_and_follows_a_slow_one(nvcf: Nvcf, tmp_path: Path) -> None:
    fid, vid = create(nvcf, "invoked")
    assert nvcf("deploy", fid, vid, *H100, "--min", "1", "--wait").exit_code == 0

    answered = nvcf.json("invoke", fid, "--version", vid, "--data", '{"prompt": "hi"}')
    assert answered["status"] == 200 and answered["requestId"]
    assert answered["body"]["echo"] == {"prompt": "hi"}  # the simulated worker's echo
    assert answered["body"]["path"] == "/echo"

    body = tmp_path / "body.json"
    body.write_text('{"from": "a file"}')
    text = nvcf("invoke", fid, "--data", f"@{body}")  # no version: the server picks it
    assert text.exit_code == 0, text.stderr
    assert json.loads(text.stdout)["echo"] == {"from": "a file"}

    # the simulated worker takes 2.5 s, the server holds each call 1 s: 202s are followed
    slow = nvcf.json(
        "invoke", fid, "--poll-seconds", "1", "-H", "X-Sim-Delay-Ms: 2500", "--timeout", "120"
    )
    assert slow["status"] == 200 and slow["body"]["echo"] == {}

    unknown = nvcf("invoke", "00000000-0000-0000-0000-000000000000")
    assert unknown.exit_code == 1 and "404" in unknown.stderr
