"""The committed OpenAPI document must match the code (regenerate with `make openapi`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_committed_openapi_is_current() -> None:
    spec = importlib.util.spec_from_file_location(
        "export_openapi", ROOT / "scripts" / "export_openapi.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (ROOT / "openapi" / "openapi.json").read_text()
    assert committed == module.render(), "openapi/openapi.json is stale: run `make openapi`"


def test_openapi_documents_the_request_bodies() -> None:
    import json

    doc = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    post = doc["paths"]["/v2/nvcf/functions"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/FunctionCreate"
    )
    assert "FunctionCreate" in doc["components"]["schemas"]
