"""Which version and which instances a request goes to (`Target`), read from the database.

A function id alone picks an invocable version: ACTIVE or DEGRADING, the most recently
deployed when several are. A version that is not invocable is a 400 naming its status
(`NotInvocable`: the gRPC entry answers it as NVCF's API does); an unknown version (or
another account's not shared with the caller's, see access.py) is a 404. An invocation token
is refused (403) a function its grant does not name before anything is read; its grant is
part of the cache key when it narrows the versions.

A target is per caller account: it carries the caller's account, which the worker receives as
`NVCF-NCAID` (as NVCF's workers do: the account that invoked, the owner's or one the function
is shared with).

Resolved targets are reused for `NVCF_INVOKE_ROUTE_CACHE_SECONDS` (two indexed queries per
miss: the versions with their live deployment, then its Running instances); only invocable
ones are kept, so a version that becomes invocable is seen at once. Concurrent misses of one
key share one read, and an expired target keeps serving while one request re-reads it, so
under load requests never queue behind the database. A target may be stale by about that long
after an undeploy or an instance failure: a request sent to an instance that is gone finds
nobody listening and is retried once on another. A revoked share is seen by every replica once
its cached targets expire; the replica that revoked it forgets them at once (`forget_function`).
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import itertools
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.service import Principal
from service.backends.protocol import InstanceSpec
from service.backends.worker import WorkerPort
from service.charts.pipeline import DEFAULT_INFERENCE_PORT
from service.clusters.catalog import Catalog
from service.core.errors import BadRequest, Forbidden, NotFound
from service.deployments import repository as deployments
from service.deployments import traffic
from service.deployments.workload import DEFAULT_PORT, SERVICE_NAME
from service.invocation.access import visible_versions
from service.invocation.ratelimit import RatePolicy

INVOCABLE = frozenset({"ACTIVE", "DEGRADING"})
#: the tag of a gRPC function whose calls are not pinned to their connection's instance
#: (docs/invocation.md, gRPC sessions)
PER_CALL_TAG = "grpc-sessions=per-call"
#: (account, function id, version id), the ids as canonical text: a UUID hashes in Python
_Key = tuple[str, str, str | None]
#: cached targets at most (least recently resolved go first)
MAX_CACHED = 10_000


@dataclass(frozen=True)
class InstanceRoute:
    """One Running instance a request may go to."""

    id: uuid.UUID
    cluster: str
    max_concurrency: int
    backend: str
    instance_type: str
    region: str

    @cached_property
    def key(self) -> str:
        """The id as text: what tables on the hot path are keyed by (a UUID hashes in
        Python at every lookup, a string once)."""
        return str(self.id)

    @cached_property
    def nvcf_headers(self) -> tuple[tuple[str, str], ...]:
        """The NVCF-* headers of a request to this instance that depend on it alone."""
        return (
            ("NVCF-INSTANCE-ID", self.key),
            ("NVCF-BACKEND", self.backend),
            ("NVCF-INSTANCETYPE", self.instance_type),
            ("NVCF-REGION", self.region),
        )


@dataclass(frozen=True)
class Target:
    """An invocable version: where its requests go and what limits them."""

    function_id: uuid.UUID
    version_id: uuid.UUID
    owner_account: str
    #: the account the target was resolved for (the owner's, or one the function is shared with)
    caller_account: str
    name: str
    status: str
    inference_path: str
    port: WorkerPort
    rate: RatePolicy | None
    instances: tuple[InstanceRoute, ...]
    worker_service: str | None
    #: the version's functionType and stored models (the LLM gateway checks the model)
    function_type: str = "DEFAULT"
    models: Any = None
    #: a gRPC client connection is a session pinned to one instance (NVCF's proxy), unless
    #: the version is tagged `PER_CALL_TAG`
    connection_sessions: bool = True
    #: the version's stored `llmInvocationConfig` (the LLM gateway's request priority)
    llm_invocation_config: Any = None
    #: the version's stored `telemetries` (None: nothing is exported for it)
    telemetries: Any = None

    @cached_property
    def fid(self) -> str:
        return str(self.function_id)

    @cached_property
    def vid(self) -> str:
        return str(self.version_id)

    @cached_property
    def nvcf_headers(self) -> tuple[tuple[str, str], ...]:
        """The NVCF-* headers of a request to this version that depend on it alone."""
        return (
            ("NVCF-NCAID", self.caller_account),
            ("NVCF-FUNCTION-NAME", self.name),
            ("NVCF-FUNCTION-ID", self.fid),
            ("NVCF-FUNCTION-VERSION-ID", self.vid),
        )

    def instance_spec(self, instance: InstanceRoute) -> InstanceSpec:
        return InstanceSpec(
            instance_id=instance.key,
            function_id=self.fid,
            version_id=self.vid,
            instance_type=instance.instance_type,
            gpu="",
            gpus_per_node=1,
            cluster=instance.cluster,
            nca_id=self.owner_account,
            worker_service=self.worker_service,
        )


#: the space a request's key is hashed into: a split's weights cut it in proportion
_SPACE = 1 << 64


def _point(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest())


@dataclass(frozen=True)
class Split:
    """A function's traffic split as one caller sees it: the targets of the versions it may
    invoke with a weight, newest first, and their weights' running sums."""

    targets: tuple[Target, ...]
    bounds: tuple[int, ...]

    @classmethod
    def of(cls, targets: Sequence[Target], weights: Sequence[int]) -> Split:
        return cls(tuple(targets), tuple(itertools.accumulate(weights)))

    def pick(self, key: str) -> Target:
        """The version a request falls on, by weight: the one place a split is applied. The
        key (a session's, else the request's id) is hashed, so the calls of a session land on
        the same version while the split stands, and request ids spread by the weights."""
        total = self.bounds[-1]
        return self.targets[bisect.bisect_right(self.bounds, _point(key) * total // _SPACE)]


#: what a (caller, function, version) resolves to: a version, or a split over versions
Routed = Target | Split


def _versions(routed: Routed) -> tuple[uuid.UUID, ...]:
    if isinstance(routed, Split):
        return tuple(t.version_id for t in routed.targets)
    return (routed.version_id,)


def _consume(future: asyncio.Future[Routed]) -> None:
    """A background re-read's error is the next request's to see, not the event loop's."""
    if not future.cancelled():
        future.exception()


def worker_port(row: Any) -> WorkerPort:
    """Where the version's worker listens: the helm chart's Service, or the `entrypoint`
    Service of a container function, on `inferencePort`; and its health check."""
    helm = row.container_image is None
    port = int(row.inference_port or (DEFAULT_INFERENCE_PORT if helm else DEFAULT_PORT))
    service = (row.helm_chart_service_name or SERVICE_NAME) if helm else SERVICE_NAME
    health = row.health if isinstance(row.health, dict) else {}
    uri = health.get("uri")
    health_port = health.get("port")
    return WorkerPort(
        service=service,
        port=port,
        inference_path=str(row.inference_url or "/"),
        health_path=str(uri) if isinstance(uri, str) and uri.startswith("/") else None,
        health_port=int(health_port) if isinstance(health_port, int) else None,
    )


def _scope(principal: Principal, function_id: str, version_id: str | None) -> str | None:
    """The account part of a cache key: the caller's account, narrowed by an invocation
    token's grant when it names versions; None when the token may not invoke this."""
    grant = principal.grant
    if grant is None:
        return principal.account_id
    if not grant.allows(function_id, version_id):
        return None
    versions = grant.versions(function_id)
    if not versions:
        return principal.account_id
    return f"{principal.account_id}\x00{','.join(sorted(versions))}"


def _refused(function_id: str, version_id: str | None) -> Forbidden:
    what = f"function {function_id}" + (f" version {version_id}" if version_id else "")
    return Forbidden(detail=f"this invocation token does not allow invoking {what}")


@dataclass
class NotInvocable(BadRequest):
    """No version asked for can be invoked (none ACTIVE or DEGRADING); `degraded`: one of
    them is DEGRADED (NVCF's API says so rather than "not found": grpc/statuses.py)."""

    degraded: bool = False


def choose_version(
    rows: Sequence[Row[Any]], function_id: uuid.UUID, version_id: uuid.UUID | None
) -> Row[Any]:
    """The version to invoke, or the error that says why there is none."""
    if not rows:
        what = f"function {function_id}" + (f" version {version_id}" if version_id else "")
        raise NotFound(detail=f"{what} not found")
    invocable = [r for r in rows if r.status in INVOCABLE and r.deployment_id is not None]
    if invocable:
        return max(invocable, key=lambda r: (r.created_at, str(r.id)))
    degraded = any(r.status == "DEGRADED" for r in rows)
    if version_id is not None:
        row = rows[0]
        raise NotInvocable(
            degraded=degraded,
            detail=f"function {function_id} version {version_id} is {row.status} and cannot be "
            "invoked; only ACTIVE and DEGRADING versions are"
            + (" (deploy it first)" if row.status == "INACTIVE" else ""),
        )
    states = ", ".join(f"{r.id} is {r.status}" for r in sorted(rows, key=lambda r: str(r.id)))
    raise NotInvocable(
        degraded=degraded,
        detail=f"function {function_id} has no invocable version ({states}); only ACTIVE "
        "and DEGRADING versions are",
    )


class RouteTable:
    """Resolves (caller, function, version) to a `Target`, with a short-lived cache."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        catalog: Catalog,
        ttl: float,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._catalog = catalog
        self._ttl = ttl
        #: an expired target still serves (while one request re-reads it) for this long
        self._stale = 10 * ttl
        self._cache: dict[_Key, tuple[float, Routed]] = {}
        self._loading: dict[_Key, asyncio.Future[Routed]] = {}
        #: counts `forget` calls: a read begun before one does not fill the cache
        self._generation = 0

    async def resolve(
        self,
        principal: Principal,
        function_id: uuid.UUID,
        version_id: uuid.UUID | None,
        key: str = "",
    ) -> Target:
        """The target of the ids; when they name no version and the function has a traffic
        split, the split's version `key` (the request's session, else its id) falls on."""
        routed = await self._routed(principal, function_id, version_id)
        return routed.pick(key) if isinstance(routed, Split) else routed

    async def _routed(
        self, principal: Principal, function_id: uuid.UUID, version_id: uuid.UUID | None
    ) -> Routed:
        fid, vid = str(function_id), None if version_id is None else str(version_id)
        if principal.functions is not None and function_id not in principal.functions:
            # a key limited to named functions (NVCF policy resources): as an unknown one
            raise NotFound(detail=f"function {fid} not found")
        scope = _scope(principal, fid, vid)
        if scope is None:
            raise _refused(fid, vid)
        key = (scope, fid, vid)
        hit = self._cache.get(key)
        if hit is not None:
            expires, target = hit
            now = time.monotonic()
            if expires > now:
                return target
            if expires + self._stale > now:
                if key not in self._loading:
                    self._start(key, principal).add_done_callback(_consume)
                return target
        loading = self._loading.get(key) or self._start(key, principal)
        return await asyncio.shield(loading)

    def _start(self, key: _Key, principal: Principal) -> asyncio.Future[Routed]:
        """One read of a key's target, shared by every request that needs it."""
        future = asyncio.ensure_future(self._read(key, principal))
        self._loading[key] = future
        return future

    async def _read(self, key: _Key, principal: Principal) -> Routed:
        generation = self._generation
        try:
            async with self._sessionmaker() as session:
                version_id = None if key[2] is None else uuid.UUID(key[2])
                target = await self._load(session, principal, uuid.UUID(key[1]), version_id)
        except BaseException:
            self._cache.pop(key, None)
            raise
        finally:
            self._loading.pop(key, None)
        if self._ttl > 0 and generation == self._generation:
            if len(self._cache) >= MAX_CACHED and key not in self._cache:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = (time.monotonic() + self._ttl, target)
        return target

    async def refresh(self, principal: Principal, target: Target) -> Target | None:
        """The version's current target, read now; None when it is no longer invocable."""
        self.forget(target.version_id)
        try:
            return await self.resolve(principal, target.function_id, target.version_id)
        except (NotFound, BadRequest, Forbidden):
            return None

    def forget(self, version_id: uuid.UUID) -> None:
        """Drop the cached targets of a version (it stopped being invocable)."""
        self._generation += 1
        for key in [k for k, (_, t) in self._cache.items() if version_id in _versions(t)]:
            self._cache.pop(key, None)

    def forget_function(self, function_id: uuid.UUID) -> None:
        """Drop the cached targets of every version of a function, for every caller (who may
        invoke it changed: a share was revoked)."""
        self._generation += 1
        for key in [k for k, (_, t) in self._cache.items() if k[1] == str(function_id)]:
            self._cache.pop(key, None)

    async def _load(
        self,
        session: AsyncSession,
        principal: Principal,
        function_id: uuid.UUID,
        version_id: uuid.UUID | None,
    ) -> Routed:
        rows = await visible_versions(session, principal, function_id, version_id)
        if version_id is None:
            weights = await traffic.weights(session, function_id)
            split = [
                r
                for r in rows
                if weights.get(r.id, 0) > 0 and r.status in INVOCABLE and r.deployment_id
            ]
            if split:
                # the newest first: a canary's share is the start of the key space, so that
                # a session on it stays there while its weight grows
                split.sort(key=lambda r: (r.created_at, str(r.id)), reverse=True)
                targets = [await self._target(session, principal, r) for r in split]
                return Split.of(targets, [weights[r.id] for r in split])
        return await self._target(session, principal, choose_version(rows, function_id, version_id))

    async def _target(self, session: AsyncSession, principal: Principal, row: Row[Any]) -> Target:
        found = await deployments.running_routes(session, row.deployment_id)
        instances = []
        for inst in found:
            cluster = self._catalog.cluster(inst.cluster or "")
            instances.append(
                InstanceRoute(
                    id=inst.id,
                    cluster=inst.cluster or "",
                    max_concurrency=max(1, int(inst.max_request_concurrency or 1)),
                    backend=inst.backend,
                    instance_type=inst.instance_type,
                    region=cluster.region if cluster is not None else "",
                )
            )
        port = worker_port(row)
        return Target(
            function_id=row.function_id,
            version_id=row.id,
            owner_account=row.account_id,
            caller_account=principal.account_id,
            name=row.name,
            status=row.status,
            inference_path=port.inference_path,
            port=port,
            rate=RatePolicy.from_stored(row.rate_limit),
            instances=tuple(instances),
            worker_service=row.helm_chart_service_name if row.container_image is None else None,
            function_type=row.function_type,
            models=row.models,
            connection_sessions=PER_CALL_TAG not in (row.tags or ()),
            llm_invocation_config=row.llm_invocation_config,
            telemetries=row.telemetries,
        )
