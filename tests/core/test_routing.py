"""mount_flat keeps every route option include_router would (service/core/routing.py)."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from service.core.routing import mount_flat


class Item(BaseModel):
    name: str
    secret: str | None = None


async def router_dependency(request: Request) -> None:
    request.state.seen = [*getattr(request.state, "seen", []), "router"]


async def route_dependency(request: Request) -> None:
    request.state.seen = [*getattr(request.state, "seen", []), "route"]


def build_router() -> APIRouter:
    router = APIRouter(
        tags=["outer"],
        dependencies=[Depends(router_dependency)],
        responses={404: {"description": "router-level not found"}},
    )

    @router.post(
        "/items/{itemId}",
        response_model=Item,
        status_code=201,
        tags=["inner"],
        dependencies=[Depends(route_dependency)],
        summary="Make an item",
        description="Longer words.",
        response_description="The item",
        responses={409: {"description": "conflict"}},
        deprecated=True,
        operation_id="makeItem",
        response_model_exclude={"secret"},
        response_model_exclude_none=True,
        openapi_extra={"x-extra": 1},
    )
    async def make_item(itemId: str, request: Request) -> dict[str, Any]:
        return {"name": f"{itemId}:{','.join(request.state.seen)}", "secret": "s"}

    @router.get("/hidden", include_in_schema=False, response_class=PlainTextResponse)
    async def hidden() -> str:
        return "plain"

    return router


def apps() -> tuple[FastAPI, FastAPI]:
    included, flat = FastAPI(), FastAPI()
    included.include_router(build_router(), prefix="/v2")
    mount_flat(flat, build_router(), "/v2")
    return included, flat


def test_the_openapi_document_is_the_same() -> None:
    included, flat = apps()
    assert flat.openapi() == included.openapi()


async def test_requests_behave_the_same() -> None:
    answers = []
    for app in apps():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as client:
            made = await client.post("/v2/items/a")
            hidden = await client.get("/v2/hidden")
            answers.append(
                (made.status_code, made.json(), hidden.status_code, hidden.headers["content-type"])
            )
    assert answers[0] == answers[1]
    assert answers[0][:2] == (201, {"name": "a:router,route"})


async def test_apps_mounting_the_same_router_each_answer_as_their_own_app() -> None:
    router = APIRouter()

    @router.get("/name")
    async def name(request: Request) -> dict[str, str]:
        return {"app": request.app.title}

    answers = []
    for title in ("first", "second"):
        app = FastAPI(title=title)
        mount_flat(app, router, "/v2")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as client:
            answers.append((await client.get("/v2/name")).json())
        assert app.openapi()["paths"]["/v2/name"]["get"]["operationId"] == "name_v2_name_get"
    assert answers == [{"app": "first"}, {"app": "second"}]
