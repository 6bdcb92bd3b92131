"""The REST API as `nvcf` calls it: one `httpx.Client` per command, problem+json errors
turned into `ApiError` with every listed violation, a connection failure into `Unreachable`."""

from __future__ import annotations

import contextlib
import ssl
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from service.client_cli.config import Profile

V = "/v2/nvcf"
USER_AGENT = "nvcf-server-cli/0.1"
#: a 429 (the request was refused before it did anything) is retried this many times
RATE_LIMIT_RETRIES = 3
MAX_RETRY_AFTER = 10.0


@dataclass
class ApiError(Exception):
    """A response of 400 or more: the problem's fields when it is problem+json."""

    status: int
    title: str
    detail: str = ""
    errors: list[tuple[str, str]] = field(default_factory=list)
    errors_omitted: int = 0
    request_id: str | None = None

    def __str__(self) -> str:
        return f"{self.status} {self.title}: {self.detail}" if self.detail else self.title

    @classmethod
    def of(cls, resp: httpx.Response) -> ApiError:
        try:
            body = resp.json()
        except ValueError:
            body = None
        request_id = resp.headers.get("x-request-id")
        if not isinstance(body, dict):
            text = resp.text.strip()[:500]
            return cls(resp.status_code, resp.reason_phrase or "error", text, [], 0, request_id)
        errors = [
            (str(e.get("field", "")), str(e.get("message", "")))
            for e in body.get("errors") or []
            if isinstance(e, dict)
        ]
        omitted = body.get("errorsOmitted")
        return cls(
            status=resp.status_code,
            title=str(body.get("title") or resp.reason_phrase or "error"),
            detail=str(body.get("detail") or body.get("message") or ""),
            errors=errors,
            errors_omitted=omitted if isinstance(omitted, int) else 0,
            request_id=str(body.get("requestId") or request_id or "") or None,
        )


class Unreachable(Exception):
    """The server could not be reached (connection refused, DNS, TLS, timeout)."""


class Api:
    """Calls of one command against one server."""

    def __init__(self, profile: Profile, *, timeout: float = 60.0) -> None:
        verify: ssl.SSLContext | bool = True
        if profile.ca_cert:
            verify = ssl.create_default_context(cafile=profile.ca_cert)
        self.url = profile.url.rstrip("/")
        self.verify = verify
        self._client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {profile.api_key}", "User-Agent": USER_AGENT},
            timeout=timeout,
            verify=verify,
        )

    def __enter__(self) -> Api:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._client.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        idempotent_create: bool = False,
    ) -> Any:
        """The decoded JSON body (None for an empty one); `ApiError` for a status of 400 or
        more. `idempotent_create` sends an Idempotency-Key, so a retried create is one."""
        headers = {"Idempotency-Key": str(uuid.uuid4())} if idempotent_create else {}
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            try:
                resp = self._client.request(method, path, json=json, params=params, headers=headers)
            except httpx.HTTPError as exc:
                raise Unreachable(f"cannot reach {self.url}: {exc}") from None
            if resp.status_code == 429 and attempt < RATE_LIMIT_RETRIES:
                time.sleep(_retry_after(resp))
                continue
            break
        if resp.status_code >= 400:
            raise ApiError.of(resp)
        if resp.status_code == 204 or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise ApiError(resp.status_code, "not JSON", resp.text[:500]) from None


def stream_lines(api: Api, path: str, params: dict[str, Any]) -> Iterator[str]:
    """The lines of a text answer as they arrive (a followed log: no read timeout);
    `ApiError` for a refusal."""
    timeout = httpx.Timeout(api._client.timeout.connect, read=None)
    try:
        with api._client.stream("GET", path, params=params, timeout=timeout) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise ApiError.of(resp)
            yield from resp.iter_lines()
    except httpx.HTTPError as exc:
        raise Unreachable(f"cannot reach {api.url}: {exc}") from None


@contextlib.contextmanager
def post_stream(api: Api, path: str, body: Any) -> Iterator[httpx.Response]:
    """A POST whose answer is read as it arrives (no read timeout), any status."""
    timeout = httpx.Timeout(api._client.timeout.connect, read=None)
    try:
        with api._client.stream("POST", path, json=body, timeout=timeout) as resp:
            yield resp
    except httpx.HTTPError as exc:
        raise Unreachable(f"cannot reach {api.url}: {exc}") from None


def raw_request(
    api: Api, method: str, path: str, *, content: bytes, headers: dict[str, str]
) -> httpx.Response:
    """A call whose answer is not the API's JSON (a function's own answer): any status."""
    try:
        return api._client.request(method, path, content=content, headers=headers)
    except httpx.HTTPError as exc:
        raise Unreachable(f"cannot reach {api.url}: {exc}") from None


def signed_transfer(api: Api, method: str, url: str, path: Path) -> int:
    """PUT the file `path` to a pre-signed URL, or GET one into `path` (streamed, never
    held in memory); the bytes moved. The URL is its own credential: the API key is never
    sent with it (it may point at an object store). `ApiError` for a refusal."""
    verify = api.verify
    try:
        with httpx.Client(timeout=httpx.Timeout(60.0, read=None), verify=verify) as plain:
            if method == "PUT":
                size = path.stat().st_size
                with path.open("rb") as fh:
                    resp = plain.put(url, content=fh, headers={"Content-Length": str(size)})
                if resp.status_code >= 400:
                    raise ApiError.of(resp)
                return size
            moved = 0
            with plain.stream("GET", url, follow_redirects=True) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise ApiError.of(resp)
                with path.open("wb") as out:
                    for chunk in resp.iter_bytes():
                        out.write(chunk)
                        moved += len(chunk)
            return moved
    except httpx.HTTPError as exc:
        raise Unreachable(f"cannot reach the signed URL's server: {exc}") from None


def _retry_after(resp: httpx.Response) -> float:
    try:
        return min(max(float(resp.headers.get("retry-after", "1")), 0.1), MAX_RETRY_AFTER)
    except ValueError:
        return 1.0
