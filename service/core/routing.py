"""Mounting routers flat: each route added to the app itself under a prefix.

`include_router` keeps every router as a matcher that each request walks through; with the
routes flat, matching is one regex per route (measured: a third of the CPU of a cached GET).
`mount_flat` must keep every option `include_router` would; tests/core/test_routing.py
compares both on a route that sets them all.

A route object holds nothing of the app it is mounted on (the request carries its app), so the
routes flattened from a router under a prefix are built once per process and mounted on every
app built from it: building them is most of the cost of building an app.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

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

#: (id of a router's route, prefix) -> (that route, kept so its id stays its own; the flat one)
_FLAT: dict[tuple[int, str], tuple[APIRoute, BaseRoute]] = {}


def mount_flat(app: FastAPI, router: APIRouter, prefix: str) -> None:
    """Add a router's routes directly to the app under `prefix`. The flat routes take no
    `app.dependency_overrides` (the service sets none)."""
    for route in router.routes:
        if not isinstance(route, APIRoute):
            raise TypeError(f"unsupported route type {type(route).__name__} in {router}")
        app.router.routes.append(_flat(route, prefix))


def _flat(route: APIRoute, prefix: str) -> BaseRoute:
    key = (id(route), prefix)
    if key not in _FLAT:
        # The router's own tags, dependencies and responses are already part of its routes
        # (APIRouter.add_api_route merges them at declaration). Built on a router of no app,
        # so that the route keeps no app alive.
        kwargs = {name: getattr(route, name) for name in _ROUTE_FIELDS}
        builder = APIRouter()
        builder.add_api_route(prefix + route.path, route.endpoint, **kwargs)
        _FLAT[key] = (route, builder.routes[-1])
    return _FLAT[key][1]
