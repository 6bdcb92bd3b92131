"""Queues and per-instance concurrency shared by every replica through Redis
(`NVCF_REDIS_URL`), with the same rules as `LocalDispatcher` (dispatch.py).

Keys (prefix `nvcf:inv:`):

- `q:<version>` — the version's queue: a sorted set of request ids scored by rank
  (dispatch.rank_of: the priority) times 2**32 plus arrival (a retry goes first with a
  negative score); `w:<request>` marks a waiter as alive (value: its version, expiring unless
  its replica renews it), so the queue never waits for a dead replica's entry;
- `f:<instance>` — the requests in flight on an instance: a sorted set scored by lease expiry,
  renewed by the replica running them; an expired entry (its replica died) frees the slot.

Every decision is one Lua script, so replicas never both take the last slot (the calls of
many requests share one round trip, redis_batch.py): `enqueue`
(a free slot at once when nobody waits — the first preferred instance with room, else the
least loaded —, else a place in the queue, or full), `take` (the head
of the queue takes a free slot) and `release` (frees a slot and publishes on
`nvcf:inv:free:<version>`). A replica subscribes to those messages and lets its first waiter of
the version try again (only the first: nobody behind it can be the head sooner); every waiter
also tries again every second, in case a message was lost or a slot expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.exceptions import RedisError

from service.core.errors import ServiceUnavailable
from service.core.loops import LoopService
from service.invocation.dispatch import (
    UNRANKED,
    LoadListener,
    QueueTimeout,
    Ticket,
    queue_full,
    queue_up,
    rank_of,
)
from service.invocation.redis_batch import Script, ScriptBatch
from service.invocation.routing import InstanceRoute, Target

log = logging.getLogger("nvcf.invocation")

PREFIX = "nvcf:inv:"
#: a waiter re-checks its place at least this often (seconds)
RETRY_SECONDS = 1.0

_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local P = 'nvcf:inv:'
local function clean_head(q)
  while true do
    local head = redis.call('ZRANGE', q, 0, 0)
    if #head == 0 then return nil end
    if redis.call('EXISTS', P .. 'w:' .. head[1]) == 1 then return head[1] end
    redis.call('ZREM', q, head[1])
  end
end
local function parse(i)
  local excl = {}
  local nx = tonumber(ARGV[i]); i = i + 1
  for _ = 1, nx do excl[ARGV[i]] = true; i = i + 1 end
  local insts = {}
  local ni = tonumber(ARGV[i]); i = i + 1
  for _ = 1, ni do insts[#insts + 1] = {ARGV[i], tonumber(ARGV[i + 1])}; i = i + 2 end
  local pref = {}
  local np = tonumber(ARGV[i]); i = i + 1
  for _ = 1, np do pref[#pref + 1] = ARGV[i]; i = i + 1 end
  return excl, insts, pref
end
local function pick(excl, insts, pref)
  for _, wanted in ipairs(pref) do
    for _, inst in ipairs(insts) do
      if inst[1] == wanted and not excl[wanted] then
        local key = P .. 'f:' .. wanted
        redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
        if redis.call('ZCARD', key) < inst[2] then return wanted end
      end
    end
  end
  local best, load_best = nil, nil
  for _, inst in ipairs(insts) do
    if not excl[inst[1]] then
      local key = P .. 'f:' .. inst[1]
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
      local load = redis.call('ZCARD', key)
      if load < inst[2] and (best == nil or load < load_best) then
        best, load_best = inst[1], load
      end
    end
  end
  return best
end
"""

# KEYS[1] queue; ARGV: request, version, marker ms, lease ms, queue max, front, rank,
# exclusions, instances, preferred instances
ENQUEUE = (
    _COMMON
    + """
local q, req, version = KEYS[1], ARGV[1], ARGV[2]
local marker, lease, qmax, front = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]),
  ARGV[6] == '1'
local rank = tonumber(ARGV[7])
local excl, insts, pref = parse(8)
local head = clean_head(q)
if head == nil or front then
  local best = pick(excl, insts, pref)
  if best then
    redis.call('ZADD', P .. 'f:' .. best, now + lease, req)
    return {'granted', best}
  end
end
if (not front) and redis.call('ZCARD', q) >= qmax then return {'full'} end
local seq = redis.call('INCR', P .. 'seq')
local score = rank * 4294967296 + (seq % 4294967296)
if front then score = -seq end
redis.call('ZADD', q, score, req)
redis.call('SET', P .. 'w:' .. req, version, 'PX', marker)
return {'queued'}
"""
)

# KEYS[1] queue; ARGV: request, lease ms, exclusions, instances, preferred instances
TAKE = (
    _COMMON
    + """
local q, req, lease = KEYS[1], ARGV[1], tonumber(ARGV[2])
local excl, insts, pref = parse(3)
local head = clean_head(q)
if head ~= req then
  local rank = redis.call('ZRANK', q, req)
  if rank == false then return {'gone'} end
  return {'waiting', tostring(rank + 1)}
end
local best = pick(excl, insts, pref)
if best then
  redis.call('ZREM', q, req)
  redis.call('DEL', P .. 'w:' .. req)
  redis.call('ZADD', P .. 'f:' .. best, now + lease, req)
  return {'granted', best}
end
return {'waiting', '1'}
"""
)

# KEYS[1] in-flight set of the instance; ARGV: request, channel, version
RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""

_ENQUEUE, _TAKE, _RELEASE = Script(ENQUEUE), Script(TAKE), Script(RELEASE)


def _instances(
    target: Target, exclude: Iterable[uuid.UUID], prefer: Sequence[uuid.UUID] = ()
) -> list[str]:
    excluded = [str(i) for i in exclude]
    args = [str(len(excluded)), *excluded, str(len(target.instances))]
    for inst in target.instances:
        args += [str(inst.id), str(inst.max_concurrency)]
    return [*args, str(len(prefer)), *(str(p) for p in prefer)]


@dataclass(eq=False)
class _Waiter:
    request_id: uuid.UUID
    target: Target
    exclude: frozenset[uuid.UUID]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    prefer: Sequence[uuid.UUID] = ()
    rank: int = UNRANKED


class _RedisTicket:
    def __init__(
        self,
        dispatcher: RedisDispatcher,
        request_id: uuid.UUID,
        target: Target,
        waiter: _Waiter | None,
        granted: InstanceRoute | None,
    ) -> None:
        self._dispatcher = dispatcher
        self._request_id = request_id
        self._target = target
        self._waiter = waiter
        self._granted = granted

    async def wait(self, seconds: float) -> InstanceRoute:
        if self._granted is not None:
            return self._granted
        waiter = self._waiter
        assert waiter is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        try:
            while True:
                granted = await self._dispatcher._take(waiter)
                if granted is not None:
                    self._granted = granted
                    return granted
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise QueueTimeout
                waiter.wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(RETRY_SECONDS, remaining)):
                        await waiter.wake.wait()
        except BaseException:
            if self._granted is None:
                await asyncio.shield(self._dispatcher._leave(waiter))
            raise

    def cancel(self) -> None:
        if self._granted is not None:
            work = self._dispatcher.release(self._target, self._granted.id, self._request_id)
        elif self._waiter is not None:
            work = self._dispatcher._leave(self._waiter)
        else:
            return
        self._dispatcher._spawn(work)


class RedisDispatcher:
    """`Dispatcher` over Redis; `start()` subscribes and begins renewing leases."""

    def __init__(
        self,
        redis_url: str,
        *,
        queue_max: int,
        lease_seconds: float,
        on_change: LoadListener | None = None,
    ) -> None:
        self.queue_max = queue_max
        self._on_change = on_change
        self._pool = ConnectionPool.from_url(redis_url)
        self._redis = Redis(connection_pool=self._pool)
        self._lease_ms = max(1000, int(lease_seconds * 1000))
        #: every script call of a request goes through one batch (redis_batch.py)
        self._batch = ScriptBatch(self._redis, [_ENQUEUE, _TAKE, _RELEASE])
        #: this replica's waiters per version, in arrival order
        self._waiting: dict[uuid.UUID, deque[_Waiter]] = {}
        #: this replica's requests in flight: request -> (instance, target)
        self._held: dict[uuid.UUID, tuple[uuid.UUID, Target]] = {}
        self._by_version: dict[uuid.UUID, int] = {}
        self._listener: asyncio.Task[None] | None = None
        #: renews this replica's leases every third of the lease
        self._renewer = LoopService[str](
            "nvcf-invocation-redis-renew",
            self._renew,
            self._lease_ms / 3000,
            log=log,
            failure="renewing invocation leases in Redis failed",
        )
        self._background: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        # the listener is no loop service: it waits on one subscription for as long as it
        # lasts, not in rounds (docs/architecture.md, background loops)
        self._listener = asyncio.create_task(self._listen(), name="nvcf-invocation-redis-listen")
        self._renewer.start()

    async def aclose(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        await self._renewer.stop()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self._batch.drain()
        await self._redis.aclose()
        await self._pool.aclose()

    # ------------------------------------------------------------------ Dispatcher

    async def enqueue(
        self,
        request_id: uuid.UUID,
        target: Target,
        *,
        exclude: Iterable[uuid.UUID] = (),
        front: bool = False,
        prefer: Sequence[uuid.UUID] = (),
        priority: int | None = None,
    ) -> Ticket:
        excluded = frozenset(exclude)
        rank = rank_of(priority)
        try:
            result = await self._batch.call(
                _ENQUEUE,
                [f"{PREFIX}q:{target.vid}"],
                [
                    str(request_id),
                    str(target.version_id),
                    str(self._lease_ms),
                    str(self._lease_ms),
                    str(self.queue_max),
                    "1" if front else "0",
                    str(rank),
                    *_instances(target, excluded, prefer),
                ],
            )
        except RedisError as exc:
            raise ServiceUnavailable(
                detail=f"the shared invocation queues (Redis) cannot be reached: {exc}; retry"
            ) from exc
        kind = _text(result[0])
        if kind == "full":
            raise queue_full(target, self.queue_max)
        if kind == "granted":
            instance = self._granted(request_id, target, _text(result[1]))
            return _RedisTicket(self, request_id, target, None, instance)
        waiter = _Waiter(request_id, target, excluded, prefer=prefer, rank=rank)
        queue_up(self._waiting.setdefault(target.version_id, deque()), waiter, front=front)
        self._changed(target)
        return _RedisTicket(self, request_id, target, waiter, None)

    async def release(self, target: Target, instance_id: uuid.UUID, request_id: uuid.UUID) -> None:
        self._held.pop(request_id, None)
        version = target.version_id
        left = self._by_version.get(version, 0) - 1
        if left > 0:
            self._by_version[version] = left
        else:
            self._by_version.pop(version, None)
        self._batch.fire(
            _RELEASE,
            [f"{PREFIX}f:{instance_id}"],
            [str(request_id), f"{PREFIX}free:{version}", str(version)],
            f"releasing a slot of instance {instance_id}",
        )
        self._changed(target)
        self._wake_first(version)

    async def update(self, target: Target) -> None:
        for waiter in self._waiting.get(target.version_id, ()):
            waiter.target = target
        self._wake_first(target.version_id)

    async def depth(self, version_id: uuid.UUID) -> int:
        return int(await self._redis.zcard(f"{PREFIX}q:{version_id}"))

    async def position(self, request_id: uuid.UUID) -> int | None:
        version = await self._redis.get(f"{PREFIX}w:{request_id}")
        if version is None:
            return None
        rank: Any = await self._redis.zrank(f"{PREFIX}q:{_text(version)}", str(request_id))
        return None if rank is None else int(rank) + 1

    def in_flight(self, version_id: uuid.UUID) -> int:
        return self._by_version.get(version_id, 0)

    async def requests_in_flight(self, instance_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        return await _in_flight(self._redis, instance_ids)

    async def requests_waiting(self, version_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        return await _waiting(self._redis, version_ids)

    def depth_now(self, version_id: uuid.UUID) -> int:
        return len(self._waiting.get(version_id, ()))

    def waiting_versions(self) -> list[Target]:
        return [lane[0].target for lane in self._waiting.values() if lane]

    # ------------------------------------------------------------------ internals

    def _granted(self, request_id: uuid.UUID, target: Target, instance_id: str) -> InstanceRoute:
        instance = next(i for i in target.instances if str(i.id) == instance_id)
        self._held[request_id] = (instance.id, target)
        self._by_version[target.version_id] = self._by_version.get(target.version_id, 0) + 1
        self._changed(target)
        return instance

    def _changed(self, target: Target) -> None:
        if self._on_change is not None:
            version = target.version_id
            self._on_change(target, self.in_flight(version), self.depth_now(version))

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _take(self, waiter: _Waiter) -> InstanceRoute | None:
        result = await self._batch.call(
            _TAKE,
            [f"{PREFIX}q:{waiter.target.vid}"],
            [
                str(waiter.request_id),
                str(self._lease_ms),
                *_instances(waiter.target, waiter.exclude, waiter.prefer),
            ],
        )
        kind = _text(result[0])
        if kind == "granted":
            self._forget(waiter)
            return self._granted(waiter.request_id, waiter.target, _text(result[1]))
        if kind == "gone":
            # Our place expired (this replica stalled): queue again, first.
            await self._redis.set(
                f"{PREFIX}w:{waiter.request_id}", str(waiter.target.version_id), px=self._lease_ms
            )
            await self._redis.zadd(
                f"{PREFIX}q:{waiter.target.version_id}", {str(waiter.request_id): -1}
            )
        return None

    async def _leave(self, waiter: _Waiter) -> None:
        self._forget(waiter)
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.zrem(f"{PREFIX}q:{waiter.target.version_id}", str(waiter.request_id))
            pipe.delete(f"{PREFIX}w:{waiter.request_id}")
            await pipe.execute()
        except Exception:
            log.exception("leaving the queue in Redis failed")
        self._wake_first(waiter.target.version_id)

    def _forget(self, waiter: _Waiter) -> None:
        lane = self._waiting.get(waiter.target.version_id)
        if lane is None:
            return
        with contextlib.suppress(ValueError):
            lane.remove(waiter)
        self._changed(waiter.target)
        if not lane:
            self._waiting.pop(waiter.target.version_id, None)
        else:
            lane[0].wake.set()  # the next local waiter may be the head now

    def _wake_first(self, version_id: uuid.UUID) -> None:
        lane = self._waiting.get(version_id)
        if lane:
            lane[0].wake.set()

    async def _listen(self) -> None:
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.psubscribe(f"{PREFIX}free:*")
                async for message in pubsub.listen():
                    if message.get("type") != "pmessage":
                        continue
                    with contextlib.suppress(ValueError):
                        self._wake_first(uuid.UUID(_text(message["data"])))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning(
                    "the Redis subscription for freed slots failed; retrying", exc_info=True
                )
                await asyncio.sleep(1)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _renew(self) -> None:
        """Keep this replica's slots and places alive (a dead replica's expire); a failure is
        a warning, the next round tries again."""
        if not self._held and not self._waiting:
            return
        try:
            pipe = self._redis.pipeline(transaction=False)
            expiry = await self._redis_now_ms() + self._lease_ms
            for request_id, (instance_id, _) in list(self._held.items()):
                pipe.zadd(f"{PREFIX}f:{instance_id}", {str(request_id): expiry}, xx=True)
            for lane in self._waiting.values():
                for waiter in lane:
                    pipe.pexpire(f"{PREFIX}w:{waiter.request_id}", self._lease_ms)
            await pipe.execute()
        except Exception:
            log.warning("renewing invocation leases in Redis failed", exc_info=True)

    async def _redis_now_ms(self) -> int:
        seconds, micros = await self._redis.time()
        return int(seconds) * 1000 + int(micros) // 1000


async def _in_flight(redis: Redis, instance_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    """Unexpired requests in flight on each instance, every replica's (one round trip)."""
    if not instance_ids:
        return {}
    seconds, micros = await redis.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    async with redis.pipeline(transaction=False) as pipe:
        for inst in instance_ids:
            pipe.zcount(f"{PREFIX}f:{inst}", now, "+inf")
        counts = await pipe.execute()
    return {i: int(n) for i, n in zip(instance_ids, counts, strict=True) if int(n)}


async def _waiting(redis: Redis, version_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    """Requests in each version's queue, every replica's (one round trip)."""
    if not version_ids:
        return {}
    async with redis.pipeline(transaction=False) as pipe:
        for version in version_ids:
            pipe.zcard(f"{PREFIX}q:{version}")
        counts = await pipe.execute()
    return {v: int(n) for v, n in zip(version_ids, counts, strict=True) if int(n)}


class RedisActivity:
    """The drain's view of every replica's requests (reconcile/drain.py `Activity`) for a
    process that runs the reconciler without an invocation plane."""

    def __init__(self, redis_url: str) -> None:
        self._redis = Redis.from_url(redis_url)

    async def requests_in_flight(self, instance_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        return await _in_flight(self._redis, instance_ids)

    async def requests_waiting(self, version_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        return await _waiting(self._redis, version_ids)

    async def aclose(self) -> None:
        await self._redis.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
