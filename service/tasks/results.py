"""Results of `resultHandlingStrategy: UPLOAD` tasks (docs/tasks.md): a completed checkpoint's
directory pushed as an OCI artifact with oras to the task's `resultsLocation` on the registry
the operator configures (`NVCF_TASK_RESULTS_REGISTRY`), tagged with the result's name.

- `parse_results_location`: `<org>/[<team>/]<model>` → the repository there, every violation
  listed (NVCT's shape; OCI's repository grammar, since it becomes one).
- `push_credentials`: the task's `NGC_API_KEY` secret (NVCT's rule: any case of the name, the
  user `$oauthtoken`), then the account's MODEL registry credentials for that registry.
- `upload_result`: the result's files copied out of the task by its adapter (`TaskFiles`), then
  `push_result`: one tar+gzip directory layer (what `oras push ref <dir>` makes, so `oras pull`
  brings the directory back), each credential tried in turn, the whole push retried a bounded
  number of times with a doubling pause, then `ResultPushFailed` with the registry's reason.

oras is blocking (requests): every push runs in a worker thread. Its own sleeping retry of
every request is bypassed (the retry is here, bounded), and only its public building blocks
are used, so no ambient credential of this machine (`~/.docker/config.json`, `ORAS_USER`)
is ever sent for a task.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import oras.auth
import oras.defaults
import oras.oci
import oras.provider
import oras.utils
import requests
import requests.adapters
from sqlalchemy.ext.asyncio import AsyncSession

from service.backends.protocol import InstanceSpec, TaskFiles
from service.backends.worker_utils_pod import RESULT_NAME, RESULT_NAME_RULE
from service.charts.fetch.common import (
    RegistryCredential,
    plain_http_hint,
    short_reason,
    speaks_plain_http,
    upstream_errors,
)
from service.core.crypto import SecretBox
from service.core.errors import FieldError
from service.core.settings import Settings
from service.registry.models import ArtifactType
from service.registry.service import NGC_USER, credentials_for_host

log = logging.getLogger("nvcf.tasks.results")

FIELD = "resultsLocation"
#: NVCT's limit on the model name (NGC's)
MODEL_NAME_MAX = 64
#: distribution's limit on a repository name (path included)
REPOSITORY_MAX = 255
#: a value longer than this is refused whole, before it is split
LOCATION_MAX = 512
#: the secret NVCT reads (its name in any case) to push results
NGC_API_KEY = "NGC_API_KEY"
#: an OCI tag (distribution spec)
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
#: an OCI repository path component
_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_ROLES = {2: ("org", "model"), 3: ("org", "team", "model")}
#: blob upload chunks: a result is never held in memory whole
_CHUNK = 16 * 1024 * 1024
_OK = (200, 201, 202)

# oras' do_request sleeps and retries up to five times on any error; the retry here is bounded
# and paced by the settings, so each request is sent once (oras' own auth handling stays).
_DO_REQUEST: Callable[..., requests.Response] = getattr(
    oras.provider.Registry.do_request, "__wrapped__", oras.provider.Registry.do_request
)


@dataclass(frozen=True)
class ResultsTarget:
    """Where a task's results go: `host/repository:<tag>`, over plain HTTP when `insecure`."""

    host: str
    repository: str
    insecure: bool = False

    def reference(self, tag: str) -> str:
        return f"{self.host}/{self.repository}:{tag}"


@dataclass(frozen=True)
class PushedResult:
    """One pushed result: `reference` (`host/repository:tag`) and its manifest `digest`."""

    reference: str
    digest: str


@dataclass(frozen=True)
class PushPolicy:
    """How hard a push tries (the `NVCF_TASK_RESULT*` settings)."""

    attempts: int = 3
    backoff: float = 2.0
    timeout: float = 60.0
    max_bytes: int = 10 * 1024 * 1024 * 1024
    max_files: int = 10_000

    @classmethod
    def of(cls, settings: Settings) -> PushPolicy:
        return cls(
            attempts=settings.task_results_push_attempts,
            backoff=settings.task_results_push_backoff,
            timeout=settings.task_results_push_timeout,
            max_bytes=settings.task_result_max_bytes,
            max_files=settings.task_result_max_files,
        )


class ResultPushFailed(Exception):
    """A result could not be pushed after every attempt; `reason` is the registry's (or the
    transport's) last word, safe to show the task's owner."""

    def __init__(self, reference: str, attempts: int, reason: str) -> None:
        self.reference = reference
        self.attempts = attempts
        self.reason = reason
        times = "once" if attempts == 1 else f"{attempts} times"
        super().__init__(f"pushing result {reference} failed ({times}): {reason}")


# --------------------------------------------------------------------------- validation


def results_registry(settings: Settings) -> tuple[str, str] | None:
    """The configured (host[:port], path prefix), or None when UPLOAD is off."""
    value = settings.task_results_registry
    if value is None:
        return None
    host, _, prefix = value.partition("/")
    return host, prefix


def parse_results_location(
    value: object, settings: Settings, *, field: str = FIELD
) -> tuple[ResultsTarget | None, list[FieldError]]:
    """`<org>/[<team>/]<model>` → the target on the operator's registry, or every violation."""
    configured = results_registry(settings)
    errors: list[FieldError] = []
    if configured is None:
        errors.append(
            FieldError(
                field,
                "this server pushes no results: its operator has not set "
                "NVCF_TASK_RESULTS_REGISTRY; use resultHandlingStrategy NONE",
            )
        )
    if value is None or (isinstance(value, str) and not value.strip()):
        errors.append(FieldError(field, "is required with resultHandlingStrategy UPLOAD"))
        return None, errors
    if not isinstance(value, str):
        errors.append(FieldError(field, "must be a string '<org>/[<team>/]<model>'"))
        return None, errors
    if len(value) > LOCATION_MAX:
        errors.append(FieldError(field, f"must be at most {LOCATION_MAX} characters"))
        return None, errors
    parts = value.split("/")
    roles = _ROLES.get(len(parts))
    if roles is None:
        errors.append(
            FieldError(
                field,
                f"must be '<org>/<model>' or '<org>/<team>/<model>', got {len(parts)} "
                f"'/'-separated part{'s' if len(parts) != 1 else ''} in '{value}'",
            )
        )
        return None, errors
    for role, part in zip(roles, parts, strict=True):
        if not part:
            errors.append(FieldError(field, f"the {role} name is empty"))
        elif not _COMPONENT_RE.match(part):
            errors.append(
                FieldError(
                    field,
                    f"the {role} name '{part}' must be lower-case letters and digits, "
                    "separated by single '.' or '_', '__' or dashes (it names an OCI "
                    "repository)",
                )
            )
    if len(parts[-1]) > MODEL_NAME_MAX:
        errors.append(
            FieldError(field, f"the model name must be at most {MODEL_NAME_MAX} characters")
        )
    if configured is None:
        return None, errors
    host, prefix = configured
    repository = f"{prefix}/{value}" if prefix else value
    if len(repository) > REPOSITORY_MAX:
        errors.append(
            FieldError(
                field,
                f"the repository '{repository}' it makes on the results registry must be at "
                f"most {REPOSITORY_MAX} characters",
            )
        )
    if errors:
        return None, errors
    insecure = host in settings.insecure_registries
    return ResultsTarget(host=host, repository=repository, insecure=insecure), []


def result_name_problem(name: str) -> str | None:
    """Why `name` cannot name an uploaded result (NVCT's rule), or None."""
    if RESULT_NAME.fullmatch(name):
        return None
    return f"a result's name must be {RESULT_NAME_RULE}"


def result_tag(name: str) -> str:
    """The tag of result `name`: the name itself when it is a valid OCI tag; otherwise (a name
    NVCT allows with `!*'()`, a leading '.' or '-', more than 128 characters) its other
    characters as '_', cut to fit, and 8 hex digits of its hash so that two names never share
    a tag."""
    if TAG_RE.match(name):
        return name
    body = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    if not re.match(r"[A-Za-z0-9_]", body):
        body = "_" + body
    return f"{body[:119]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


# --------------------------------------------------------------------------- credentials


async def push_credentials(
    session: AsyncSession,
    account_id: str,
    target: ResultsTarget,
    *,
    task_secrets: Mapping[str, str],
    box: SecretBox,
) -> list[RegistryCredential]:
    """The logins to push with, in order: the task's `NGC_API_KEY` secret as `$oauthtoken`,
    then the account's MODEL registry credentials for the results registry."""
    out = [
        RegistryCredential(NGC_USER, value)
        for name, value in task_secrets.items()
        if name.upper() == NGC_API_KEY and value
    ][:1]
    stored = await credentials_for_host(
        session, account_id, target.host, box=box, artifact_type=ArtifactType.MODEL
    )
    out.extend(RegistryCredential(username, password) for username, password in stored)
    return out


# --------------------------------------------------------------------------- pushing


async def upload_result(
    files: TaskFiles,
    instance: InstanceSpec,
    name: str,
    target: ResultsTarget,
    credentials: Sequence[RegistryCredential],
    *,
    workdir: Path,
    policy: PushPolicy,
) -> PushedResult:
    """Copy result `name` out of the task (bounded by the policy) into a scratch directory
    under `workdir`, push it, and remove the copy. Raises the adapter's AdapterError when the
    files cannot be read, ResultPushFailed when the push fails."""
    problem = result_name_problem(name)
    if problem is not None:
        raise ResultPushFailed(target.reference(result_tag(name)), 0, problem)
    scratch = Path(await asyncio.to_thread(_scratch, workdir))
    try:
        directory = scratch / name
        await asyncio.to_thread(directory.mkdir)
        await files.fetch_task_result(
            instance, name, str(directory), max_bytes=policy.max_bytes, max_files=policy.max_files
        )
        return await push_result(directory, name, target, credentials, policy=policy)
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, True)


def _scratch(workdir: Path) -> str:
    workdir.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix="result-", dir=workdir)


async def push_result(
    directory: Path,
    name: str,
    target: ResultsTarget,
    credentials: Sequence[RegistryCredential],
    *,
    policy: PushPolicy,
) -> PushedResult:
    """Push `directory` (its base name is the layer's title) as result `name`: each credential
    in turn (anonymous when there is none), up to `policy.attempts` times, pausing
    `policy.backoff` seconds (doubling) in between. Raises ResultPushFailed with the last
    reason."""
    reference = target.reference(result_tag(name))
    logins: Sequence[RegistryCredential | None] = credentials or [None]
    archive = await asyncio.to_thread(_archive, directory)
    try:
        reason = ""
        for attempt in range(1, policy.attempts + 1):
            if attempt > 1:
                await asyncio.sleep(policy.backoff * 2 ** (attempt - 2))
            for credential in logins:
                try:
                    digest = await asyncio.to_thread(
                        _push_once,
                        target,
                        result_tag(name),
                        directory.name,
                        archive,
                        credential,
                        policy.timeout,
                    )
                except _Refused as exc:
                    reason = exc.reason
                    continue
                log.info("task result pushed: %s@%s", reference, digest)
                return PushedResult(reference=reference, digest=digest)
            log.warning(
                "pushing task result %s failed (attempt %d of %d): %s",
                reference,
                attempt,
                policy.attempts,
                reason,
            )
        raise ResultPushFailed(reference, policy.attempts, reason)
    finally:
        await asyncio.to_thread(archive.unlink, True)


def _archive(directory: Path) -> Path:
    """The directory as one reproducible tar+gzip (oras' own directory packing), beside it."""
    target = directory.parent / f"{directory.name}.layer.tar.gz"
    target.unlink(missing_ok=True)  # oras writes over a file without truncating it
    oras.utils.make_targz(str(directory), str(target))
    return target


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _TimeoutAdapter(requests.adapters.HTTPAdapter):
    """Every request of the push (token realm included) with the push timeout."""

    def __init__(self, timeout: float) -> None:
        super().__init__(max_retries=0)
        self.timeout = timeout

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, **kwargs: Any
    ) -> requests.Response:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.timeout
        return super().send(request, **kwargs)


class _Registry(oras.provider.Registry):  # type: ignore[misc]
    """oras' client sending each request once (the push is retried as a whole), asking a new
    bearer token when the one in hand does not cover a request (oras keeps the first token it
    got, granted `pull` for the first HEAD, and sends it again to the upload's `push`
    challenge)."""

    def do_request(
        self,
        url: str,
        method: str = "GET",
        data: dict[str, Any] | bytes | None = None,
        headers: dict[str, str] | None = None,
        json: dict[str, Any] | None = None,
        stream: bool = False,
    ) -> requests.Response:
        sent = dict(headers or {})  # oras adds its auth header to the dict it is given
        response = _DO_REQUEST(
            self, url, method, data=data, headers=dict(sent), json=json, stream=stream
        )
        if (
            response.status_code == 401
            and isinstance(self.auth, oras.auth.TokenAuth)
            and self.auth.token is not None
        ):
            response.close()
            self.auth.token = None
            response = _DO_REQUEST(
                self, url, method, data=data, headers=dict(sent), json=json, stream=stream
            )
        return response


class _LastFailure:
    """The last refusal any request of a push was answered (registry or token server)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.reason = ""

    def hook(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        if response.status_code < 400:
            return
        where = urlsplit(response.url).netloc
        who = f"registry {self.host}" if where == self.host else f"token server {where}"
        status = f"{response.status_code} {response.reason or ''}".rstrip()
        self.reason = f"{who} answered {status}{upstream_errors(response)}"


def _equip(session: requests.Session, timeout: float, failure: _LastFailure) -> None:
    adapter = _TimeoutAdapter(timeout)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    session.hooks["response"].append(failure.hook)


def _scheme(target: ResultsTarget) -> str:
    return "http" if target.insecure else "https"


def _auth_kind(target: ResultsTarget, http: requests.Session) -> str:
    """Ping /v2/ as Docker does: 'basic' when the registry asks for basic auth, else 'token'
    (bearer, or no auth at all)."""
    with http.get(f"{_scheme(target)}://{target.host}/v2/", stream=True) as response:
        header = response.headers.get("www-authenticate", "")
        if response.status_code == 401 and header.lower().startswith("basic"):
            return "basic"
        return "token"


def _push_once(
    target: ResultsTarget,
    tag: str,
    directory_name: str,
    archive: Path,
    credential: RegistryCredential | None,
    timeout: float,
) -> str:
    """One push with one credential (None: anonymous); returns the manifest digest or raises
    _Refused with the reason."""
    failure = _LastFailure(target.host)
    probe = requests.Session()
    _equip(probe, timeout, failure)
    registry: _Registry | None = None
    try:
        kind = _auth_kind(target, probe)
        registry = _Registry(hostname=target.host, insecure=target.insecure, auth_backend=kind)
        _equip(registry.session, timeout, failure)
        if credential is not None:
            registry.auth.set_basic_auth(credential.username, credential.password)
        return _upload(registry, target, tag, directory_name, archive)
    except requests.RequestException as exc:
        reason = plain_http_hint(target.host) if speaks_plain_http(exc) else short_reason(exc)
        raise _Refused(f"could not reach registry {target.host}: {reason}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        # oras raises these when a request is refused or an auth challenge is not answered
        raise _Refused(failure.reason or f"registry {target.host}: {exc}") from None
    finally:
        probe.close()
        if registry is not None:
            registry.session.close()


def _upload(registry: _Registry, target: ResultsTarget, tag: str, title: str, archive: Path) -> str:
    container = registry.get_container(f"{target.host}/{target.repository}:{tag}")
    layer = oras.oci.NewLayer(str(archive), is_dir=True)
    layer["annotations"] = {
        oras.defaults.annotation_title: title,
        oras.defaults.annotation_unpack: "true",
    }
    _check(registry.upload_blob(str(archive), container, layer, do_chunked=True, chunk_size=_CHUNK))
    config, _ = oras.oci.ManifestConfig()
    config_file = archive.parent / f"{archive.name}.config.json"
    config_file.write_bytes(b"{}")
    try:
        _check(registry.upload_blob(str(config_file), container, config))
    finally:
        config_file.unlink(missing_ok=True)
    manifest = oras.oci.NewManifest()
    manifest["layers"] = [layer]
    manifest["config"] = config
    body = json.dumps(manifest, separators=(",", ":")).encode()
    response = registry.do_request(
        f"{_scheme(target)}://{container.manifest_url()}",
        "PUT",
        headers={"Content-Type": oras.defaults.default_manifest_media_type},
        data=body,
    )
    _check(response)
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _check(response: requests.Response) -> None:
    if response.status_code not in _OK:
        raise ValueError(f"answered {response.status_code}")
