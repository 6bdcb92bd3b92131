"""Queues and concurrency: which instance takes a request, and when.

Each Running instance takes at most its spec's `maxRequestConcurrency` requests at once; a
request goes to the first of the instances it prefers (an entry's choice: the LLM gateway's
session or routing method) that has room, else to the instance with the fewest in flight
(ties in turn). When every instance is
full (or the version has none Running yet) the request waits in its version's queue, at most
`NVCF_INVOKE_QUEUE_MAX` long (one more is a 429), and takes the first instance that frees up.
The queue is ordered by priority (an LLM function's `llmInvocationConfig.priority`, lower
first, as NVCF; a request without one after every one with one), first come first served
within a priority. A request retried after a refused connection goes to the head of the
queue and never back to the instance that refused it.

`LocalDispatcher` keeps queues and counts in this process; `RedisDispatcher`
(dispatch_redis.py) shares them between replicas. Both hand out `Ticket`s.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from service.core.errors import TooManyRequests
from service.invocation.routing import InstanceRoute, Target

#: told (target, requests in flight, requests waiting) whenever a version's load changes
LoadListener = Callable[[Target, int, int], None]


#: no instance excluded
_NONE: frozenset[uuid.UUID] = frozenset()
#: the rank of a request without a priority: after every one with one (priorities from it up
#: share it: the Redis queue's score holds a rank below 2**20 beside the arrival order)
UNRANKED = (1 << 20) - 1


def rank_of(priority: int | None) -> int:
    """Where a request of `priority` waits: lower ranks first."""
    return UNRANKED if priority is None else min(max(priority, 0), UNRANKED)


class Ranked(Protocol):
    @property
    def rank(self) -> int: ...


W = TypeVar("W", bound=Ranked)


def queue_up(waiting: deque[W], waiter: W, *, front: bool) -> None:
    """Put `waiter` in its place: the head when `front` (a retry), else after every waiter
    of its rank or a lower one."""
    if front:
        waiting.appendleft(waiter)
        return
    index = len(waiting)
    while index and waiting[index - 1].rank > waiter.rank:
        index -= 1
    waiting.insert(index, waiter)


class QueueTimeout(Exception):
    """No instance took the request within the queue timeout."""


def queue_full(target: Target, limit: int) -> TooManyRequests:
    return TooManyRequests(
        detail=f"the queue of function version {target.version_id} is full ({limit} requests "
        "waiting for an instance); retry later",
        headers={"Retry-After": "1"},
    )


class Ticket(Protocol):
    """A request's claim on an instance: granted at once, or after waiting in the queue."""

    async def wait(self, seconds: float) -> InstanceRoute:
        """The instance taking the request (`QueueTimeout` after `seconds`)."""
        ...

    def cancel(self) -> None:
        """Give up the claim (the caller went away); a granted instance is released."""
        ...


class Dispatcher(Protocol):
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
        """Claim an instance for a request (the first of `prefer` with room, else the least
        loaded), waiting in the queue by `priority`; `TooManyRequests` when the queue is
        full."""
        ...

    async def release(self, target: Target, instance_id: uuid.UUID, request_id: uuid.UUID) -> None:
        """The request on the instance ended: the slot goes to the next in the queue."""
        ...

    async def update(self, target: Target) -> None:
        """The version's Running instances changed (read again): waiting requests may move."""
        ...

    async def depth(self, version_id: uuid.UUID) -> int:
        """Requests of the version waiting for an instance."""
        ...

    async def position(self, request_id: uuid.UUID) -> int | None:
        """1-based place of a waiting request in its queue; None when it is not waiting."""
        ...

    def in_flight(self, version_id: uuid.UUID) -> int:
        """Requests of the version on an instance, as this process knows them."""
        ...

    def depth_now(self, version_id: uuid.UUID) -> int:
        """Requests of the version waiting, as this process knows them (all of them without
        Redis; this replica's with Redis)."""
        ...

    def waiting_versions(self) -> list[Target]:
        """Targets of the versions with requests waiting in this process."""
        ...

    async def requests_in_flight(self, instance_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        """Requests on each instance (absent: none): the drain's view (reconcile/drain.py)."""
        ...

    async def requests_waiting(self, version_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        """Requests waiting for each version (absent: none)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(eq=False)
class _Waiter:
    request_id: uuid.UUID
    exclude: frozenset[uuid.UUID]
    future: asyncio.Future[InstanceRoute]
    prefer: Sequence[uuid.UUID] = ()
    rank: int = UNRANKED


@dataclass(eq=False)
class _Lane:
    """One version: its instances as last read and its waiting requests."""

    target: Target
    waiting: deque[_Waiter] = field(default_factory=deque)
    turn: int = 0


class _LocalTicket:
    def __init__(
        self,
        dispatcher: LocalDispatcher,
        waiter: _Waiter | None,
        granted: InstanceRoute | None,
        lane: _Lane,
    ) -> None:
        self._dispatcher = dispatcher
        self._waiter = waiter
        self._granted = granted
        self._lane = lane

    async def wait(self, seconds: float) -> InstanceRoute:
        if self._granted is not None:
            return self._granted
        assert self._waiter is not None
        try:
            async with asyncio.timeout(seconds):
                self._granted = await asyncio.shield(self._waiter.future)
        except asyncio.CancelledError:
            self.cancel()
            raise
        except TimeoutError:
            if self._waiter.future.done() and not self._waiter.future.cancelled():
                self._granted = self._waiter.future.result()
                return self._granted
            self._dispatcher._drop(self._lane, self._waiter)
            raise QueueTimeout from None
        return self._granted

    def cancel(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.future.done():
            self._dispatcher._drop(self._lane, waiter)
            waiter.future.cancel()
            return
        granted = self._granted
        if granted is None and waiter is not None and not waiter.future.cancelled():
            granted = waiter.future.result()
        if granted is not None:
            self._dispatcher.release_now(self._lane.target, granted.key)


class LocalDispatcher:
    """Queues and in-flight counts of this process (one replica, or without Redis). Its
    tables are keyed by the ids as text (`Target.vid`, `InstanceRoute.key`): a string hashes
    once, a UUID (a Python-level `__hash__`) at every lookup."""

    def __init__(self, queue_max: int, on_change: LoadListener | None = None) -> None:
        self.queue_max = queue_max
        self._lanes: dict[str, _Lane] = {}
        #: by instance
        self._in_flight: dict[str, int] = {}
        #: by version
        self._by_version: dict[str, int] = {}
        self._on_change = on_change

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
        lane = self._lane(target)
        excluded = frozenset(exclude)
        if front or not lane.waiting:
            instance = self._pick(lane, excluded, prefer)
            if instance is not None:
                self._take(lane, instance)
                return _LocalTicket(self, None, instance, lane)
        if not front and len(lane.waiting) >= self.queue_max:
            raise queue_full(target, self.queue_max)
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(request_id, excluded, future, prefer, rank_of(priority))
        queue_up(lane.waiting, waiter, front=front)
        self._changed(lane)
        return _LocalTicket(self, waiter, None, lane)

    def take_now(self, target: Target) -> InstanceRoute | None:
        """An instance with room for the request at once, taken; None when the request would
        wait (every instance full, or others already waiting: first come, first served)."""
        lane = self._lane(target)
        if lane.waiting:
            return None
        instance = self._pick(lane, _NONE)
        if instance is not None:
            self._take(lane, instance)
        elif not lane.waiting and target.vid not in self._by_version:
            self._lanes.pop(target.vid, None)
        return instance

    async def release(self, target: Target, instance_id: uuid.UUID, request_id: uuid.UUID) -> None:
        self.release_now(target, str(instance_id))

    async def update(self, target: Target) -> None:
        lane = self._lanes.get(target.vid)
        if lane is not None:
            lane.target = target
            self._drain(lane)

    async def depth(self, version_id: uuid.UUID) -> int:
        return self.depth_now(version_id)

    async def position(self, request_id: uuid.UUID) -> int | None:
        for lane in self._lanes.values():
            for index, waiter in enumerate(lane.waiting):
                if waiter.request_id == request_id:
                    return index + 1
        return None

    def in_flight(self, version_id: uuid.UUID) -> int:
        return self._by_version.get(str(version_id), 0)

    async def requests_in_flight(self, instance_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        """This process's requests on each instance (the drain's view, reconcile/drain.py)."""
        return {i: n for i in instance_ids if (n := self._in_flight.get(str(i), 0))}

    async def requests_waiting(self, version_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        """This process's requests waiting for each version."""
        return {v: n for v in version_ids if (n := self.depth_now(v))}

    def depth_now(self, version_id: uuid.UUID) -> int:
        lane = self._lanes.get(str(version_id))
        return len(lane.waiting) if lane is not None else 0

    def waiting_versions(self) -> list[Target]:
        return [lane.target for lane in self._lanes.values() if lane.waiting]

    async def aclose(self) -> None:
        for lane in self._lanes.values():
            for waiter in lane.waiting:
                waiter.future.cancel()
            lane.waiting.clear()

    # ------------------------------------------------------------------ internals

    def _lane(self, target: Target) -> _Lane:
        lane = self._lanes.get(target.vid)
        if lane is None:
            lane = self._lanes[target.vid] = _Lane(target)
        elif lane.target is not target:
            lane.target = target
        return lane

    def _pick(
        self, lane: _Lane, exclude: frozenset[uuid.UUID], prefer: Sequence[uuid.UUID] = ()
    ) -> InstanceRoute | None:
        """The first preferred instance with room for one more, else the one with the
        fewest requests in flight and room."""
        instances = lane.target.instances
        for wanted in prefer:
            for instance in instances:
                if (
                    instance.id == wanted
                    and instance.id not in exclude
                    and self._in_flight.get(instance.key, 0) < instance.max_concurrency
                ):
                    return instance
        count = len(instances)
        if count == 1 and not exclude:  # (the common case, without the turn)
            only = instances[0]
            return only if self._in_flight.get(only.key, 0) < only.max_concurrency else None
        best: InstanceRoute | None = None
        best_load = 0
        for step in range(count):
            instance = instances[(lane.turn + step) % count]
            load = self._in_flight.get(instance.key, 0)
            if load >= instance.max_concurrency or (exclude and instance.id in exclude):
                continue
            if best is None or load < best_load:
                best, best_load = instance, load
        if best is not None:
            lane.turn += 1
        return best

    def _take(self, lane: _Lane, instance: InstanceRoute) -> None:
        key = instance.key
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        version = lane.target.vid
        self._by_version[version] = self._by_version.get(version, 0) + 1
        self._changed(lane)

    def release_now(self, target: Target, instance: str) -> None:
        """`release` without awaiting (this dispatcher never waits to release), of the
        instance whose `InstanceRoute.key` is `instance`."""
        left = self._in_flight.get(instance, 0) - 1
        if left > 0:
            self._in_flight[instance] = left
        else:
            self._in_flight.pop(instance, None)
        version = target.vid
        running = self._by_version.get(version, 0) - 1
        if running > 0:
            self._by_version[version] = running
        else:
            self._by_version.pop(version, None)
        lane = self._lanes.get(version)
        if lane is not None:
            self._drain(lane)
            self._changed(lane)
            if not lane.waiting and version not in self._by_version:
                self._lanes.pop(version, None)

    def _drain(self, lane: _Lane) -> None:
        """Give free slots to waiting requests in their order (priority, then arrival)."""
        while lane.waiting:
            for waiter in lane.waiting:
                instance = self._pick(lane, waiter.exclude, waiter.prefer)
                if instance is not None or not waiter.exclude:
                    break  # a waiter excluding nothing found no room: nobody else will
            else:
                return
            if instance is None:
                return
            lane.waiting.remove(waiter)
            self._take(lane, instance)
            waiter.future.set_result(instance)

    def _drop(self, lane: _Lane, waiter: _Waiter) -> None:
        try:
            lane.waiting.remove(waiter)
        except ValueError:
            return
        self._changed(lane)

    def _changed(self, lane: _Lane) -> None:
        if self._on_change is not None:
            target = lane.target
            self._on_change(target, self._by_version.get(target.vid, 0), len(lane.waiting))
