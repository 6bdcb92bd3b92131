"""The committed OpenAPI document must match the code (regenerate with `make openapi`)."""

from __future__ import annotations

import json
from pathlib import Path

from service.functions.llm_config import EMBEDDINGS
from service.llm.routing import MODELS, PREFIX, ROUTES
from service.llm.schemas import REQUESTS
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "openapi" / "openapi.json"
LLM = "/v2/nvcf/llm/"
OPENAI_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/OpenAIError"}}}


def test_committed_openapi_is_current() -> None:
    module = load_script("export_openapi")
    committed = (ROOT / "openapi" / "openapi.json").read_text()
    assert committed == module.render(), "openapi/openapi.json is stale: run `make openapi`"


def test_openapi_documents_the_request_bodies() -> None:
    doc = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    post = doc["paths"]["/v2/nvcf/functions"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/FunctionCreate"
    )
    assert "FunctionCreate" in doc["components"]["schemas"]


def test_the_document_declares_the_errors_the_server_sends() -> None:
    """No 422 (never sent); every API operation lists its problem+json statuses; path ids are
    UUIDs; every body that the routes read is declared; updates need at least one field."""
    doc = json.loads(COMMITTED.read_text())
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            responses = op["responses"]
            assert "422" not in responses, (method, path)
            if not path.startswith("/v2/nvcf") or path.startswith(LLM):
                continue
            for status in ("400", "401", "403", "429"):
                content = responses[status]["content"]
                assert content == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                }, (method, path, status)
            for param in op.get("parameters", []):
                if param["in"] == "path" and param["name"].endswith("Id"):
                    uuid = param["name"] != "ncaId"  # an account's id is any name
                    assert (param["schema"].get("format") == "uuid") == uuid, (path, param)
                    assert "404" in responses
            if method in ("post", "put", "patch"):
                assert "requestBody" in op, (method, path)
                assert {"413", "415"} <= set(responses), (method, path)
    schemas = doc["components"]["schemas"]
    assert schemas["FunctionMetadataUpdate"]["minProperties"] == 1
    key_body = doc["paths"]["/v2/nvcf/api-keys"]["post"]["requestBody"]
    assert key_body["content"]["application/json"]["schema"]["required"] == ["scopes"]


def test_the_llm_gateways_routes_are_documented_with_openai_errors() -> None:
    """Every route of the gateway, under its prefix, with the body it checks; its errors in
    OpenAI's shape (those answered before the gateway, also problem+json)."""
    doc = json.loads(COMMITTED.read_text())
    documented = {
        (method.upper(), path.removeprefix(PREFIX))
        for path, ops in doc["paths"].items()
        if path.startswith(LLM)
        for method in ops
    }
    assert documented == {(method, path) for path, method in ROUTES.items()}
    schemas = doc["components"]["schemas"]
    assert schemas["OpenAIError"]["required"] == ["error", "message"]
    for path, kind in REQUESTS.items():
        op = doc["paths"][PREFIX + path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{kind.__name__}"
        assert {"model"} <= set(schemas[kind.__name__]["required"])
        responses = op["responses"]
        for status in ("400", "401", "403", "404", "413", "429", "502", "504"):
            assert responses[status]["content"] == OPENAI_ERROR, (path, status)
        for status in ("500", "503"):
            assert set(responses[status]["content"]) == {
                "application/json",
                "application/problem+json",
            }
        assert "415" not in responses and "409" not in responses  # never answered
        streams = "text/event-stream" in responses["200"]["content"]
        assert streams == (path != EMBEDDINGS), path
    models = doc["paths"][PREFIX + MODELS]["get"]["responses"]
    ref = models["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/ModelList"
    assert models["401"]["content"] == OPENAI_ERROR
