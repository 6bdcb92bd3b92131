"""Opaque keyset cursors over (created_at, id), stable under concurrent inserts."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import Query
from pydantic import BeforeValidator
from sqlalchemy import Select, and_, or_
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from service.core.errors import FieldError, ValidationFailed
from service.core.numbers import natural

MAX_LIMIT = 1000
#: integer ids (compared with a cursor's id) are at most 64-bit, as in PostgreSQL's bigint
_INT64 = range(-(2**63), 2**63)
T = TypeVar("T")


def _ascii_number(value: Any) -> Any:
    """A query's number as ASCII digits only (pydantic alone also reads ' 5', '+5', '1_0')."""
    if isinstance(value, str):
        number = natural(value)
        if number is None:
            raise ValueError("must be a whole number written in ASCII digits")
        return number
    return value


#: the `limit` query parameter of the paginated lists
Limit = Annotated[int | None, Query(ge=1, le=MAX_LIMIT), BeforeValidator(_ascii_number)]


def _bad_cursor() -> ValidationFailed:
    return ValidationFailed.of([FieldError("cursor", "is not a cursor returned by this service")])


@dataclass(frozen=True)
class Page:
    limit: int | None
    after: tuple[datetime, uuid.UUID] | None


def encode_cursor(created_at: datetime, ident: uuid.UUID) -> str:
    raw = json.dumps({"t": created_at.isoformat(), "i": str(ident)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The position a cursor names; 400 for anything this service did not write.

    Cursors come from clients: besides garbage, a valid-looking one may carry a naive time (the
    database layer refuses it), a time that overflows when moved to UTC, or deep JSON."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        t, i = data["t"], data["i"]
        if not isinstance(t, str) or not isinstance(i, str):
            raise _bad_cursor()
        created = datetime.fromisoformat(t)
        if created.tzinfo is None:
            raise _bad_cursor()
        return created.astimezone(UTC), uuid.UUID(i)
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
        raise _bad_cursor() from None


def make_page(limit: int | None, cursor: str | None, default_limit: int = 100) -> Page:
    if limit is None and cursor is None:
        return Page(limit=None, after=None)
    return Page(limit=limit or default_limit, after=decode_cursor(cursor) if cursor else None)


async def keyset_page(
    session: AsyncSession,
    stmt: Select[T],
    page: Page,
    *,
    created: InstrumentedAttribute[datetime],
    ident: InstrumentedAttribute[Any],
    cursor_of: Callable[[T], tuple[datetime, uuid.UUID]],
    ident_from_cursor: Callable[[uuid.UUID], Any] = lambda u: u,
) -> tuple[list[T], str | None]:
    """Run `stmt` ordered by (created, ident), one page at a time when `page` asks for it."""
    if page.after is not None:
        t, i = page.after
        i_value = ident_from_cursor(i)
        if isinstance(i_value, int) and i_value not in _INT64:
            raise _bad_cursor()  # not an id this service hands out: would overflow the query
        stmt = stmt.where(or_(created > t, and_(created == t, ident > i_value)))
    stmt = stmt.order_by(created, ident)
    if page.limit is not None:
        stmt = stmt.limit(page.limit + 1)
    rows = list((await session.execute(stmt)).scalars().all())
    if page.limit is None or len(rows) <= page.limit:
        return rows, None
    rows = rows[: page.limit]
    return rows, encode_cursor(*cursor_of(rows[-1]))
