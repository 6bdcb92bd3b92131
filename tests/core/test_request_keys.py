"""Request keys are read ignoring case, as Go clients decode JSON (service/core/validation.py),
and a path starting with `//` is served as with one slash (service/core/middleware.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from service.core.validation import RequestModel, parse
from tests.support.api import CONTAINER_FN, assert_problem

V = "/v2/nvcf"


class Item(RequestModel):
    key: str
    value: str | None = None


class Body(RequestModel):
    inference_url: str
    items: list[Item] | None = None
    inner: Item | None = None
    values: dict[str, Any] | None = None


def test_keys_are_renamed_in_the_body_at_every_declared_level() -> None:
    body: dict[str, Any] = {
        "inferenceURL": "/echo",
        "Items": [{"KEY": "a", "Value": "1"}],
        "INNER": {"kEy": "b"},
        "values": {"KEY": "user data keeps its case"},
        "unknown": 1,
    }
    model, errors = parse(Body, body)
    assert errors == [] and model is not None
    assert model.inference_url == "/echo" and model.items == [Item(key="a", value="1")]
    assert model.inner == Item(key="b")
    # the cross-field pass that reads the body sees the wire names, in the order given
    assert list(body) == ["inferenceUrl", "items", "inner", "values", "unknown"]
    assert body["items"] == [{"key": "a", "value": "1"}]
    assert body["values"] == {"KEY": "user data keeps its case"}


def test_an_exact_key_wins_over_a_folded_one() -> None:
    body = {"inferenceURL": "/folded", "inferenceUrl": "/exact"}
    model, errors = parse(Body, body)
    assert errors == [] and model is not None and model.inference_url == "/exact"


def test_two_folded_keys_for_one_field_are_a_violation_among_the_others() -> None:
    body = {"inferenceURL": "/a", "INFERENCEURL": "/b", "items": [{"Key": 1, "KEY": "x"}]}
    model, errors = parse(Body, body)
    assert model is None
    assert [(e.field, e.message) for e in errors] == [
        (
            "inferenceUrl",
            "is given 2 times in different cases ('inferenceURL', 'INFERENCEURL'); give it once",
        ),
        ("items[0].key", "is given 2 times in different cases ('Key', 'KEY'); give it once"),
    ]


async def test_nvcf_doc_casing_creates_a_function(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        f"{V}/functions",
        json={
            "NAME": "echo",
            "inferenceURL": "/echo",
            "InferencePort": 8000,
            "containerimage": "nvcr.io/acme/echo:1.0",
            "Health": {
                "Protocol": "http",
                "URI": "/ready",
                "Port": 8000,
                "Timeout": "PT5S",
                "ExpectedStatusCode": 200,
            },
            "ContainerEnvironment": [{"Key": "MODE", "Value": "fast"}],
        },
    )
    assert resp.status_code == 200, resp.text
    fn = resp.json()["function"]
    assert fn["name"] == "echo" and fn["inferenceUrl"] == "/echo"
    assert fn["inferencePort"] == 8000 and fn["containerImage"] == "nvcr.io/acme/echo:1.0"
    assert fn["health"]["uri"] == "/ready" and fn["health"]["expectedStatusCode"] == 200
    assert fn["containerEnvironment"] == [{"key": "MODE", "value": "fast"}]


async def test_clashing_keys_are_a_400_listing_them(client: httpx.AsyncClient) -> None:
    body = {**CONTAINER_FN, "inferenceURL": "/x", "INFERENCEurl": "/y"}
    del body["inferenceUrl"]
    problem = assert_problem(await client.post(f"{V}/functions", json=body), 400)
    assert problem["errors"] == [
        {
            "field": "inferenceUrl",
            "message": "is given 2 times in different cases ('inferenceURL', 'INFERENCEurl'); "
            "give it once",
        }
    ]
    assert (await client.get(f"{V}/functions")).json()["functions"] == []


async def test_deployment_keys_in_any_case(client: httpx.AsyncClient) -> None:
    fn = (await client.post(f"{V}/functions", json=CONTAINER_FN)).json()["function"]
    url = f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    spec = {"GPU": "L40", "InstanceType": "DGXC.GPU.L40_1x", "MinInstances": 0, "maxinstances": 1}
    resp = await client.post(url, json={"DeploymentSpecifications": [spec]})
    assert resp.status_code == 200, resp.text
    dep = resp.json()["deployment"]
    (stored,) = dep["deploymentSpecifications"]
    assert (stored["gpu"], stored["minInstances"], stored["maxInstances"]) == ("L40", 0, 1)
    put = await client.put(url, json={"deploymentSpecifications": [{**spec, "maxInstances": 2}]})
    assert put.status_code == 200, put.text  # the exact-case key wins over "maxinstances"
    assert put.json()["deployment"]["deploymentSpecifications"][0]["maxInstances"] == 2
    patch = await client.patch(
        f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{stored['gpuSpecificationId']}",
        json={"MAXINSTANCES": 4},
    )
    assert patch.status_code == 200, patch.text
    assert patch.json()["gpuSpecification"]["maxInstances"] == 4


@pytest.mark.parametrize("prefix", ["//", "///"])
async def test_a_path_starting_with_several_slashes_is_served(
    client: httpx.AsyncClient, prefix: str
) -> None:
    # an absolute URL: a relative "//v2/..." would name a host "v2"
    created = await client.post(f"http://nvcf.test{prefix}v2/nvcf/functions", json=CONTAINER_FN)
    assert created.status_code == 200, created.text
    listed = await client.get(f"http://nvcf.test{prefix}v2/nvcf/functions")
    assert listed.status_code == 200
    assert [f["versionId"] for f in listed.json()["functions"]] == [
        created.json()["function"]["versionId"]
    ]
    aliased = await client.get(f"http://nvcf.test{prefix}v2/orgs/nvcf-default/nvcf/functions/ids")
    assert aliased.json() == {"functionIds": [created.json()["function"]["id"]]}
    missing = assert_problem(await client.get(f"http://nvcf.test{prefix}v2/nvcf/nothing"), 404)
    assert missing["instance"] == "/v2/nvcf/nothing"
