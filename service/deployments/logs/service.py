"""Reading instance logs for the API: which instances, from which backend, bounded, masked.

A Running (or starting) instance is read live from its cluster's adapter; a failed or
torn-down one answers with the last lines kept when it failed (keep.py). Every line passes the
version's secret values through the masker. An answer carries at most `logs_max_bytes`; a
follow lasts at most `logs_follow_max_seconds` and an account holds at most
`logs_max_follows_per_account` follows at once in this process (429 beyond).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.backends.logs import LogLine, LogRequest, cut, merge
from service.backends.protocol import AdapterError, BackendAdapter, InstanceSpec
from service.clusters.adapters import AdapterRegistry
from service.core.crypto import SecretBox
from service.core.errors import (
    BadGateway,
    BadRequest,
    FieldError,
    NotFound,
    TooManyRequests,
    ValidationFailed,
)
from service.core.settings import Settings
from service.deployments import repository as deployments
from service.deployments.logs.keep import shown
from service.deployments.logs.mask import NO_SECRETS, Masker
from service.deployments.models import Deployment, Instance, InstanceDesired
from service.functions.secret_values import versions_secrets
from service.health.machine import Phase

#: how long the first line is awaited before the answer starts (so that a refusal of the
#: backend, e.g. an unknown container, is a problem+json rather than a broken stream)
PEEK_SECONDS = 2.0
#: phases whose containers may be read live
LIVE_PHASES = frozenset({Phase.STARTING.value, Phase.RUNNING.value, Phase.DEGRADED.value})


@dataclass(frozen=True)
class Source:
    """One instance to read: where, and the prefix of its lines (deployment-wide reads)."""

    adapter: BackendAdapter
    target: InstanceSpec
    prefix: str = ""


@dataclass
class Reading:
    """What one `GET .../logs` answers: live sources, or kept lines."""

    request: LogRequest
    masker: Masker
    sources: list[Source]
    kept: list[str] | None = None
    #: prefix each line with its pod and container (several may be read)
    label: bool = True


class FollowLimiter:
    """Open follows per account in this process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def acquire(self, account_id: str) -> _Held:
        if self._open.get(account_id, 0) >= self.limit:
            raise TooManyRequests(
                detail=f"this account already follows {self.limit} logs at once (the limit, "
                "NVCF_LOGS_MAX_FOLLOWS_PER_ACCOUNT); end one first",
                headers={"Retry-After": "5"},
            )
        self._open[account_id] = self._open.get(account_id, 0) + 1
        return _Held(self, account_id)

    def release(self, account_id: str) -> None:
        left = self._open.get(account_id, 0) - 1
        if left > 0:
            self._open[account_id] = left
        else:
            self._open.pop(account_id, None)

    def open(self, account_id: str) -> int:
        return self._open.get(account_id, 0)


class _Held:
    """One follow's place: released once, when its answer ends or is dropped."""

    def __init__(self, limiter: FollowLimiter, account_id: str) -> None:
        self._limiter: FollowLimiter | None = limiter
        self._account = account_id

    def release(self) -> None:
        limiter, self._limiter = self._limiter, None
        if limiter is not None:
            limiter.release(self._account)


def log_request(
    settings: Settings,
    container: str | None,
    tail_lines: int | None,
    since_seconds: int | None,
    timestamps: bool,
    follow: bool,
) -> LogRequest:
    """The query checked against the settings' bounds (every violation listed)."""
    errors: list[FieldError] = []
    if tail_lines is not None and tail_lines > settings.logs_max_tail_lines:
        errors.append(FieldError("tailLines", f"must be at most {settings.logs_max_tail_lines}"))
    if errors:
        raise ValidationFailed.of(errors, "log request")
    return LogRequest(
        container=container,
        tail_lines=settings.logs_max_tail_lines if tail_lines is None else tail_lines,
        since_seconds=since_seconds,
        timestamps=timestamps,
        follow=follow,
        limit_bytes=settings.logs_max_bytes,
    )


def _target(dep: Deployment, row: Instance) -> InstanceSpec:
    # Reading logs needs only the instance namespace and its cluster.
    return InstanceSpec(
        instance_id=str(row.id),
        function_id=str(dep.function_id),
        version_id=str(dep.version_id),
        instance_type="",
        gpu="",
        gpus_per_node=1,
        cluster=row.cluster or "",
        deployment_id=str(dep.id),
        nca_id=dep.account_id,
    )


async def masker_of(session: AsyncSession, box: SecretBox | None, version_id: uuid.UUID) -> Masker:
    if box is None:
        return NO_SECRETS
    found = await versions_secrets(session, [version_id], box)
    return Masker(found.get(version_id, (0, {}))[1].values())


def _live(row: Instance) -> bool:
    return (
        row.desired == InstanceDesired.PRESENT
        and row.applied
        and row.cluster is not None
        and row.phase in LIVE_PHASES
    )


async def instance_reading(
    session: AsyncSession,
    registry: AdapterRegistry,
    box: SecretBox | None,
    account_id: str,
    deployment_id: uuid.UUID,
    instance_id: uuid.UUID,
    request: LogRequest,
    now: datetime,
) -> Reading:
    """One instance's log: live, or the lines kept when it failed; 404 for another account's
    deployment or an instance it never had."""
    found = await deployments.find_deployment(session, account_id, deployment_id, now)
    row = await deployments.instance_of(session, deployment_id, instance_id)
    label = request.container is None
    if row is not None and isinstance(found, Deployment) and _live(row):
        adapter = registry.get(row.cluster or "")
        if adapter is None:
            reason = registry.unavailable_reason(row.cluster or "") or str(row.cluster)
            raise BadGateway(detail=f"cannot read the logs of instance {instance_id}: {reason}")
        masker = await masker_of(session, box, found.version_id)
        return Reading(request, masker, [Source(adapter, _target(found, row))], label=label)
    kept = await deployments.kept_log(session, instance_id)
    if kept is not None and (kept.deployment_id != deployment_id or kept.account_id != account_id):
        kept = None
    if row is None and kept is None:
        raise NotFound(detail=f"instance {instance_id} not found in deployment {deployment_id}")
    return kept_reading(request, kept.containers if kept is not None else [])


def kept_reading(request: LogRequest, containers: list[dict[str, Any]]) -> Reading:
    """The answer of kept lines (keep.py's `containers`), for the request's container and
    tail."""
    lines = [
        text
        for entry in containers
        if request.container is None or entry.get("container") == request.container
        for text in shown([entry])
    ]
    if request.tail_lines is not None:
        lines = lines[-request.tail_lines :] if request.tail_lines else []
    return Reading(request, NO_SECRETS, [], kept=lines)


async def deployment_reading(
    session: AsyncSession,
    registry: AdapterRegistry,
    box: SecretBox | None,
    account_id: str,
    deployment_id: uuid.UUID,
    request: LogRequest,
    now: datetime,
) -> Reading:
    """The logs of a deployment's Running instances, each line prefixed with its instance."""
    found = await deployments.find_deployment(session, account_id, deployment_id, now)
    if not isinstance(found, Deployment):
        return Reading(request, NO_SECRETS, [])
    rows = await deployments.running_instances(session, deployment_id)
    sources: list[Source] = []
    for row in rows:
        adapter = registry.get(row.cluster or "")
        if adapter is not None and _live(row):
            sources.append(Source(adapter, _target(found, row), prefix=f"[{row.id}] "))
    masker = await masker_of(session, box, found.version_id) if sources else NO_SECRETS
    return Reading(request, masker, sources, label=request.container is None)


def _format(reading: Reading, source: Source, line: LogLine) -> bytes:
    parts = [source.prefix]
    if reading.label:
        parts.append(f"[{line.pod}/{line.container}] ")
    if line.timestamp:
        parts.append(line.timestamp + " ")
    parts.append(cut(reading.masker(line.text)))  # masked whole, then cut
    parts.append("\n")
    return "".join(parts).encode()


async def _lines(reading: Reading) -> AsyncGenerator[bytes]:
    if not reading.sources:
        for text in reading.kept or []:
            yield (text + "\n").encode()
        return

    # tagged per source: each line is formatted with its instance's prefix
    async def tagged(source: Source) -> AsyncIterator[tuple[Source, LogLine]]:
        async for line in source.adapter.logs(source.target, reading.request):
            yield source, line

    async for source, line in merge([tagged(s) for s in reading.sources]):
        yield _format(reading, source, line)


def _refusal(exc: AdapterError, request: LogRequest) -> Exception:
    if exc.status == 400:
        if request.container is not None:
            return ValidationFailed.of([FieldError("container", exc.message)], "log request")
        return BadRequest(detail=exc.message)
    return BadGateway(detail=f"reading the logs failed: {exc.message}")


async def _stop(first: asyncio.Future[bytes], body: AsyncGenerator[bytes]) -> None:
    # the body cannot be closed while `first` is still inside it
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await body.aclose()


async def open_stream(
    reading: Reading, settings: Settings, held: _Held | None
) -> AsyncIterator[bytes]:
    """The answer's body, its first line already read (a refusal raises here, before the
    answer starts); releases `held` when it ends or is dropped."""
    body = _bounded(reading, settings, held)
    first = asyncio.ensure_future(anext(body, b""))
    try:
        await asyncio.wait({first}, timeout=PEEK_SECONDS)
        if first.done():
            first.result()  # a refusal raises here
    except AdapterError as exc:
        await body.aclose()
        raise _refusal(exc, reading.request) from None
    except BaseException:
        await _stop(first, body)
        raise

    async def answer() -> AsyncGenerator[bytes]:
        try:
            chunk = await first
            if chunk:
                yield chunk
            async for chunk in body:
                yield chunk
        except AdapterError as exc:
            yield f"error: {exc.message}\n".encode()
        finally:
            await _stop(first, body)

    stream = answer()
    if held is not None:
        weakref.finalize(stream, held.release)
    return stream


async def _bounded(
    reading: Reading, settings: Settings, held: _Held | None
) -> AsyncGenerator[bytes]:
    sent = 0
    lines = _lines(reading)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.logs_follow_max_seconds
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                yield b"-- log follow ended after NVCF_LOGS_FOLLOW_MAX_SECONDS; follow again --\n"
                return
            try:
                async with asyncio.timeout(left):
                    chunk = await anext(lines)
            except StopAsyncIteration:
                return
            except TimeoutError:
                continue
            sent += len(chunk)
            if sent > settings.logs_max_bytes:
                limit = settings.logs_max_bytes
                yield f"-- log cut at {limit} bytes (NVCF_LOGS_MAX_BYTES) --\n".encode()
                return
            yield chunk
    finally:
        with contextlib.suppress(Exception):
            await lines.aclose()
        if held is not None:
            held.release()


__all__: Sequence[str] = [
    "FollowLimiter",
    "Reading",
    "deployment_reading",
    "instance_reading",
    "log_request",
    "open_stream",
]
