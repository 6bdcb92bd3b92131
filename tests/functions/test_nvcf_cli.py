"""Function routes as NVIDIA's nvcf-cli calls them: requests built as its Go client marshals
them (`internal/client`: fields without `omitempty` always sent), responses decoded the way its
structs decode them (tests/support/go_decode.py)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.api import bearer, new_key
from tests.support.go_decode import (
    CREATE_FUNCTION_RESPONSE,
    FUNCTION_DETAILS_WRAPPER,
    GET_FUNCTION_RESPONSE,
    LIST_FUNCTION_IDS_RESPONSE,
    LIST_FUNCTIONS_RESPONSE,
    assert_go_decodes,
    go_decode_errors,
)

V = "/v2/nvcf"

#: `function create` with a JSON file, as `CreateFunctionRequest` marshals it
CLI_CREATE: dict[str, Any] = {
    "name": "advanced-test-function",
    "inferenceUrl": "/echo",
    "containerImage": "nvcr.io/acme/load-tester:0.0.8",
    "inferencePort": 8000,
    "health": {
        "protocol": "HTTP",
        "uri": "/health",
        "port": 8000,
        "timeout": "PT30S",
        "expectedStatusCode": 200,
    },
    "functionType": "DEFAULT",
    "apiBodyFormat": "CUSTOM",
    "containerEnvironment": [{"key": "MODEL_PATH", "value": "/models"}],
    "models": [{"name": "pytorch-model", "version": "1.0.0", "uri": "s3://bucket/model.tgz"}],
    "secrets": [
        {"name": "api-key", "value": "s3cret"},
        {"name": "db", "value": {"user": "u", "password": "p"}},
    ],
    "rateLimit": {"rateLimit": "100-S", "exemptedNcaIds": ["nca-exempt-1"], "syncCheck": True},
    "tags": ["test", "advanced"],
    "description": "Test function with all advanced features",
}


def test_the_decoder_refuses_what_go_refuses() -> None:
    old = {"functions": [{"id": "x", "secrets": [{"name": "api-key"}], "inferencePort": "8000"}]}
    assert go_decode_errors(old, LIST_FUNCTIONS_RESPONSE) == [
        "$.functions[0].secrets[0]: cannot unmarshal object into str",
        "$.functions[0].inferencePort: cannot unmarshal string into int",
    ]
    # names match ignoring case, unknown fields and nulls are fine, an int takes no 1.5
    assert (
        go_decode_errors({"FUNCTIONS": [{"Secrets": None, "x": 1}]}, LIST_FUNCTIONS_RESPONSE) == []
    )
    assert go_decode_errors({"functions": [{"inferencePort": 1.5}]}, LIST_FUNCTIONS_RESPONSE)


async def test_create_list_get_and_versions_decode_as_the_cli_reads_them(
    client: httpx.AsyncClient,
) -> None:
    created = await client.post(f"{V}/functions", json=CLI_CREATE)
    assert created.status_code == 200, created.text
    assert_go_decodes(created.json(), CREATE_FUNCTION_RESPONSE)
    assert_go_decodes(created.json(), FUNCTION_DETAILS_WRAPPER)
    fn = created.json()["function"]
    assert fn["secrets"] == ["api-key", "db"]
    assert fn["rateLimit"] == CLI_CREATE["rateLimit"]

    # a version made with curl from the NVCF docs, with the rates the CLI has no flags for
    curl = {
        **CLI_CREATE,
        "inferenceURL": "/v2",
        "rateLimit": {"perNcaIdRate": {"acme": "5-S"}, "perUserRate": "1-S"},
    }
    del curl["inferenceUrl"]
    second = await client.post(f"{V}/functions/{fn['id']}/versions", json=curl)
    assert second.status_code == 200, second.text
    assert second.json()["function"]["inferenceUrl"] == "/v2"

    listed = await client.get(f"{V}/functions")  # ListFunctions
    assert_go_decodes(listed.json(), LIST_FUNCTIONS_RESPONSE)
    assert [f["secrets"] for f in listed.json()["functions"]] == [["api-key", "db"]] * 2
    ids = await client.get(f"{V}/functions/ids")  # ListFunctionIDs
    assert_go_decodes(ids.json(), LIST_FUNCTION_IDS_RESPONSE)
    versions = await client.get(f"{V}/functions/{fn['id']}/versions")  # ListFunctionVersions
    assert_go_decodes(versions.json(), LIST_FUNCTIONS_RESPONSE)
    assert len(versions.json()["functions"]) == 2
    one = await client.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
    assert_go_decodes(one.json(), FUNCTION_DETAILS_WRAPPER)  # GetFunctionDetails
    assert_go_decodes(one.json(), GET_FUNCTION_RESPONSE)  # GetFunction

    # UpdateFunctionMetadata, DeleteFunction (the CLI wants 200, then 204)
    url = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    updated = await client.put(url, json={"description": "d", "tags": ["t"]})
    assert updated.status_code == 200
    assert_go_decodes(updated.json(), FUNCTION_DETAILS_WRAPPER)
    assert (await client.delete(url)).status_code == 204


async def test_include_secrets_as_nvcf(client: httpx.AsyncClient) -> None:
    fn = (await client.post(f"{V}/functions", json=CLI_CREATE)).json()["function"]
    url = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    assert (await client.get(url)).json()["function"]["secrets"] == ["api-key", "db"]
    assert (await client.get(url, params={"includeSecrets": "true"})).json()["function"][
        "secrets"
    ] == ["api-key", "db"]
    hidden = await client.get(url, params={"includeSecrets": "false"})
    assert hidden.status_code == 200 and "secrets" not in hidden.json()["function"]
    # the cached body with names is not served to a read without them, nor the reverse
    assert (
        "secrets"
        not in (await client.get(url, params={"includeSecrets": "false"})).json()["function"]
    )
    assert (await client.get(url)).json()["function"]["secrets"] == ["api-key", "db"]
    bad = await client.get(url, params={"includeSecrets": "maybe"})
    assert bad.status_code == 400
    assert [e["field"] for e in bad.json()["errors"]] == ["includeSecrets"]


async def test_secret_names_show_without_the_details_scope(client: httpx.AsyncClient) -> None:
    fn = (await client.post(f"{V}/functions", json=CLI_CREATE)).json()["function"]
    plain = bearer(await new_key(client, ["list_functions"]))
    one = await client.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}", headers=plain)
    assert one.json()["function"]["secrets"] == ["api-key", "db"]
    assert "activeInstances" not in one.json()["function"]
