"""Signed URLs of the local store: HMAC-SHA256 over the method, the object key, the expiry,
the byte limit of an upload and the content type of a download, so a URL is good for exactly
one operation on one object until its expiry, and needs no API key.

The key is derived from the server's secrets key (`SecretBox.derive`), the same on every
replica that shares it; signatures are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import urlencode

PURPOSE = "asset-url-signing"
#: the route prefix of the local store's signed URLs (service/assets/router.py)
STORAGE_PREFIX = "/storage"


@dataclass(frozen=True, slots=True)
class Grant:
    """What a signed URL allows: `method` on the object `key` until `expires` (Unix time);
    an upload of at most `max_bytes`; a download served as `content_type`."""

    method: str
    key: str
    expires: int
    max_bytes: int | None = None
    content_type: str | None = None

    def message(self) -> bytes:
        parts = (
            self.method,
            self.key,
            str(self.expires),
            "" if self.max_bytes is None else str(self.max_bytes),
            self.content_type or "",
        )
        return "\n".join(parts).encode()


class Signer:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def signature(self, grant: Grant) -> str:
        return hmac.new(self._key, grant.message(), hashlib.sha256).hexdigest()

    def url(self, base_url: str, grant: Grant) -> str:
        query: dict[str, str] = {"expires": str(grant.expires)}
        if grant.max_bytes is not None:
            query["maxBytes"] = str(grant.max_bytes)
        if grant.content_type is not None:
            query["contentType"] = grant.content_type
        query["signature"] = self.signature(grant)
        return f"{base_url.rstrip('/')}{STORAGE_PREFIX}/{grant.key}?{urlencode(query)}"

    def verify(self, grant: Grant, signature: str) -> bool:
        return hmac.compare_digest(self.signature(grant), signature)
