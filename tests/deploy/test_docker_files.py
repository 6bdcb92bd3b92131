"""The Dockerfile and docker-compose.yml, checked as files (no Docker engine runs here): a
pinned base, a non-root user, a health check that really reaches /health; no well-known admin
key and nothing published beyond 127.0.0.1."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from service.core.settings import Settings
from tests.support.server import free_port, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in dockerfile.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "a continuation line ends the file"
    out = []
    for line in logical:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile() -> list[tuple[str, str]]:
    return instructions((ROOT / "Dockerfile").read_text())


def compose() -> dict[str, object]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


#: `image:tag@sha256:…`, or a tag naming an exact release (three numbers), never `latest`
PINNED = re.compile(
    r"^[\w./-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}$|^[\w./-]+:v?\d+\.\d+\.\d+(-[\w.-]+)?$"
)


def test_the_base_image_is_pinned() -> None:
    froms = [args.split()[0] for word, args in dockerfile() if word == "FROM"]
    assert froms, "no FROM"
    assert all(PINNED.match(image) for image in froms), froms
    assert PINNED.match("python:3.11.13-slim-bookworm")
    assert PINNED.match(f"python@sha256:{'a' * 64}")
    for loose in ("python:3.11-slim", "python:latest", "python", "python:3"):
        assert not PINNED.match(loose), loose


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    users = [args for word, args in dockerfile() if word == "USER"]
    assert users, "no USER: the container would run as root"
    uid, _, gid = users[-1].partition(":")
    # numeric, so Kubernetes' runAsNonRoot can check it; and not root
    assert uid.isdigit() and int(uid) > 0, users[-1]
    assert not gid or (gid.isdigit() and int(gid) > 0), users[-1]
    steps = dockerfile()
    last_user = max(i for i, (word, _) in enumerate(steps) if word == "USER")
    assert all(word != "RUN" for word, _ in steps[last_user:]), "RUN after USER"


def test_the_entrypoint_is_the_console_script_and_the_copied_paths_exist() -> None:
    steps = dict(dockerfile())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert json.loads(steps["ENTRYPOINT"]) == ["nvcf-server"]
    assert "nvcf-server" in project["project"]["scripts"]
    assert json.loads(steps["CMD"])[0] == "serve"
    for word, args in dockerfile():
        if word == "COPY":
            *sources, _ = args.split()
            assert all((ROOT / s).exists() for s in sources), args


def healthcheck_command() -> list[str]:
    (args,) = [args for word, args in dockerfile() if word == "HEALTHCHECK"]
    cmd = args[args.index("CMD") + 3 :].strip()
    command = json.loads(cmd)  # exec form: no shell (the slim image has no curl either)
    assert isinstance(command, list) and command[0] == "python"
    return [str(c) for c in command]


def test_the_healthcheck_asks_the_running_server_for_health(tmp_path: Path) -> None:
    """The HEALTHCHECK's own command, run against a real server and against nothing."""
    command = healthcheck_command()
    assert any("http://127.0.0.1:8080/health" in part for part in command)
    port = free_port()
    local = [sys.executable, *(c.replace(":8080/", f":{port}/") for c in command[1:])]
    proc = start_server(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'nvcf.db'}", port)
    try:
        up = subprocess.run(local, capture_output=True, timeout=30, check=False)
        assert up.returncode == 0, up.stderr
    finally:
        stop_server(proc)
    down = subprocess.run(local, capture_output=True, timeout=30, check=False)
    assert down.returncode != 0


def test_compose_sets_no_admin_key_and_binds_to_loopback() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "nvapi-" not in text
    services = compose()["services"]
    assert isinstance(services, dict) and {"nvcf", "postgres", "registry"} <= set(services)
    settings = {f"NVCF_{name.upper()}" for name in Settings.model_fields}
    for name, service in services.items():
        env = service.get("environment") or {}
        assert isinstance(env, dict), f"{name}: environment as a mapping"
        assert "NVCF_BOOTSTRAP_API_KEY" not in env, name
        # every NVCF_ variable is a real setting (a typo would be silently ignored)
        assert {k for k in env if k.startswith("NVCF_")} <= settings, name
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every address"
    assert services["nvcf"]["environment"]["NVCF_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert set(services["nvcf"]["depends_on"]) == {"postgres"}
