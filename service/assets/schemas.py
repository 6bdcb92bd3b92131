"""Request and response shapes of the asset routes, as NVCF's (CreateAssetRequest,
CreateAssetResponse, AssetResponse, ListAssetsResponse, AssetRedirectResponse)."""

from __future__ import annotations

import uuid
from typing import Annotated

from pydantic import Field

from service.assets.models import CONTENT_TYPE_MAX, DESCRIPTION_MAX
from service.core.schemas import CamelModel, Timestamp
from service.core.validation import RequestModel, matches

#: NVCF's check of a content type (S3PreSignedUrlGenerator): `type/subtype`, no parameters
CONTENT_TYPE_RE = r"^\w+/[-+.\w]+$"

ContentType = Annotated[
    str,
    Field(min_length=3, max_length=CONTENT_TYPE_MAX, examples=["image/png"]),
    matches(
        CONTENT_TYPE_RE,
        "'{value}' must be a media type 'type/subtype' such as image/png, without parameters",
    ),
]


class CreateAssetRequest(RequestModel):
    content_type: ContentType = Field(description="Media type of the asset, e.g. image/png.")
    description: str = Field(max_length=DESCRIPTION_MAX, description="Asset description.")


class CreateAssetResponse(CamelModel):
    asset_id: uuid.UUID
    upload_url: str = Field(
        description="Pre-signed URL: PUT the file's bytes to it (no API key), e.g. "
        "`curl -T FILE URL`, before it expires"
    )
    content_type: str
    description: str


class AssetOut(CamelModel):
    asset_id: uuid.UUID
    description: str | None = None
    content_type: str | None = None
    created_at: Timestamp | None = None


class AssetResponse(CamelModel):
    asset: AssetOut


class ListAssetsResponse(CamelModel):
    assets: list[AssetOut]


class AssetRedirectResponse(CamelModel):
    presigned_url: str = Field(
        description="Pre-signed URL: GET it (no API key) to download the asset before it expires"
    )
