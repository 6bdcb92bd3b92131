"""The invocation plane of this replica: the engine (engine.py) and what surrounds it — polls
and queue questions (lookup.py), the load published for the autoscaler (load.py), and the
background work.

A replica renews a heartbeat; the pending requests of a replica that stopped renewing end
errored (swept by any replica, and at once when a restarted server takes back its persistent
id). Background work (heartbeat, sweeps, re-reading the instances of versions whose requests
wait) is one loop service (core/loops.py), woken when instances became Running; every database
write uses its own short session.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.assets.requests import RequestAssets
from service.assets.service import Assets
from service.auth.service import Principal
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.loops import LoopService
from service.core.settings import Settings
from service.deployments.reconcile.owner import OwnerId
from service.invocation.dispatch import Dispatcher, LocalDispatcher
from service.invocation.dispatch_redis import RedisDispatcher
from service.invocation.engine import Engine
from service.invocation.figures import FiguresPublisher
from service.invocation.load import LoadPublisher, LoadTracker
from service.invocation.lookup import RequestLookup
from service.invocation.metrics import InvocationMetrics
from service.invocation.ratelimit import FunctionRateLimiter
from service.invocation.routing import RouteTable
from service.invocation.sessions import LocalSessions, RedisSessions, Sessions
from service.invocation.store import RequestStore

log = logging.getLogger("nvcf.invocation")


class InvocationPlane:
    def __init__(
        self,
        settings: Settings,
        sessionmaker: async_sessionmaker[AsyncSession],
        adapters: AdapterRegistry,
        catalog: Catalog,
        metrics: InvocationMetrics,
        owner: OwnerId,
        *,
        dispatcher: Dispatcher | None = None,
        assets: Assets | None = None,
    ) -> None:
        self.settings = settings
        self.sessionmaker = sessionmaker
        self.adapters = adapters
        self.owner = owner
        self.routes = RouteTable(sessionmaker, catalog, settings.invoke_route_cache_seconds)
        self.limiter = FunctionRateLimiter(settings.redis_url)
        self.metrics = metrics
        #: this replica's load per version, published for the autoscaler (load.py)
        self.load = LoadTracker(on_version=metrics.watch_load)
        self.load_publisher = LoadPublisher(
            sessionmaker,
            owner.value,
            self.load,
            period=settings.autoscale_load_report_seconds,
            forget_after=timedelta(seconds=settings.invoke_result_ttl_seconds),
        )
        #: what this replica measured of the versions under a canary release (figures.py)
        self.figures = FiguresPublisher(
            sessionmaker, owner.value, metrics.measured, period=settings.canary_interval
        )
        self.dispatcher: Dispatcher
        if dispatcher is not None:
            self.dispatcher = dispatcher
        elif settings.redis_url:
            self.dispatcher = RedisDispatcher(
                settings.redis_url,
                queue_max=settings.invoke_queue_max,
                lease_seconds=settings.invoke_replica_lease_seconds,
                on_change=self.load,
            )
        else:
            self.dispatcher = LocalDispatcher(settings.invoke_queue_max, on_change=self.load)
        self.store = RequestStore(
            sessionmaker,
            owner.value,
            lease_seconds=settings.invoke_replica_lease_seconds,
            ttl_seconds=settings.invoke_result_ttl_seconds,
        )
        self.sessions: Sessions
        if settings.redis_url and isinstance(self.dispatcher, RedisDispatcher):
            self.sessions = RedisSessions(
                settings.redis_url,
                lease_seconds=settings.invoke_replica_lease_seconds,
                idle_seconds=settings.grpc_session_idle_seconds,
            )
        else:
            self.sessions = LocalSessions(settings.grpc_session_idle_seconds)
        self.engine = Engine(
            settings,
            self.routes,
            self.limiter,
            self.dispatcher,
            self.store,
            adapters,
            metrics,
            owner.value,
            RequestAssets(settings, assets, adapters, sessionmaker),
            self.sessions,
        )
        #: polls and queue questions (lookup.py)
        self.lookup = RequestLookup(
            self.store,
            self.dispatcher,
            self.engine.active,
            lease_seconds=settings.invoke_replica_lease_seconds,
        )
        lease = settings.invoke_replica_lease_seconds
        #: heartbeat every third of the lease, sweep every lease; a round every `pause` (and
        #: when woken) re-reads the instances of versions with waiting requests
        self._beat = max(0.05, lease / 3)
        self._next_beat = self._next_sweep = 0.0
        pause = min(self._beat, max(0.05, settings.invoke_route_cache_seconds or 0.5))
        self._instances_changed = asyncio.Event()
        self._background = LoopService[str](
            "nvcf-invocation",
            self._round,
            pause,
            log=log,
            failure="invocation background work failed",
            wake=self._instances_changed,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.owner.persistent:
            ended = await self.store.end_owned(
                f"the replica {self.owner.value} running the request restarted"
            )
            if ended:
                log.warning("ended %d requests of this replica's previous run", ended)
        await self.store.heartbeat()
        await self._sweep()
        now = asyncio.get_running_loop().time()
        self._next_beat = now + self._beat
        self._next_sweep = now + self.settings.invoke_replica_lease_seconds
        if isinstance(self.dispatcher, RedisDispatcher):
            await self.dispatcher.start()
        await self.sessions.start()
        self._background.start()
        self.load_publisher.start()
        self.figures.start()

    def instances_changed(self) -> None:
        """Instances became Running somewhere (the reconciler of this process says so):
        re-read the versions with waiting requests now, not at the next period."""
        self._instances_changed.set()

    @property
    def accepting(self) -> bool:
        return not self.engine.stopping

    async def stop(self) -> None:
        """Stop: requests still running here end errored (their callers may poll that). The
        replica's heartbeat row is left to age out (a restart of the same id renews it)."""
        self.engine.stopping = True
        await self.load_publisher.stop()
        await self._background.stop()
        await self.engine.stop()
        await self.figures.stop()
        await self.dispatcher.aclose()
        await self.sessions.aclose()
        await self.limiter.aclose()

    async def _round(self) -> None:
        """The heartbeat and the sweep when due (`start` did the first of each), then the
        instances of versions with waiting requests re-read."""
        now = asyncio.get_running_loop().time()
        if now >= self._next_beat:
            await self.store.heartbeat()
            self._next_beat = now + self._beat
        if now >= self._next_sweep:
            await self._sweep()
            self._next_sweep = now + self.settings.invoke_replica_lease_seconds
        await self._refresh_waiting()

    async def _sweep(self) -> None:
        ended = await self.store.end_dead()
        if ended:
            log.warning("ended %d requests of stopped replicas", ended)
        await self.store.purge_expired()

    async def _refresh_waiting(self) -> None:
        """Re-read the instances of versions with requests waiting (new instances may run)."""
        for target in self.dispatcher.waiting_versions():
            principal = Principal(target.owner_account, frozenset(), "internal", "")
            fresh = await self.routes.refresh(principal, target)
            if fresh is not None:
                await self.dispatcher.update(fresh)
