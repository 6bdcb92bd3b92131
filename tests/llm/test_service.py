"""`GET /v1/models`'s list (service/llm/service.py): the models of the LLM functions a caller
may invoke — its own, those shared with it, within what its key is limited to — once each,
on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

from service.auth.service import Principal
from service.llm.service import list_models
from tests.support.api import bearer, create_fn, new_key
from tests.support.app import AppClient

V = "/v2/nvcf"


def llm_fn(*names: str) -> dict[str, Any]:
    return {
        "name": "llm",
        "inferenceUrl": "/",
        "containerImage": "nvcr.io/example/openai-compatible:latest",
        "functionType": "LLM",
        "models": [{"name": n, "llmConfig": {"uris": ["/v1/chat/completions"]}} for n in names],
    }


def caller(account: str = "nvcf-default", functions: set[str] | None = None) -> Principal:
    return Principal(
        account_id=account,
        scopes=frozenset({"invoke_function"}),
        kind="api-key",
        subject="tester",
        functions=None if functions is None else frozenset(uuid.UUID(f) for f in functions),
    )


async def models_of(client: AppClient, principal: Principal) -> dict[str, Any]:
    async with client.app.state.sessionmaker() as session:
        return await list_models(session, principal)


async def test_models_the_caller_may_use_are_listed_once(client: AppClient) -> None:
    own = await create_fn(client, **llm_fn("chat", "meta/llama-3"))
    # a second version declaring one more model
    resp = await client.post(
        f"{V}/functions/{own['id']}/versions", json=llm_fn("chat", "meta/llama-3", "extra")
    )
    assert resp.status_code == 200, resp.text
    await create_fn(client)  # not an LLM function: not listed
    other_key = await new_key(client, ["register_function", "authorize_clients"], "other")
    shared = (
        await client.post(f"{V}/functions", json=llm_fn("shared-model"), headers=bearer(other_key))
    ).json()["function"]
    hidden = (
        await client.post(f"{V}/functions", json=llm_fn("secret-model"), headers=bearer(other_key))
    ).json()["function"]
    resp = await client.post(
        f"{V}/authorizations/functions/{shared['id']}",
        json={"authorizedParties": [{"ncaId": "nvcf-default"}]},
        headers=bearer(other_key),
    )
    assert resp.status_code == 200, resp.text

    listed = await models_of(client, caller())
    assert listed["object"] == "list"
    ids = [m["id"] for m in listed["data"]]
    assert ids == [
        f"{own['id']}/chat",
        f"{own['id']}/meta/llama-3",
        f"{own['id']}/extra",
        f"{shared['id']}/shared-model",
    ]
    first = listed["data"][0]
    assert first["object"] == "model" and first["owned_by"] == "nvcf-default"
    assert isinstance(first["created"], int)
    assert listed["data"][3]["owned_by"] == "other"
    assert all(hidden["id"] not in i for i in ids)

    limited = await models_of(client, caller(functions={shared["id"]}))
    assert [m["id"] for m in limited["data"]] == [f"{shared['id']}/shared-model"]
    assert (await models_of(client, caller("nobody")))["data"] == []
