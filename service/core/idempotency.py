"""`Idempotency-Key` on creates: the same key and body within the TTL replays the first response.

A key is reserved inside the request's own transaction, so a failed request leaves no record.
Concurrent requests with one key serialise on an in-process lock (one server) and on the
table's primary key (several replicas on PostgreSQL).
"""

from __future__ import annotations

import asyncio
import hashlib
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

from fastapi import Request
from sqlalchemy import JSON, Integer, String, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from service.core.db import Base, UTCDateTime, run_after_commit, utcnow
from service.core.errors import Conflict, FieldError, ValidationFailed

HEADER = "Idempotency-Key"


class IdempotencyRecord(Base):
    __tablename__ = "idempotency_records"

    account_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int | None] = mapped_column(Integer)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)


class IdempotentReplay(Exception):
    """Raised to answer with the stored first response."""

    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        self.status_code = status_code
        self.body = body


class Recorder:
    """Handed to the endpoint, which records the response it is about to send."""

    def __init__(self) -> None:
        self.status_code: int | None = None
        self.body: dict[str, Any] | None = None

    def record(self, body: dict[str, Any], status_code: int = 200) -> dict[str, Any]:
        self.status_code = status_code
        self.body = body
        return body


_locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()


def _lock_for(account: str, key: str) -> asyncio.Lock:
    lock = _locks.get((account, key))
    if lock is None:
        lock = asyncio.Lock()
        _locks[(account, key)] = lock
    return lock


async def _existing(session: AsyncSession, account: str, key: str) -> IdempotencyRecord | None:
    stmt = select(IdempotencyRecord).where(
        IdempotencyRecord.account_id == account, IdempotencyRecord.key == key
    )
    return (await session.execute(stmt)).scalar_one_or_none()


def _answer(rec: IdempotencyRecord, fingerprint: str) -> None:
    if rec.fingerprint != fingerprint:
        raise Conflict(
            detail=f"{HEADER} was already used with a different request body or route; "
            "use a new key for a different request"
        )
    if rec.status_code is None or rec.response is None:
        raise Conflict(detail=f"a request with this {HEADER} is still in progress; retry later")
    raise IdempotentReplay(rec.status_code, rec.response)


@asynccontextmanager
async def idempotent(
    request: Request, session: AsyncSession, account: str, ttl_seconds: int
) -> AsyncIterator[Recorder]:
    """Guard one create of `account` (the caller's) by its `Idempotency-Key`, if it has one.

    Wrapped as a FastAPI dependency where the caller is known (`service.auth.deps`).
    """
    recorder = Recorder()
    key = request.headers.get(HEADER)
    if key is None:
        yield recorder
        return
    if not 1 <= len(key) <= 255:
        raise ValidationFailed.of([FieldError(HEADER, "must be 1 to 255 characters")])
    body = await request.body()
    fingerprint = hashlib.sha256(
        request.method.encode() + b" " + request.url.path.encode() + b"\n" + body
    ).hexdigest()
    ttl = timedelta(seconds=ttl_seconds)
    async with _lock_for(account, key):
        rec = await _existing(session, account, key)
        if rec is not None and rec.created_at > utcnow() - ttl:
            _answer(rec, fingerprint)
        await session.execute(
            delete(IdempotencyRecord).where(
                IdempotencyRecord.account_id == account,
                IdempotencyRecord.created_at <= utcnow() - ttl,
            )
        )
        reserved = IdempotencyRecord(account_id=account, key=key, fingerprint=fingerprint)
        session.add(reserved)
        try:
            await session.flush()
        except IntegrityError:
            # Another replica reserved the key first (PostgreSQL waits for its commit).
            await session.rollback()
            rec = await _existing(session, account, key)
            if rec is None:
                raise Conflict(detail=f"concurrent use of {HEADER}; retry") from None
            _answer(rec, fingerprint)
        yield recorder
        if recorder.body is not None:
            reserved.status_code = recorder.status_code
            reserved.response = recorder.body
        await session.commit()
        run_after_commit(session)
