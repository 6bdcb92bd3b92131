"""The committed OpenAPI document must match the code (regenerate with `make openapi`)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "openapi" / "openapi.json"


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
            if not path.startswith("/v2/nvcf"):
                continue
            for status in ("400", "401", "403", "429"):
                content = responses[status]["content"]
                assert content == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                }, (method, path, status)
            for param in op.get("parameters", []):
                if param["in"] == "path" and param["name"].endswith("Id"):
                    assert param["schema"]["format"] == "uuid", (path, param["name"])
                    assert "404" in responses
            if method in ("post", "put", "patch"):
                assert "requestBody" in op, (method, path)
                assert {"413", "415"} <= set(responses), (method, path)
    schemas = doc["components"]["schemas"]
    assert schemas["FunctionMetadataUpdate"]["minProperties"] == 1
    key_body = doc["paths"]["/v2/nvcf/api-keys"]["post"]["requestBody"]
    assert key_body["content"]["application/json"]["schema"]["required"] == ["scopes"]
