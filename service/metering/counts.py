"""Invocation and token counts, kept in memory where a run ends and added to the database in
batches (`Meter.flush`, every `NVCF_METERING_FLUSH_SECONDS` and at shutdown), so the request
path never writes to the database. Each replica run adds its own counts under its own id (a
new one at every start); a batch carries a number, and a stored row takes each batch once, so
a flush retried after a commit whose outcome was lost adds nothing the second time. A replica
that dies loses at most its last interval's counts."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.db import utcnow
from service.core.loops import LoopService
from service.metering import repository

log = logging.getLogger("nvcf.metering")

#: (account, function id, version id, model)
Key = tuple[str, str, str, str]
#: keys kept in memory between two flushes at most: beyond, new keys wait for the next flush
#: (counted under the last one's key would be wrong; dropping them is logged)
MAX_KEYS = 100_000
#: a model's name as stored (a longer one is metered under its first characters)
MAX_MODEL = 256
#: the most tokens of one kind one request is metered for: a worker's `usage` is its own word,
#: and a sum past the database's 64-bit column would stop every later flush
MAX_REQUEST_TOKENS = 2**31


@dataclass
class _Batch:
    number: int
    hour: datetime
    counts: dict[Key, list[int]]


class Meter(LoopService[str]):
    """The counts of this replica run: `invocation` and `tokens` on the request path (a dict
    update each), `flush` adds them to the database."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        period: float,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        super().__init__(
            "metering", self.flush, period, log=log, failure="adding the usage counts failed"
        )
        self.sessionmaker = sessionmaker
        self.clock = clock
        self.replica = str(uuid.uuid4())
        self._counts: dict[Key, list[int]] = {}
        self._unsent: _Batch | None = None
        self._batches = 0
        self.dropped = 0

    def _entry(self, key: Key) -> list[int] | None:
        entry = self._counts.get(key)
        if entry is None:
            if len(self._counts) >= MAX_KEYS:
                self.dropped += 1
                return None
            entry = self._counts[key] = [0, 0, 0]
        return entry

    def invocation(self, account: str, function_id: str, version_id: str, model: str) -> None:
        entry = self._entry((account, function_id, version_id, model[:MAX_MODEL]))
        if entry is not None:
            entry[0] += 1

    def tokens(
        self,
        account: str,
        function_id: str,
        version_id: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
    ) -> None:
        entry = self._entry((account, function_id, version_id, model[:MAX_MODEL]))
        if entry is not None:
            entry[1] += min(input_tokens, MAX_REQUEST_TOKENS)
            entry[2] += min(output_tokens, MAX_REQUEST_TOKENS)

    async def flush(self) -> None:
        """Add the counts so far to the database: first a batch whose earlier write failed
        (under its own number, so it is never added twice), then the ones since."""
        if self._unsent is not None:
            await self._write(self._unsent)
            self._unsent = None
        if not self._counts:
            return
        counts, self._counts = self._counts, {}
        self._batches += 1
        hour = self.clock().replace(minute=0, second=0, microsecond=0)
        batch = _Batch(self._batches, hour, counts)
        self._unsent = batch
        await self._write(batch)
        self._unsent = None

    async def _write(self, batch: _Batch) -> None:
        rows: list[dict[str, object]] = [
            {
                "replica": self.replica,
                "hour": batch.hour,
                "account_id": account,
                "function_id": function_id,
                "version_id": version_id,
                "model": model,
                "invocations": n[0],
                "input_tokens": n[1],
                "output_tokens": n[2],
                "batch": batch.number,
            }
            for (account, function_id, version_id, model), n in batch.counts.items()
        ]
        async with self.sessionmaker() as session, session.begin():
            for start in range(0, len(rows), 500):
                await repository.add_counts(session, rows[start : start + 500])

    async def stop(self) -> None:
        """Stop the loop and add what is left."""
        await super().stop()
        try:
            await self.flush()
        except Exception:
            log.exception("adding the last usage counts at shutdown failed")
