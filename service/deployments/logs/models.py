"""`instance_last_logs`: the last lines of a failed instance's containers, kept with its
failure so that "why did it fail" is answered after the instance was torn down.

One row per failed instance (its id; no foreign key: the row outlives the instance row, as the
deployment's timeline does); `containers` is a list of `{pod, container, previous, lines}`,
secret values already masked. Deleted with the deployment's history (history purge) or when
the instance row is trimmed from the failed history.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from service.core.db import Base, UTCDateTime, UUIDStr


class KeptLog(Base):
    __tablename__ = "instance_last_logs"

    instance_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    deployment_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), index=True)
    account_id: Mapped[str] = mapped_column(String(128))
    captured_at: Mapped[datetime] = mapped_column(UTCDateTime())
    containers: Mapped[list[Any]] = mapped_column(JSON, default=list)
