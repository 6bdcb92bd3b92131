"""Errors of the LLM gateway in OpenAI's shape: `{"error": {"message", "type", "param",
"code"}}` with OpenAI's status codes, because OpenAI clients parse that shape (the `openai`
package raises `AuthenticationError`, `NotFoundError`, `RateLimitError`… from the status and
reads `error.message`/`code`/`param`), and NVCF's top-level `"message"` beside it (NVCF's
gateway answers `{"message": ...}`), so that clients of either shape read the text. The rest
of the API stays problem+json.

Every error the gateway can meet is either an `OpenAIError` raised by the gateway itself or a
`DomainError` of the platform (admission, the engine), translated by `from_domain`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from starlette.responses import Response

from service.core.errors import DomainError, FieldError

#: OpenAI's `error.type` per status
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "timeout_error",
}
#: OpenAI's `error.code` where the status alone says it
_CODES = {
    401: "invalid_api_key",
    403: "permission_denied",
    413: "request_too_large",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
    504: "timeout",
}
#: a message longer than this is cut (a worker's or a problem's text)
MAX_MESSAGE = 4096


@dataclass
class OpenAIError(Exception):
    """An error answered in OpenAI's shape."""

    status: int
    message: str
    type: str | None = None
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, object]:
        message = self.message
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        return {
            "error": {
                "message": message,
                "type": self.type or _TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code if self.code is not None else _CODES.get(self.status),
            },
            "message": message,
        }

    def response(self, request_id: str | None = None) -> Response:
        headers = dict(self.headers)
        if request_id:
            headers.setdefault("x-request-id", request_id)
        return Response(
            json.dumps(self.body(), separators=(",", ":")),
            status_code=self.status,
            media_type="application/json",
            headers=headers,
        )


def invalid(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    """A 400 about the request body (`param`: the field, as OpenAI names it)."""
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str, why: str | None = None) -> OpenAIError:
    """OpenAI's 404 for a model the caller may not use (unknown, not shared, not LLM)."""
    message = f"The model `{model}` does not exist or you do not have access to it."
    if why:
        message += f" {why}"
    return OpenAIError(404, message, param="model", code="model_not_found")


def _param(errors: list[FieldError]) -> str | None:
    if not errors:
        return None
    first = errors[0].field
    return None if first == "body" else first


def from_domain(error: DomainError) -> OpenAIError:
    """A platform error (admission, rate limits, the engine) in OpenAI's shape; its headers
    (`Retry-After`) are kept."""
    status = error.status if error.status in _TYPES else 500
    message = error.detail
    if error.errors and len(error.errors) > 1:
        listed = "; ".join(f"{e.field}: {e.message}" for e in error.errors)
        message = f"{message} ({listed})" if listed not in message else message
    return OpenAIError(
        status=status,
        message=message,
        param=_param(error.errors),
        headers=dict(error.headers),
    )
