"""Change tracking for in-process read caches: which rows a committed transaction touched.

Listeners on every ORM Session collect the keys of changed rows of the watched models (their
primary key, or what the watch asks for, e.g. the version a deployment belongs to) and note
bulk UPDATE/DELETE statements as "unknown rows", unless the statement names the keys of the
rows it touches (`touching`) or says it writes only bookkeeping no cache reads (`BOOKKEEPING`:
leases, due times); they hand them to subscribers only after COMMIT; a rollback discards them.
Raw SQL bypasses this, so caches keep a short TTL as a backstop.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session

_KEY = "nvcf_changes"
_TOUCHING = "nvcf_touching"
_subscribers: weakref.WeakSet[Any] = weakref.WeakSet()
_watched: dict[type[Any], tuple[str, Callable[[Any], Any]]] = {}


def touching(keys: Iterable[Any]) -> Mapping[str, frozenset[Any]]:
    """Execution options of a bulk statement naming the keys (as its model's watch reports
    them) of the rows it changes: `.execution_options(**touching(keys))`."""
    return MappingProxyType({_TOUCHING: frozenset(keys)})


#: execution options of a bulk statement that writes only columns no cache reads (leases, due
#: times): its commit reports nothing
BOOKKEEPING = touching(())


def _primary_key(row: Any) -> Any:
    return getattr(row, "id", None)


def watch(model: type[Any], name: str, key: Callable[[Any], Any] | None = None) -> None:
    """Report changes to rows of `model` under `name`, each as `key(row)` (default: its id)."""
    _watched[model] = (name, key or _primary_key)


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
        watched = _watched.get(type(obj))
        if watched is None:
            continue
        name, key = watched
        bucket = pending.setdefault(name, set())
        if bucket is not None:
            bucket.add(key(obj))


@event.listens_for(Session, "do_orm_execute")
def _bulk(state: ORMExecuteState) -> None:
    if not (state.is_update or state.is_delete):
        return
    mapper = state.bind_mapper
    watched = _watched.get(mapper.class_) if mapper is not None else None
    if watched is None:
        return
    pending = _pending(state.session)
    keys = state.execution_options.get(_TOUCHING)
    if keys is None:
        pending[watched[0]] = None
    elif keys:
        bucket = pending.setdefault(watched[0], set())
        if bucket is not None:
            bucket.update(keys)


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
