"""Sessions of the gRPC entry (`Engine.open`): a call carrying the `nvcf-reqid` of a live
session goes to that session's instance, whichever replica it reaches.

A session is its first call's request id. It is live while one of its calls is open and for
`NVCF_GRPC_SESSION_IDLE_SECONDS` after its last call ended (a client reconnecting after a
dropped connection resumes it, as NVCF's proxy allows); a session that is not live, or whose
instance is no longer Running, is NotFound.

`LocalSessions` keeps them in this process (one replica); `RedisSessions` shares them between
replicas (`NVCF_REDIS_URL`): one hash per session, `nvcf:inv:s:<session>`, holding its
instance (`i`) and each open call (`c:<call>`, its lease expiry in ms), the key expiring
`lease + idle` after the last renewal. A replica renews the calls it holds every third of
the lease; when the last unexpired call leaves, the key expires after the idle time — so a
dead replica's calls keep a session no longer than their lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from typing import Any, Protocol

from redis.asyncio import ConnectionPool, Redis
from redis.exceptions import RedisError

from service.core.errors import NotFound, ServiceUnavailable
from service.core.loops import LoopService
from service.invocation.redis_batch import Script, ScriptBatch
from service.invocation.routing import Target

log = logging.getLogger("nvcf.invocation")

PREFIX = "nvcf:inv:s:"
#: ended sessions one replica remembers for their idle time, at most (the oldest go first)
MAX_IDLE = 100_000


class SessionNotFound(NotFound):
    """The session a call names is not live (NVCF's proxy: "no existing session found")."""


def not_found(session: uuid.UUID) -> SessionNotFound:
    return SessionNotFound(detail=f"no existing session found for request {session}")


def _others(session: uuid.UUID, instance: uuid.UUID | None, target: Target) -> list[uuid.UUID]:
    if instance is None or not any(i.id == instance for i in target.instances):
        raise not_found(session)
    return [i.id for i in target.instances if i.id != instance]


class Sessions(Protocol):
    async def others(self, session: uuid.UUID, target: Target) -> list[uuid.UUID]:
        """The target's instances a call resuming `session` must not go to (all but the
        session's); NotFound when the session is not live or its instance is gone."""
        ...

    def join(
        self, session: uuid.UUID, instance_id: uuid.UUID, call: uuid.UUID
    ) -> asyncio.Future[None]:
        """`call` of `session` is open on the instance; the future is done once every
        replica can see it (the entry waits for it before the caller learns the session's
        id; it never fails)."""
        ...

    def leave(self, session: uuid.UUID, call: uuid.UUID) -> None:
        """`call` of `session` ended (never waits)."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


class LocalSessions:
    """The sessions of one replica (see the module docstring)."""

    def __init__(self, idle_seconds: float) -> None:
        self.idle_seconds = idle_seconds
        #: session -> (instance, calls open)
        self._open: dict[uuid.UUID, tuple[uuid.UUID, int]] = {}
        #: session -> (instance, live until): ended sessions in their idle time, oldest first
        self._idle: OrderedDict[uuid.UUID, tuple[uuid.UUID, float]] = OrderedDict()

    async def others(self, session: uuid.UUID, target: Target) -> list[uuid.UUID]:
        live = self._open.get(session)
        if live is not None:
            return _others(session, live[0], target)
        self._expire()
        idle = self._idle.get(session)
        return _others(session, None if idle is None else idle[0], target)

    def join(
        self, session: uuid.UUID, instance_id: uuid.UUID, call: uuid.UUID
    ) -> asyncio.Future[None]:
        self._idle.pop(session, None)
        live = self._open.get(session)
        self._open[session] = (instance_id, 1 if live is None else live[1] + 1)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def leave(self, session: uuid.UUID, call: uuid.UUID) -> None:
        live = self._open.get(session)
        if live is None:
            return
        if live[1] > 1:
            self._open[session] = (live[0], live[1] - 1)
            return
        del self._open[session]
        if self.idle_seconds > 0:
            self._idle[session] = (live[0], _now() + self.idle_seconds)
            self._expire()

    def _expire(self) -> None:
        now = _now()
        while self._idle:
            session, (_, until) = next(iter(self._idle.items()))
            if until > now and len(self._idle) <= MAX_IDLE:
                break
            del self._idle[session]

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _now() -> float:
    return asyncio.get_running_loop().time()


_CLOCK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
# KEYS[1] the session; ARGV: instance, call, lease ms, idle ms
JOIN = (
    _CLOCK
    + """
local lease, idle = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'i', ARGV[1], 'c:' .. ARGV[2], now + lease)
redis.call('PEXPIRE', KEYS[1], lease + idle)
return 1
"""
)
# KEYS[1] the session; ARGV: call, idle ms
LEAVE = (
    _CLOCK
    + """
redis.call('HDEL', KEYS[1], 'c:' .. ARGV[1])
local fields = redis.call('HGETALL', KEYS[1])
local open = false
for n = 1, #fields, 2 do
  if string.sub(fields[n], 1, 2) == 'c:' then
    if tonumber(fields[n + 1]) > now then
      open = true
    else
      redis.call('HDEL', KEYS[1], fields[n])
    end
  end
end
if not open then
  local idle = tonumber(ARGV[2])
  if idle > 0 then redis.call('PEXPIRE', KEYS[1], idle) else redis.call('DEL', KEYS[1]) end
end
return 1
"""
)
# KEYS[1] the session; ARGV: call, lease ms, idle ms
RENEW = (
    _CLOCK
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local lease = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'c:' .. ARGV[1], now + lease)
redis.call('PEXPIRE', KEYS[1], lease + tonumber(ARGV[3]))
return 1
"""
)
# KEYS[1] the session
LOOKUP = "return redis.call('HGET', KEYS[1], 'i')"

_JOIN, _LEAVE, _RENEW, _LOOKUP = Script(JOIN), Script(LEAVE), Script(RENEW), Script(LOOKUP)


class RedisSessions:
    """The sessions of every replica, in Redis (see the module docstring); `start()` begins
    renewing the calls this replica holds."""

    def __init__(self, redis_url: str, *, lease_seconds: float, idle_seconds: float) -> None:
        self._pool = ConnectionPool.from_url(redis_url)
        self._redis = Redis(connection_pool=self._pool)
        self._lease_ms = max(1000, int(lease_seconds * 1000))
        self._idle_ms = int(idle_seconds * 1000)
        self._batch = ScriptBatch(self._redis, [_JOIN, _LEAVE, _RENEW, _LOOKUP])
        #: this replica's open calls: (session, call)
        self._held: set[tuple[uuid.UUID, uuid.UUID]] = set()
        #: renews the calls this replica holds every third of the lease
        self._renewer = LoopService[str](
            "nvcf-invocation-sessions-renew",
            self._renew,
            self._lease_ms / 3000,
            log=log,
            failure="renewing gRPC session calls in Redis failed",
        )
        self._joining: set[asyncio.Task[None]] = set()

    async def others(self, session: uuid.UUID, target: Target) -> list[uuid.UUID]:
        try:
            raw = await self._batch.call(_LOOKUP, [f"{PREFIX}{session}"], [])
        except RedisError as exc:
            raise ServiceUnavailable(
                detail=f"the shared sessions (Redis) cannot be reached: {exc}; retry"
            ) from exc
        instance = None
        if raw is not None:
            with contextlib.suppress(ValueError):
                instance = uuid.UUID(raw.decode() if isinstance(raw, bytes) else str(raw))
        return _others(session, instance, target)

    def join(
        self, session: uuid.UUID, instance_id: uuid.UUID, call: uuid.UUID
    ) -> asyncio.Future[None]:
        self._held.add((session, call))
        # queued now, so that it reaches Redis before the call's own `leave`
        sent = self._batch.submit(
            _JOIN,
            [f"{PREFIX}{session}"],
            [str(instance_id), str(call), str(self._lease_ms), str(self._idle_ms)],
        )
        task = asyncio.get_running_loop().create_task(self._joined(session, sent))
        self._joining.add(task)
        task.add_done_callback(self._joining.discard)
        return task

    async def _joined(self, session: uuid.UUID, sent: asyncio.Future[Any]) -> None:
        try:
            await sent
        except Exception as exc:  # RedisError, or Redis unreachable
            # the call itself goes on; only resuming its session elsewhere is not possible
            log.warning("recording gRPC session %s in Redis failed: %s", session, exc)

    def leave(self, session: uuid.UUID, call: uuid.UUID) -> None:
        self._held.discard((session, call))
        self._batch.fire(
            _LEAVE,
            [f"{PREFIX}{session}"],
            [str(call), str(self._idle_ms)],
            f"ending a call of gRPC session {session}",
        )

    async def start(self) -> None:
        self._renewer.start()

    async def aclose(self) -> None:
        await self._renewer.stop()
        if self._joining:
            await asyncio.gather(*self._joining, return_exceptions=True)
        await self._batch.drain()
        await self._redis.aclose()
        await self._pool.aclose()

    async def _renew(self) -> None:
        """Keep this replica's calls (and so their sessions) alive; a dead replica's expire."""
        renewals = [
            self._batch.call(
                _RENEW,
                [f"{PREFIX}{session}"],
                [str(call), str(self._lease_ms), str(self._idle_ms)],
            )
            for session, call in list(self._held)
        ]
        results = await asyncio.gather(*renewals, return_exceptions=True)
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            log.warning(
                "renewing %d gRPC session calls in Redis failed: %s", len(failed), failed[0]
            )
