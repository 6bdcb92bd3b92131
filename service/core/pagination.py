"""Opaque keyset cursors over (created_at, id), stable under concurrent inserts."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from service.core.errors import FieldError, ValidationFailed

MAX_LIMIT = 1000


@dataclass(frozen=True)
class Page:
    limit: int | None
    after: tuple[datetime, uuid.UUID] | None

    @property
    def paginated(self) -> bool:
        return self.limit is not None or self.after is not None


def encode_cursor(created_at: datetime, ident: uuid.UUID) -> str:
    raw = json.dumps({"t": created_at.isoformat(), "i": str(ident)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        return datetime.fromisoformat(data["t"]), uuid.UUID(data["i"])
    except (ValueError, KeyError, TypeError):
        raise ValidationFailed.of(
            [FieldError("cursor", "is not a cursor returned by this service")]
        ) from None


def make_page(limit: int | None, cursor: str | None, default_limit: int = 100) -> Page:
    if limit is None and cursor is None:
        return Page(limit=None, after=None)
    return Page(limit=limit or default_limit, after=decode_cursor(cursor) if cursor else None)
