"""Accounts and API keys as stored: a key is kept only as its SHA-256 hash."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.core.db import Base, UTCDateTime, UUIDStr, utcnow


class Account(Base):
    __tablename__ = "accounts"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    #: NVCF's `name` and `adminClientIds` (None: the id, and none)
    name: Mapped[str | None] = mapped_column(String(256))
    admin_client_ids: Mapped[list[Any] | None] = mapped_column(JSON)
    #: the limits set for this account, by name (limits.py); a missing one is the setting's
    limits: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: why the operator suspended the account (None: active)
    suspended_reason: Mapped[str | None] = mapped_column(Text)
    suspended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True, default=uuid.uuid4)
    account_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("accounts.id", ondelete="CASCADE"), index=True
    )
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(32))
    scopes: Mapped[list[Any]] = mapped_column(JSON)
    description: Mapped[str | None] = mapped_column(String(256))
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    #: the function ids the key is limited to (None: every function of its account)
    functions: Mapped[list[Any] | None] = mapped_column(JSON)
    #: NVCF's `authorizations` (policies) as the key was created through `POST /v1/keys`
    authorizations: Mapped[dict[str, Any] | None] = mapped_column(JSON)
