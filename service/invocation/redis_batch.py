"""Script calls to Redis, batched: one round trip carries every call made meanwhile.

A request asks Redis for a slot when it arrives and gives it back when it ends; under load,
many do so at once. `ScriptBatch` keeps at most one pipeline in flight: calls made while
one is under way wait and leave together in the next (in order, on one connection, so a
release is seen by Redis before a later take). A call whose caller needs no answer (a
release) is `fire`d: it is not awaited, and a failure is logged (the slot's lease then
expires on its own).

Scripts are loaded once (`SCRIPT LOAD`) and called by their SHA; when Redis has lost them
(a restart, `SCRIPT FLUSH`) they are loaded again and the batch is sent once more.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

log = logging.getLogger("nvcf.invocation")


@dataclass(frozen=True)
class Script:
    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()


@dataclass(eq=False)
class _Call:
    script: Script
    keys: list[str]
    args: list[str]
    future: asyncio.Future[Any] | None
    what: str


class ScriptBatch:
    def __init__(self, redis: Redis, scripts: list[Script]) -> None:
        self._redis = redis
        self._scripts = scripts
        self._pending: list[_Call] = []
        self._sender: asyncio.Task[None] | None = None
        self._loaded = False

    async def call(self, script: Script, keys: list[str], args: list[str]) -> Any:
        """The script's answer (`RedisError` when Redis cannot be reached or refuses)."""
        return await self.submit(script, keys, args)

    def submit(self, script: Script, keys: list[str], args: list[str]) -> asyncio.Future[Any]:
        """`call`, queued at once (before any call made after it returns): the future of
        its answer."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._add(_Call(script, keys, args, future, ""))
        return future

    def fire(self, script: Script, keys: list[str], args: list[str], what: str) -> None:
        """Send the call with the next batch; nobody waits for it (`what` names it in the
        log when it fails)."""
        self._add(_Call(script, keys, args, None, what))

    async def drain(self) -> None:
        """Wait until every call made so far has been sent."""
        while self._sender is not None:
            await asyncio.shield(self._sender)

    def _add(self, call: _Call) -> None:
        self._pending.append(call)
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send_all())

    async def _send_all(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._send(batch)
        finally:
            self._sender = None

    async def _send(self, batch: list[_Call]) -> None:
        try:
            results = await self._execute(batch)
            lost = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if lost:  # Redis lost the scripts: load them again, send those calls once more
                self._loaded = False
                again = await self._execute([batch[i] for i in lost])
                for i, result in zip(lost, again, strict=True):
                    results[i] = result
        except Exception as exc:  # Redis unreachable: every call of the batch fails
            results = [exc] * len(batch)
        for call, result in zip(batch, results, strict=True):
            if call.future is None:
                if isinstance(result, Exception):
                    log.warning("%s in Redis failed: %s", call.what, result)
            elif call.future.done():
                continue
            elif isinstance(result, Exception):
                call.future.set_exception(result)
            else:
                call.future.set_result(result)

    async def _execute(self, batch: list[_Call]) -> list[Any]:
        if not self._loaded:
            for script in self._scripts:
                await self._redis.script_load(script.source)
            self._loaded = True
        pipe = self._redis.pipeline(transaction=False)
        for call in batch:
            pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        return results
