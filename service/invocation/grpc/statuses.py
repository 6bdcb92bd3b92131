"""The gRPC status of every refusal and failure the engine reports (a `DomainError` at
admission, a `Finished` outcome after it), by the HTTP-like status both carry, but for two
NVCF words its own way: a version that cannot be invoked (`not_invocable`) and no worker in
time (`NO_WORKER`). A worker's own statuses pass through unchanged and never meet these.
"""

from __future__ import annotations

import uuid

import grpc

from service.invocation.routing import NotInvocable

#: engine status -> gRPC status code
STATUS_CODES: dict[int, grpc.StatusCode] = {
    # an HTTP function called over gRPC: the caller must change something else first
    400: grpc.StatusCode.FAILED_PRECONDITION,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # the function's rate limit, a full queue
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    # the worker could not be reached (twice) or failed before the call was open
    502: grpc.StatusCode.UNAVAILABLE,
    # the replica is stopping (no instance in time is `NO_WORKER`)
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(status: int) -> grpc.StatusCode:
    """The gRPC code of an engine status (INTERNAL for one the table does not know)."""
    return STATUS_CODES.get(status, grpc.StatusCode.INTERNAL)


#: no instance took the call in time: NVCF's proxy's status when no worker linked up
NO_WORKER = (grpc.StatusCode.DEADLINE_EXCEEDED, "failed to establish link to worker")


def not_invocable(
    exc: NotInvocable, function_id: uuid.UUID, version_id: uuid.UUID | None, account: str
) -> tuple[grpc.StatusCode, str]:
    """A version that cannot be invoked, as NVCF's API answers its proxy's `AuthStatefulWork`
    (`FunctionInvocationValidationService`, its gRPC advice mapping 404 and 400) and the
    proxy passes it on ("failed to open stateful work request: <the API's status>")."""
    if exc.degraded:
        code, name = grpc.StatusCode.INVALID_ARGUMENT, "InvalidArgument"
        message = f"Function id '{function_id}': DEGRADED function cannot be invoked"
    else:
        code, name = grpc.StatusCode.NOT_FOUND, "NotFound"
        version = "null" if version_id is None else version_id  # as Java formats a null
        message = (
            f"Function id '{function_id}' version '{version}': Specified function in "
            f"account '{account}' is not found"
        )
    return code, f"failed to open stateful work request: rpc error: code = {name} desc = {message}"
