"""Domain errors, rendered once as RFC 7807 problem+json by the app's exception handlers.

Services raise these; routers never build error responses by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: at most this many violations are listed in a problem; the rest are only counted, so that
#: an error stays small however many violations a (large) request carries
MAX_LISTED_ERRORS = 100
#: how much of a problem's `detail` may quote its violations (the rest are in `errors`)
MAX_DETAIL_QUOTE = 3072


@dataclass(frozen=True)
class FieldError:
    """One violation of one field; chart findings also carry rule and object."""

    field: str
    message: str
    rule: str | None = None
    object: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field, "message": self.message}
        if self.rule is not None:
            out["rule"] = self.rule
        if self.object is not None:
            out["object"] = self.object
        return out


@dataclass
class DomainError(Exception):
    """Base of every error a client can cause or observe."""

    detail: str
    errors: list[FieldError] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)

    status = 500
    type_slug = "internal-server-error"
    title = "Internal Server Error"

    def __str__(self) -> str:
        return self.detail


class BadRequest(DomainError):
    status = 400
    type_slug = "bad-request"
    title = "Bad Request"


class ValidationFailed(BadRequest):
    """A request broke one or more rules; `errors` lists every one of them."""

    @classmethod
    def of(cls, errors: list[FieldError], what: str = "request") -> ValidationFailed:
        if len(errors) == 1:
            e = errors[0]
            detail = f"Invalid {what}: {e.field}: {e.message}"
        else:
            listed = errors[:MAX_LISTED_ERRORS]
            quoted = "; ".join(f"{e.field}: {e.message}" for e in listed)
            if len(quoted) > MAX_DETAIL_QUOTE:
                quoted = quoted[: MAX_DETAIL_QUOTE - 1] + "…"
            detail = f"Invalid {what}: {len(errors)} violations: {quoted}"
            if len(errors) > len(listed):
                omitted = len(errors) - len(listed)
                detail += f"; and {omitted} more (first {len(listed)} listed, errorsOmitted)"
        return cls(detail=detail, errors=errors)


class Unauthorized(DomainError):
    status = 401
    type_slug = "unauthorized"
    title = "Unauthorized"


class Forbidden(DomainError):
    status = 403
    type_slug = "forbidden"
    title = "Forbidden"


class NotFound(DomainError):
    status = 404
    type_slug = "not-found"
    title = "Not Found"


class MethodNotAllowed(DomainError):
    status = 405
    type_slug = "method-not-allowed"
    title = "Method Not Allowed"


class RequestTimeout(DomainError):
    status = 408
    type_slug = "request-timeout"
    title = "Request Timeout"


class Conflict(DomainError):
    status = 409
    type_slug = "conflict"
    title = "Conflict"


class PayloadTooLarge(DomainError):
    status = 413
    type_slug = "payload-too-large"
    title = "Payload Too Large"


class UnsupportedMediaType(DomainError):
    status = 415
    type_slug = "unsupported-media-type"
    title = "Unsupported Media Type"


class TooManyRequests(DomainError):
    status = 429
    type_slug = "too-many-requests"
    title = "Too Many Requests"


class BadGateway(DomainError):
    """An upstream (registry, backend) failed; `detail` carries the upstream's reason."""

    status = 502
    type_slug = "bad-gateway"
    title = "Bad Gateway"


class ServiceUnavailable(DomainError):
    status = 503
    type_slug = "service-unavailable"
    title = "Service Unavailable"


class GatewayTimeout(DomainError):
    """An upstream (a function's worker) did not answer in time."""

    status = 504
    type_slug = "gateway-timeout"
    title = "Gateway Timeout"
