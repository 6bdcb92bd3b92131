"""LLM functions over HTTP (issue 28): created, returned and changed as NVCF does, on SQLite and
PostgreSQL; the mutable model settings and llmInvocationConfig are one per function."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.api import CONTAINER_FN, assert_problem, create_fn
from tests.support.telemetries import create_telemetry

V = "/v2/nvcf"
CHAT = "/v1/chat/completions"
URIS = [CHAT, "/v1/responses", "/v1/embeddings"]
LLM: dict[str, Any] = {
    "name": "sample-llm-function",
    "inferenceUrl": "/",
    "inferencePort": 8000,
    "containerImage": "nvcr.io/example/openai-compatible:latest",
    "functionType": "LLM",
    "models": [
        {
            "name": "dummy-model",
            "llmConfig": {
                "uris": URIS,
                "routingMethod": "power_of_two",
                "tokenRateLimit": "1000-S",
            },
        },
        {"name": "embedder", "llmConfig": {"uris": ["/v1/embeddings"], "tokenizer": "bert"}},
    ],
    "llmInvocationConfig": {"priority": {"defaultPriority": 3}},
}


def models_of(fn: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m.get("llmConfig", {}) for m in fn["models"]}


async def version(client: httpx.AsyncClient, fid: str, vid: str) -> dict[str, Any]:
    resp = await client.get(f"{V}/functions/{fid}/versions/{vid}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["function"])


async def test_llm_function_is_returned_as_nvcf_returns_it(client: httpx.AsyncClient) -> None:
    telemetries = {"metricsTelemetryId": (await create_telemetry(client))["telemetryId"]}
    fn = await create_fn(client, **LLM, telemetries=telemetries)
    assert fn["functionType"] == "LLM"
    assert fn["models"] == LLM["models"]  # no version/uri, llmConfig as given
    assert fn["llmInvocationConfig"] == {"priority": {"defaultPriority": 3}}
    assert fn["telemetries"] == telemetries
    assert await version(client, fn["id"], fn["versionId"]) == {**fn, "activeInstances": []}
    # another function's models keep name, version and uri, and have no llmConfig
    other = await create_fn(
        client, models=[{"name": "resnet", "version": "1", "uri": "ngc://resnet:1"}]
    )
    assert other["models"] == [{"name": "resnet", "version": "1", "uri": "ngc://resnet:1"}]
    assert "llmInvocationConfig" not in other


async def test_invalid_llm_function_lists_every_violation_and_stores_nothing(
    client: httpx.AsyncClient,
) -> None:
    body = {
        **LLM,
        "models": [{"name": "m", "llmConfig": {"uris": [], "tokenRateLimit": "1-S,1-S"}}],
        "llmInvocationConfig": {"priority": {"defaultPriority": -1}},
    }
    problem = assert_problem(await client.post(f"{V}/functions", json=body), 400)
    fields = [e["field"] for e in problem["errors"]]
    assert fields == [
        "models[0].llmConfig.uris",
        "models[0].llmConfig.tokenRateLimit",
        "llmInvocationConfig.priority.defaultPriority",
    ]
    assert (await client.get(f"{V}/functions")).json()["functions"] == []


async def test_model_updates_change_every_version_in_place(client: httpx.AsyncClient) -> None:
    first = await create_fn(client, **LLM)
    fid = first["id"]
    resp = await client.post(
        f"{V}/functions/{fid}/versions", json={**LLM, "llmInvocationConfig": None}
    )
    assert resp.status_code == 200, resp.text
    second = resp.json()["function"]
    # an omitted llmInvocationConfig is the function's
    assert second["llmInvocationConfig"] == {"priority": {"defaultPriority": 3}}

    resp = await client.put(
        f"{V}/functions/{fid}/versions/{second['versionId']}",
        json={
            "modelUpdates": [
                {"modelName": "dummy-model", "llmConfig": {"tokenRateLimit": "50-S,900-M"}},
                {"modelName": "embedder", "llmConfig": {"routingMethod": "round_robin"}},
            ],
            "llmInvocationConfig": {"priority": {"defaultPriority": 0}},
        },
    )
    assert resp.status_code == 200, resp.text
    for vid in (first["versionId"], second["versionId"]):
        got = await version(client, fid, vid)
        models = models_of(got)
        assert models["dummy-model"]["tokenRateLimit"] == "50-S,900-M"
        assert models["dummy-model"]["routingMethod"] == "power_of_two"  # kept
        assert models["embedder"] == {
            "uris": ["/v1/embeddings"],
            "tokenizer": "bert",
            "routingMethod": "round_robin",
        }
        assert got["llmInvocationConfig"] == {"priority": {"defaultPriority": 0}}
        assert got["versionId"] == vid  # no new version


async def test_new_version_sets_mutable_fields_everywhere_and_keeps_uris(
    client: httpx.AsyncClient,
) -> None:
    first = await create_fn(client, **LLM)
    fid = first["id"]
    changed = [
        {"name": "dummy-model", "llmConfig": {"uris": URIS, "routingMethod": "random"}},
        {"name": "embedder", "llmConfig": {"uris": [CHAT], "tokenizer": "other"}},
    ]
    problem = assert_problem(
        await client.post(f"{V}/functions/{fid}/versions", json={**LLM, "models": changed}), 400
    )
    assert [e["field"] for e in problem["errors"]] == [
        "models[1].llmConfig.uris",
        "models[1].llmConfig.tokenizer",
    ]
    assert (
        models_of(await version(client, fid, first["versionId"]))["dummy-model"]["routingMethod"]
        == "power_of_two"
    )  # the refused version changed nothing

    changed[1] = LLM["models"][1]
    resp = await client.post(f"{V}/functions/{fid}/versions", json={**LLM, "models": changed})
    assert resp.status_code == 200, resp.text
    first_now = models_of(await version(client, fid, first["versionId"]))
    assert first_now["dummy-model"]["routingMethod"] == "random"
    assert first_now["dummy-model"]["tokenRateLimit"] == "1000-S"  # not given: kept

    not_llm = {**CONTAINER_FN}
    problem = assert_problem(await client.post(f"{V}/functions/{fid}/versions", json=not_llm), 400)
    assert problem["errors"][0]["field"] == "functionType"


async def test_model_updates_of_unknown_models_or_other_functions_are_refused(
    client: httpx.AsyncClient,
) -> None:
    fn = await create_fn(client, **LLM)
    url = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    problem = assert_problem(
        await client.put(
            url,
            json={
                "modelUpdates": [
                    {"modelName": "dummy-model", "llmConfig": {"routingMethod": "random"}},
                    {"modelName": "ghost", "llmConfig": {"routingMethod": "random"}},
                ]
            },
        ),
        404,
    )
    assert [e["field"] for e in problem["errors"]] == ["modelUpdates[1].modelName"]
    got = models_of(await version(client, fn["id"], fn["versionId"]))
    assert got["dummy-model"]["routingMethod"] == "power_of_two"  # nothing changed

    plain = await create_fn(client)
    problem = assert_problem(
        await client.put(
            f"{V}/functions/{plain['id']}/versions/{plain['versionId']}",
            json={
                "modelUpdates": [{"modelName": "m", "llmConfig": {"tokenRateLimit": "5-S"}}],
                "llmInvocationConfig": {},
            },
        ),
        400,
    )
    assert [e["field"] for e in problem["errors"]] == [
        "modelUpdates",
        "llmInvocationConfig",
    ]
