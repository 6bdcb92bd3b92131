"""Results of UPLOAD tasks pushed with oras to a real registry (service/tasks/results.py):
`oras pull` brings back the bytes written; a refused push is retried, then fails with the
registry's reason; `resultsLocation` is checked with every violation listed; secrets never
reach a log or a message."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.backends.protocol import InstanceSpec
from service.charts.fetch.common import RegistryCredential
from service.core.crypto import load_secret_box
from service.core.db import make_engine, make_sessionmaker
from service.core.settings import Settings
from service.tasks.results import (
    PushPolicy,
    ResultPushFailed,
    ResultsTarget,
    parse_results_location,
    push_credentials,
    push_result,
    result_name_problem,
    result_tag,
    upload_result,
)
from tests.support.app import SettingsFactory
from tests.support.nvcf_cli import add_request
from tests.support.registry import RegistryServer
from tests.support.tasks import manifest_digest, oras_pull

QUICK = PushPolicy(attempts=3, backoff=0.0, timeout=10.0)
FILES = {
    "model.safetensors": bytes(range(256)) * 4096,
    "config.json": b'{"layers": 12}\n',
    "tokenizer/vocab.txt": "héllo\nwörld\n".encode(),
}


def settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings(data_dir=tmp_path, **values)


def write_result(root: Path, name: str) -> Path:
    directory = root / name
    for relative, data in FILES.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return directory


def target_on(server: RegistryServer, repository: str = "acme/team-a/llama-ft") -> ResultsTarget:
    return ResultsTarget(host=server.host, repository=repository, insecure=True)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- resultsLocation


def test_results_location_maps_to_the_operators_registry(tmp_path: Path) -> None:
    conf = settings(
        tmp_path,
        task_results_registry="Registry.Example.com:5000/nvct-results/",
        insecure_registries="registry.example.com:5000",
    )
    target, errors = parse_results_location("acme/team-a/llama-ft", conf)
    assert errors == []
    assert target == ResultsTarget(
        host="registry.example.com:5000",
        repository="nvct-results/acme/team-a/llama-ft",
        insecure=True,
    )
    assert target.reference("ckpt-1") == (
        "registry.example.com:5000/nvct-results/acme/team-a/llama-ft:ckpt-1"
    )
    bare = settings(tmp_path, task_results_registry="results.example.com")
    target, errors = parse_results_location("acme/model", bare)
    assert errors == []
    assert target == ResultsTarget(host="results.example.com", repository="acme/model")


def test_a_bad_results_location_lists_every_violation(tmp_path: Path) -> None:
    conf = settings(tmp_path, task_results_registry="registry.example.com")
    _, errors = parse_results_location("Acme//" + "m" * 65, conf)
    assert [e.message for e in errors] == [
        "the org name 'Acme' must be lower-case letters and digits, separated by single '.' "
        "or '_', '__' or dashes (it names an OCI repository)",
        "the team name is empty",
        "the model name must be at most 64 characters",
    ]
    assert {e.field for e in errors} == {"resultsLocation"}
    _, errors = parse_results_location("just-a-model", conf)
    assert [e.message for e in errors] == [
        "must be '<org>/<model>' or '<org>/<team>/<model>', got 1 '/'-separated part in "
        "'just-a-model'"
    ]
    _, errors = parse_results_location("a/b/c/d", conf)
    assert "got 4 '/'-separated parts" in errors[0].message
    _, errors = parse_results_location(42, conf)
    assert [e.message for e in errors] == ["must be a string '<org>/[<team>/]<model>'"]
    _, errors = parse_results_location("x" * 600, conf)
    assert [e.message for e in errors] == ["must be at most 512 characters"]


def test_upload_without_a_results_registry_or_location_is_refused(tmp_path: Path) -> None:
    _, errors = parse_results_location("", settings(tmp_path))
    assert [e.message for e in errors] == [
        "this server pushes no results: its operator has not set NVCF_TASK_RESULTS_REGISTRY; "
        "use resultHandlingStrategy NONE",
        "is required with resultHandlingStrategy UPLOAD",
    ]


def test_the_results_registry_setting_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="without a scheme"):
        settings(tmp_path, task_results_registry="https://registry.example.com")
    assert settings(tmp_path, task_results_registry="  ").task_results_registry is None
    assert settings(tmp_path, task_results_registry="[::1]:5000/r").task_results_registry == (
        "[::1]:5000/r"
    )


def test_result_names_and_tags() -> None:
    assert result_name_problem("checkpoint-10.step_2") is None
    assert result_name_problem("ckpt(1)*!'") is None
    assert result_name_problem("../etc") is not None
    assert result_name_problem("a/b") is not None
    assert result_name_problem("x" * 191) is not None
    assert result_tag("checkpoint-10.step_2") == "checkpoint-10.step_2"
    # names NVCT allows that no tag may be: valid tags, distinct for distinct names
    odd = ["ckpt(1)", "ckpt_1_", ".hidden", "-dash", "x" * 190, "x" * 189 + "y"]
    tags = [result_tag(name) for name in odd]
    assert tags[1] == "ckpt_1_"
    assert len(set(tags)) == len(tags)
    assert all(len(tag) <= 128 and (tag[0].isalnum() or tag[0] == "_") for tag in tags)


# --------------------------------------------------------------------------- pushes


async def test_a_pushed_result_pulls_back_the_same_bytes(
    anon_registry: RegistryServer, tmp_path: Path
) -> None:
    directory = write_result(tmp_path / "work", "checkpoint-1")
    pushed = await push_result(
        directory, "checkpoint-1", target_on(anon_registry), [], policy=QUICK
    )

    assert pushed.reference == f"{anon_registry.host}/acme/team-a/llama-ft:checkpoint-1"
    assert pushed.digest == manifest_digest(anon_registry, pushed.reference)
    pulled = oras_pull(anon_registry, pushed.reference, tmp_path / "pulled")
    assert pulled == {f"checkpoint-1/{path}": data for path, data in FILES.items()}
    # the scratch archive is gone; the directory is the caller's
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["checkpoint-1"]


async def test_a_result_whose_name_is_no_tag_is_pushed_under_its_mapped_tag(
    anon_registry: RegistryServer, tmp_path: Path
) -> None:
    directory = write_result(tmp_path / "work", "ckpt(2)")
    pushed = await push_result(directory, "ckpt(2)", target_on(anon_registry), [], policy=QUICK)
    assert pushed.reference.endswith(":" + result_tag("ckpt(2)"))
    pulled = oras_pull(anon_registry, pushed.reference, tmp_path / "pulled")
    assert pulled == {f"ckpt(2)/{path}": data for path, data in FILES.items()}


async def test_each_credential_is_tried_in_turn(
    login_registry: RegistryServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert login_registry.username is not None and login_registry.password is not None
    wrong = RegistryCredential(login_registry.username, "not-the-password-either")
    right = RegistryCredential(login_registry.username, login_registry.password)
    directory = write_result(tmp_path / "work", "final")
    caplog.set_level(logging.DEBUG)
    pushed = await push_result(
        directory, "final", target_on(login_registry), [wrong, right], policy=QUICK
    )
    assert oras_pull(login_registry, pushed.reference, tmp_path / "pulled") == {
        f"final/{path}": data for path, data in FILES.items()
    }
    assert login_registry.password not in caplog.text
    assert "not-the-password-either" not in caplog.text


async def test_a_refused_push_is_retried_then_fails_with_the_registrys_reason(
    login_registry: RegistryServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert login_registry.username is not None
    secret = "Wr0ng-pa55word-that-must-not-leak"
    directory = write_result(tmp_path / "work", "ckpt-3")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ResultPushFailed) as failed:
        await push_result(
            directory,
            "ckpt-3",
            target_on(login_registry),
            [RegistryCredential(login_registry.username, secret)],
            policy=QUICK,
        )
    reference = f"{login_registry.host}/acme/team-a/llama-ft:ckpt-3"
    assert failed.value.reference == reference
    assert failed.value.attempts == 3
    assert failed.value.reason.startswith(f"registry {login_registry.host} answered 401")
    assert str(failed.value) == f"pushing result {reference} failed (3 times): " + (
        failed.value.reason
    )
    warnings = [r for r in caplog.records if r.name == "nvcf.tasks.results"]
    assert [r.getMessage() for r in warnings] == [
        f"pushing task result {reference} failed (attempt {n} of 3): {failed.value.reason}"
        for n in (1, 2, 3)
    ]
    assert secret not in caplog.text
    assert secret not in str(failed.value)
    assert not (tmp_path / "work" / "ckpt-3.layer.tar.gz").exists()


async def test_a_push_to_no_registry_is_retried_then_fails_with_the_reason(
    tmp_path: Path,
) -> None:
    host = f"127.0.0.1:{closed_port()}"
    directory = write_result(tmp_path / "work", "ckpt-4")
    target = ResultsTarget(host=host, repository="acme/m", insecure=True)
    with pytest.raises(ResultPushFailed) as failed:
        await push_result(directory, "ckpt-4", target, [], policy=PushPolicy(attempts=2, backoff=0))
    assert failed.value.attempts == 2
    assert failed.value.reason.startswith(f"could not reach registry {host}: ")
    assert "refused" in failed.value.reason.lower()


class FakeTaskFiles:
    """A TaskFiles adapter whose task wrote FILES under result `name`."""

    name = "fake"

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, int]] = []

    async def task_progress(self, instance: InstanceSpec, *, max_bytes: int) -> bytes | None:
        return None

    async def task_result_names(self, instance: InstanceSpec, *, max_names: int) -> list[str]:
        return []

    async def fetch_task_result(
        self, instance: InstanceSpec, name: str, into: str, *, max_bytes: int, max_files: int
    ) -> None:
        self.asked.append((name, max_bytes, max_files))
        write_result(Path(into).parent, Path(into).name)


async def test_upload_result_copies_the_files_out_of_the_task_then_pushes_them(
    anon_registry: RegistryServer, tmp_path: Path
) -> None:
    files = FakeTaskFiles()
    instance = InstanceSpec(
        instance_id="task-1",
        function_id="",
        version_id="",
        instance_type="NCP.GPU.H100_1x",
        gpu="H100",
        gpus_per_node=1,
        nca_id="nvcf-default",
        task=True,
    )
    policy = PushPolicy(attempts=1, backoff=0, max_bytes=1 << 30, max_files=50)
    pushed = await upload_result(
        files,
        instance,
        "epoch-2",
        target_on(anon_registry, "acme/upload"),
        [],
        workdir=tmp_path / "scratch",
        policy=policy,
    )
    assert files.asked == [("epoch-2", 1 << 30, 50)]
    assert oras_pull(anon_registry, pushed.reference, tmp_path / "pulled") == {
        f"epoch-2/{path}": data for path, data in FILES.items()
    }
    assert list((tmp_path / "scratch").iterdir()) == []
    with pytest.raises(ResultPushFailed, match="190 letters"):
        await upload_result(
            files,
            instance,
            "../escape",
            target_on(anon_registry, "acme/upload"),
            [],
            workdir=tmp_path / "scratch",
            policy=policy,
        )
    assert [name for name, _, _ in files.asked] == ["epoch-2"]


# --------------------------------------------------------------------------- credentials


async def test_push_credentials_are_the_tasks_ngc_api_key_then_the_accounts_model_logins(
    client: httpx.AsyncClient, database_url: str, make_settings: SettingsFactory
) -> None:
    host = "results.example.com:5000"
    for name, user, types in (
        ("model-a", "robot-a", ["MODEL"]),
        ("helm-only", "robot-h", ["HELM"]),
        ("model-b", "robot-b", ["MODEL", "CONTAINER"]),
    ):
        request = add_request(host, user, f"pw-{user}", types, name=name)
        response = await client.post("/v2/nvcf/registry-credentials", json=request)
        assert response.status_code == 200, response.text
    target = ResultsTarget(host=host, repository="acme/m")
    box = load_secret_box(make_settings())
    engine = make_engine(database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            logins = await push_credentials(
                session,
                "nvcf-default",
                target,
                task_secrets={"OTHER": "x", "ngc_api_key": "nvapi-task-key"},
                box=box,
            )
            assert logins == [
                RegistryCredential("$oauthtoken", "nvapi-task-key"),
                RegistryCredential("robot-a", "pw-robot-a"),
                RegistryCredential("robot-b", "pw-robot-b"),
            ]
            assert "nvapi-task-key" not in repr(logins)
            others = await push_credentials(session, "team-b", target, task_secrets={}, box=box)
            assert others == []
    finally:
        await engine.dispose()


async def test_a_push_with_bearer_token_auth(
    token_login_registry: RegistryServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = token_login_registry
    assert server.username is not None and server.password is not None
    assert server.token_server is not None
    reader = next(n for n in server.token_server.users if n != server.username)
    reader_password = server.token_server.users[reader].password
    directory = write_result(tmp_path / "work", "bearer-1")
    caplog.set_level(logging.DEBUG)
    pushed = await push_result(
        directory,
        "bearer-1",
        target_on(server),
        [RegistryCredential(server.username, server.password)],
        policy=QUICK,
    )
    assert pushed.digest.startswith("sha256:")
    with pytest.raises(ResultPushFailed) as failed:
        await push_result(
            directory,
            "bearer-2",
            target_on(server),
            [RegistryCredential(reader, reader_password)],
            policy=PushPolicy(attempts=1, backoff=0),
        )
    assert failed.value.reason.startswith(f"registry {server.host} answered 401")
    assert server.password not in caplog.text
    assert reader_password not in caplog.text
