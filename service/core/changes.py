"""Change tracking for in-process read caches: which rows a committed transaction touched.

Listeners on every ORM Session collect the primary keys of changed rows of the watched models
(and note bulk UPDATE/DELETE statements, which name no rows) and hand them to subscribers only
after COMMIT; a rollback discards them. Raw SQL bypasses this, so caches keep a short TTL as a
backstop.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session

_KEY = "nvcf_changes"
_subscribers: weakref.WeakSet[Any] = weakref.WeakSet()
_watched: dict[type[Any], str] = {}


def watch(model: type[Any], name: str) -> None:
    """Report changes to rows of `model` under `name`."""
    _watched[model] = name


def subscribe(subscriber: Any) -> None:
    """`subscriber.changed(changes)` is called after each commit that touched watched rows.

    `changes` maps a watched name to the set of changed primary keys, or None for "unknown
    rows" (bulk statements).
    """
    _subscribers.add(subscriber)


def _pending(session: Session) -> dict[str, set[Any] | None]:
    return session.info.setdefault(_KEY, {})  # type: ignore[no-any-return]


@event.listens_for(Session, "after_flush")
def _after_flush(session: Session, _ctx: Any) -> None:
    pending = _pending(session)
    for obj in (*session.new, *session.dirty, *session.deleted):
        name = _watched.get(type(obj))
        if name is None:
            continue
        bucket = pending.setdefault(name, set())
        if bucket is not None:
            bucket.add(getattr(obj, "id", None))


@event.listens_for(Session, "do_orm_execute")
def _bulk(state: ORMExecuteState) -> None:
    if not (state.is_update or state.is_delete):
        return
    mapper = state.bind_mapper
    name = _watched.get(mapper.class_) if mapper is not None else None
    if name is not None:
        _pending(state.session)[name] = None


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    pending = session.info.pop(_KEY, None)
    if not pending:
        return
    for sub in list(_subscribers):
        sub.changed(pending)


@event.listens_for(Session, "after_soft_rollback")
def _after_rollback(session: Session, _previous: Any) -> None:
    session.info.pop(_KEY, None)
