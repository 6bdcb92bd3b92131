"""Database engine, declarative base and the per-request transaction.

The schema comes only from Alembic migrations (`migrations/`); models here describe it.

On SQLite, the process's write transactions take turns through a FIFO gate (`WriteGate`)
before they ask SQLite for its single write lock, so a request never polls for that lock
against the reconciler (SQLite's busy handler sleeps with a growing back-off and serves no one
in order: a deploy could wait seconds while later writers went first).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import DateTime, MetaData, Select, String, TypeDecorator, event
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase, ORMExecuteState, Session
from starlette.requests import Request

from service.core.components import Component

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both databases (SQLite hands back naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class UUIDStr(TypeDecorator[uuid.UUID]):
    """UUIDs stored as 36-character strings, identical on SQLite and PostgreSQL."""

    impl = String(36)
    cache_ok = True

    def process_bind_param(self, value: uuid.UUID | str | None, dialect: Dialect) -> str | None:
        return None if value is None else str(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> uuid.UUID | None:
        return None if value is None else uuid.UUID(value)


def utcnow() -> datetime:
    return datetime.now(UTC)


#: SQLite's wait for its write lock, and the gate's (seconds)
SQLITE_LOCK_TIMEOUT = 30.0
#: the statements before which the sqlite3 module opens a transaction (its `is_dml`)
_DML = re.compile(r"\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)
_GATE_HELD = "nvcf_write_gate"
#: the execution option of a read whose rows the transaction goes on to change (`for_update`)
WRITE_LOCK = "nvcf_write_lock"

SelectT = TypeVar("SelectT", bound=Select[Any])


def for_update(stmt: SelectT, *, share: bool = False, skip_locked: bool = False) -> SelectT:
    """`stmt` reading rows the transaction goes on to change, so that two writers cannot both
    act on what they read before the other's change: on PostgreSQL the rows stay locked until
    the transaction ends, on SQLite the read waits for the process's write gate (its reads take
    no lock), and rows the session already holds are read afresh rather than kept as loaded.
    `share`: rows the transaction relies on staying as read (`FOR SHARE`: other such readers
    do not wait for each other, a writer of the rows waits for them all). `skip_locked`: rows
    another transaction holds are left out on PostgreSQL (SQLite's gate still waits)."""
    return stmt.with_for_update(read=share, skip_locked=skip_locked).execution_options(
        populate_existing=True, **{WRITE_LOCK: True}
    )


class WriteGate:
    """One SQLite write transaction at a time per process, granted in arrival order.

    A connection takes the gate just before the statement that makes the sqlite3 module open
    its transaction (the first INSERT/UPDATE/DELETE/REPLACE; reads before it take nothing, as
    in WAL they never wait for the writer), or before a read marked `for_update`, and gives it
    back when it returns to the pool, after
    its COMMIT or ROLLBACK. Waiting past the SQLite lock timeout fails like SQLite would.
    """

    def __init__(self, timeout: float = SQLITE_LOCK_TIMEOUT) -> None:
        self.timeout = timeout
        #: write transactions waiting for their turn
        self.waiting = 0
        #: one lock per event loop (an engine may outlive the loop of a test or a CLI step)
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    async def acquire(self) -> asyncio.Lock:
        """Wait for the gate; the lock to release it with."""
        lock = self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        self.waiting += 1
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
            # arrives as the lock is granted (a stopping reconciler would then run on)
            async with asyncio.timeout(self.timeout):
                await lock.acquire()
        except TimeoutError:
            raise sqlite3.OperationalError("database is locked") from None
        finally:
            self.waiting -= 1
        return lock

    def install(self, engine: AsyncEngine) -> None:
        """Gate every write transaction of `engine`'s connections."""

        @event.listens_for(engine.sync_engine, "before_cursor_execute")
        def _take(
            conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool
        ) -> None:
            pooled = conn.connection
            if _GATE_HELD in pooled.info:
                return
            if not (_DML.match(statement) or context.execution_options.get(WRITE_LOCK)):
                return
            pooled.info[_GATE_HELD] = pooled.dbapi_connection.run_async(
                lambda _driver: self.acquire()
            )

        @event.listens_for(engine.sync_engine, "checkin")
        @event.listens_for(engine.sync_engine, "invalidate")
        def _give_back(_dbapi_conn: Any, record: Any, *_: Any) -> None:
            lock = record.info.pop(_GATE_HELD, None)
            if lock is not None:
                lock.release()


def make_engine(url: str, *, write_gate: WriteGate | None = None) -> AsyncEngine:
    """The engine of `url`; on SQLite, its write transactions take turns at `write_gate` (a
    gate of its own by default)."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": SQLITE_LOCK_TIMEOUT}
        # Sessions always end in an explicit COMMIT or ROLLBACK, and read-only SQLite work
        # opens no transaction, so the pool's reset (one more thread hop per request) is waste.
        kwargs["pool_reset_on_return"] = None
    else:
        kwargs.update(pool_size=10, max_overflow=10, pool_pre_ping=True)
    engine = create_async_engine(url, **kwargs)
    if url.startswith("sqlite"):

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        (write_gate or WriteGate()).install(engine)
    return engine


#: PostgreSQL's answers to transactions that met each other: deadlock_detected,
#: serialization_failure, lock_not_available (a lock or statement timeout)
_CONTENTION_STATES = frozenset({"40P01", "40001", "55P03"})


def is_contention(exc: DBAPIError) -> bool:
    """True when `exc` says only that another transaction was in the way (a deadlock, a
    serialization failure, a lock wait that timed out; SQLite's "database is locked"): the
    transaction was rolled back whole and the same request may succeed when sent again."""
    orig = exc.orig
    if isinstance(orig, sqlite3.OperationalError):
        return "database is locked" in str(orig) or "database table is locked" in str(orig)
    return getattr(orig, "sqlstate", None) in _CONTENTION_STATES


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False, autoflush=False)


AFTER_COMMIT = "nvcf_after_commit"
_WROTE = "nvcf_wrote"


@event.listens_for(Session, "after_flush")
def _note_flush(session: Session, _ctx: Any) -> None:
    session.info[_WROTE] = True


@event.listens_for(Session, "do_orm_execute")
def _note_bulk_write(state: ORMExecuteState) -> None:
    if state.is_update or state.is_delete:
        state.session.info[_WROTE] = True


@event.listens_for(Session, "after_commit")
@event.listens_for(Session, "after_soft_rollback")
def _forget_writes(session: Session, *_: Any) -> None:
    session.info.pop(_WROTE, None)


def mark_written(session: Session) -> None:
    """Note a write the ORM does not see (e.g. rows buffered for a bulk insert at commit)."""
    session.info[_WROTE] = True


def wrote(session: Session) -> bool:
    """True when the session flushed or ran a bulk write since its last commit (or has
    pending changes): the request transaction then has something to commit."""
    return bool(session.info.get(_WROTE)) or bool(session.new or session.dirty or session.deleted)


def after_commit(session: AsyncSession, callback: Callable[[], None]) -> None:
    """Run `callback` once the request's transaction has committed (e.g. wake the reconciler)."""
    session.info.setdefault(AFTER_COMMIT, []).append(callback)


def run_after_commit(session: AsyncSession) -> None:
    for callback in session.info.pop(AFTER_COMMIT, []):
        callback()


#: the process's sessions (the composition makes them at start)
SESSIONMAKER = Component[async_sessionmaker[AsyncSession]]("sessionmaker")


async def request_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One transaction per request: committed when the handler returns, rolled back on error.

    Used with `Depends(..., scope="function")` so the commit happens before the response is
    sent and a failed commit is reported to the client.
    """
    async with SESSIONMAKER.of(request)() as session:
        try:
            yield session
        except BaseException:
            await session.rollback()
            raise
        else:
            if wrote(session.sync_session) or session.info.get(AFTER_COMMIT):
                await session.commit()
            else:
                await session.rollback()
            run_after_commit(session)
