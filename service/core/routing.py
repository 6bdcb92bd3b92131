"""Mounting routers flat: each route added to the app itself under a prefix.

`include_router` keeps every router as a matcher that each request walks through; with the
routes flat, matching is one regex per route (measured: a third of the CPU of a cached GET).
`mount_flat` must keep every option `include_router` would; tests/core/test_routing.py
compares both on a route that sets them all.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute

_ROUTE_FIELDS = (
    "response_model",
    "status_code",
    "tags",
    "dependencies",
    "summary",
    "description",
    "response_description",
    "responses",
    "deprecated",
    "methods",
    "operation_id",
    "response_model_include",
    "response_model_exclude",
    "response_model_by_alias",
    "response_model_exclude_unset",
    "response_model_exclude_defaults",
    "response_model_exclude_none",
    "include_in_schema",
    "response_class",
    "name",
    "callbacks",
    "openapi_extra",
)


def mount_flat(app: FastAPI, router: APIRouter, prefix: str) -> None:
    """Add a router's routes directly to the app under `prefix`."""
    for route in router.routes:
        if not isinstance(route, APIRoute):
            raise TypeError(f"unsupported route type {type(route).__name__} in {router}")
        # The router's own tags, dependencies and responses are already part of its routes
        # (APIRouter.add_api_route merges them at declaration).
        kwargs = {name: getattr(route, name) for name in _ROUTE_FIELDS}
        app.router.add_api_route(prefix + route.path, route.endpoint, **kwargs)
