"""How the Kubernetes adapter reports failures: every API-server or network failure becomes a
`KubernetesError` (an `AdapterError`) whose message is the server's own (the `Status` object's
`message`), retryable or not."""

from __future__ import annotations

import httpx2
from lightkube import ApiError

from service.backends.protocol import (
    AdapterError,
)


class KubernetesError(AdapterError):
    """An API-server or connection failure; `reason` is the Status reason (`Forbidden`…)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        reason: str = "",
        operation: str = "",
    ) -> None:
        super().__init__(message, retryable=retryable, status=status)
        self.reason = reason
        self.operation = operation


def is_retryable(code: int, reason: str, message: str) -> bool:
    """Whether repeating a request that failed with this Status can succeed later."""
    lowered = message.lower()
    if code == 403:
        # Quotas free up and terminating namespaces go away; RBAC denials need an admin.
        return "exceeded quota" in lowered or "being terminated" in lowered
    return code not in (400, 401, 404, 405, 406, 415, 422)


def translate(exc: Exception, operation: str, cluster: str, server: str) -> KubernetesError:
    if isinstance(exc, ApiError):
        status = exc.status
        code = int(status.code or exc.response.status_code)
        message = status.message or f"{code} {exc.response.reason_phrase}"
        reason = status.reason or ""
        return KubernetesError(
            message,
            retryable=is_retryable(code, reason, message),
            status=code,
            reason=reason,
            operation=operation,
        )
    if isinstance(exc, httpx2.HTTPStatusError):
        code = exc.response.status_code
        text = exc.response.text.strip()[:500] or exc.response.reason_phrase
        return KubernetesError(
            f"{code} {text}",
            retryable=code >= 500 or code in (408, 409, 429),
            status=code,
            operation=operation,
        )
    if isinstance(exc, httpx2.TimeoutException):
        return KubernetesError(
            f"timed out waiting for the Kubernetes API server of cluster {cluster} ({server}) "
            f"while {operation}",
            retryable=True,
            reason="Timeout",
            operation=operation,
        )
    if isinstance(exc, httpx2.TransportError):
        detail = str(exc) or type(exc).__name__
        return KubernetesError(
            f"cannot reach the Kubernetes API server of cluster {cluster} ({server}) while "
            f"{operation}: {detail}",
            retryable=True,
            reason="Unreachable",
            operation=operation,
        )
    return KubernetesError(
        f"unexpected response from the Kubernetes API server of cluster {cluster} while "
        f"{operation}: {exc}",
        retryable=True,
        operation=operation,
    )


CAUGHT = (httpx2.HTTPError, ValueError, KeyError, TypeError)
