"""The OpenAPI document tells the truth about errors.

FastAPI documents a 422 that this service never sends (every bad input is a 400
problem+json) and none of the problem+json answers it does send. `truthful` rewrites the
generated document: it drops the 422s, declares the `Problem` schema once, and gives each
operation the statuses the server can really answer it with:

- every operation of the API: 400 (path, query or body), 401, 403 (scope, org), 429 (rate
  limit), 500 and 503 (connection cap, database);
- with path ids: 404, and the ids are `format: uuid` (an account's id is any name);
- with a body (POST, PUT, PATCH): 408 (body timeout), 409 (conflicts, idempotency), 413, 415;
- those that pull charts (helm functions, deployments, the dry-run, creating a task): 502 (an
  upstream failed or timed out).

A property test sends generated requests to every route and fails on any status the document
does not list for it (tests/test_api_properties.py).
"""

from __future__ import annotations

from typing import Any

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details; `errors` lists every violation (at most 100, "
    "`errorsOmitted` counts the rest).",
    "required": ["type", "title", "status", "detail", "instance", "requestId"],
    "properties": {
        "type": {"type": "string", "examples": ["urn:nvcf:problem-details:bad-request"]},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "requestId": {"type": "string", "format": "uuid"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
        "errorsOmitted": {"type": "integer", "minimum": 1},
    },
}

_TEXT = {
    "400": "Invalid path, query or body: every violation listed in `errors`",
    "401": "Missing, unknown, expired or invalid credential",
    "403": "The credential lacks the scope, or the org in the path is another account",
    "404": "No such object for the caller's account",
    "408": "The request body did not arrive in time",
    "409": "Conflicts with the current state, or an Idempotency-Key reused for another body",
    "413": "The request body is too large",
    "415": "The body is not JSON",
    "429": "The account is over its rate limit (see Retry-After)",
    "500": "An unexpected error (quote the requestId)",
    "502": "An upstream (chart registry, token service) failed or did not answer in time",
    "503": "Not available right now (connection cap, database, chart pipeline)",
}
_BODY_METHODS = frozenset({"post", "put", "patch"})
#: path ids that name an account (NVCF's `ncaId`), not a UUID
ACCOUNT_ID_PARAMS = frozenset({"ncaId"})
#: operations that fetch and render charts (their summaries' paths)
_CHART_PATHS = ("/functions", "/deployments/functions/", "/helm/")
#: the same, matched whole (a helm task's create)
_CHART_OPERATIONS = frozenset({"/v1/nvct/tasks"})


def _problem(status: str) -> dict[str, Any]:
    return {
        "description": _TEXT[status],
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }


def truthful(
    schema: dict[str, Any], *, api_prefixes: tuple[str, ...], own_errors: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Rewrite the error responses of `schema` in place (see the module docstring); the
    operations under `own_errors` (the LLM gateway's, in OpenAI's shape) declare theirs."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Problem"] = PROBLEM_SCHEMA
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            if own_errors and path.startswith(own_errors):
                continue
            if path == "/health/ready":
                responses.setdefault("503", _problem("503"))
            if not path.startswith(api_prefixes):
                continue
            statuses = ["400", "401", "403", "429", "500", "503"]
            params = [p for p in operation.get("parameters", []) if p.get("in") == "path"]
            for param in params:
                if param["name"].endswith("Id") and param["name"] not in ACCOUNT_ID_PARAMS:
                    param["schema"] = {**param["schema"], "format": "uuid"}
            if any(p["name"].endswith("Id") for p in params):
                statuses.append("404")
            if method in _BODY_METHODS:
                statuses += ["408", "409", "413", "415"]
                if method == "post" and (
                    path in _CHART_OPERATIONS or any(p in path for p in _CHART_PATHS)
                ):
                    statuses.append("502")
            for status in sorted(statuses):
                responses.setdefault(status, _problem(status))
    return schema
