"""Model building blocks shared by every domain: camelCase aliases, UTC timestamps, and the
vocabulary more than one domain accepts (tags, secret names and values)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer
from pydantic.alias_generators import to_camel

from service.core.validation import Expect, MaxItems, matches

TAG_RE = re.compile(r"^[a-zA-Z0-9\-_:=]+$")
SECRET_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
MAX_TAGS = 64
#: characters of a secret's value (a function's secret, a registry credential's secret)
MAX_SECRET_VALUE = 32768


def iso_z(value: datetime) -> str:
    """ISO-8601 UTC with milliseconds and `Z` (`2026-11-29T17:00:00.123Z`)."""
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


# A datetime that is written the way api.md §0 asks for.
Timestamp = Annotated[datetime, PlainSerializer(iso_z, return_type=str)]

Tag = Annotated[
    str,
    Field(min_length=1, max_length=128),
    matches(TAG_RE.pattern, "'{value}' may contain only letters, digits and '-', '_', ':', '='"),
]
Tags = Annotated[list[Tag], MaxItems(MAX_TAGS), Expect((list,), "must be a list of strings")]
