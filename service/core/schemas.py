"""Response-model building blocks shared by every domain: camelCase aliases, UTC timestamps."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, PlainSerializer
from pydantic.alias_generators import to_camel


def iso_z(value: datetime) -> str:
    """ISO-8601 UTC with milliseconds and `Z` (`2026-11-29T17:00:00.123Z`)."""
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


# A datetime that is written the way api.md §0 asks for.
Timestamp = Annotated[datetime, PlainSerializer(iso_z, return_type=str)]
