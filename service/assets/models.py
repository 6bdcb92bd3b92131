"""An asset as stored: the account's metadata row; the bytes are an object of the store.

`size_bytes` is None until the upload is confirmed: the store is asked (HEAD) the first time
the asset is referenced or downloaded, so a half-finished upload is never used.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from service.core.db import Base, UTCDateTime, UUIDStr

CONTENT_TYPE_MAX = 255
DESCRIPTION_MAX = 1024


class Asset(Base):
    __tablename__ = "assets"
    __table_args__ = (
        Index("ix_assets_account_created", "account_id", "created_at", "id"),
        Index("ix_assets_expires", "expires_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    account_id: Mapped[str] = mapped_column(String(128))
    content_type: Mapped[str] = mapped_column(String(CONTENT_TYPE_MAX))
    description: Mapped[str] = mapped_column(String(DESCRIPTION_MAX))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    #: None until the store has the whole object (confirmed by a HEAD)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger())
    uploaded_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    @property
    def key(self) -> str:
        return object_key(self.id)


def object_key(asset_id: uuid.UUID) -> str:
    """The asset's object in the store."""
    return f"assets/{asset_id}"


def result_key(request_id: uuid.UUID) -> str:
    """A large result's object in the store."""
    return f"results/{request_id}"
