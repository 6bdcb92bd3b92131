"""NVCF's autoscalingConfiguration and autoscalingConfigurationPolicy on PATCH and the
deprecated PUT of a GPU specification: stored and shown, every violation listed in one 400,
nothing changed by a refused body."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings

from service.core.errors import ValidationFailed
from service.deployments.schemas import GpuSpecificationPatch
from service.deployments.validation import StoredSpec, validate_patch
from tests.support.app import AppClient
from tests.support.e2e import V, dep_url, deployment
from tests.support.invocation import FAST, deployed, spec, write_catalog
from tests.support.strategies import from_json_schema

CUSTOM = {
    "scaleUpDetails": {
        "factor": 1.5,
        "threshold": 75,
        "stickiness": {"size": "PT10M", "threshold": "PT3M"},
    },
    "scaleDownDetails": {"factor": 0.5, "threshold": 25, "metric": "utilization"},
}


#: the API tests share the module's app (one per database), each on functions of its own
shared_app = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def module_settings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    catalog = write_catalog(tmp_path_factory.mktemp("catalog"), gpus=64)
    return {"clusters_file": catalog, **FAST, "autoscale_enabled": False}


@pytest.fixture
def client(module_client: AppClient) -> AppClient:
    return module_client


def spec_url(fn: dict[str, Any]) -> str:
    dep = fn["deployment"]
    gsid = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    return f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{gsid}"


@shared_app
async def test_patch_stores_and_shows_a_custom_configuration(client: AppClient) -> None:
    fn = await deployed(client, specs=[spec(minInstances=1, maxInstances=3)])
    shown = fn["deployment"]["deploymentSpecifications"][0]
    assert shown["autoscalingConfigurationPolicy"] == "PLATFORM_CONFIGURATION"
    assert "autoscalingConfiguration" not in shown
    assert shown["targetInstances"] == 1

    resp = await client.patch(spec_url(fn), json={"autoscalingConfiguration": CUSTOM})
    assert resp.status_code == 200, resp.text
    out = resp.json()["gpuSpecification"]
    assert out["autoscalingConfigurationPolicy"] == "CUSTOM_CONFIGURATION"
    assert out["autoscalingConfiguration"] == CUSTOM
    again = (await deployment(client, fn))["deploymentSpecifications"][0]
    assert again["autoscalingConfiguration"] == CUSTOM

    events = await client.get(f"{V}/deployments/{fn['deployment']['deploymentId']}/events")
    scaling = [e["message"] for e in events.json()["events"] if e["kind"] == "scaling"]
    assert any(
        "autoscalingConfigurationPolicy PLATFORM_CONFIGURATION → CUSTOM_CONFIGURATION "
        "(×1.5 above 75 %, ×0.5 below 25 %)" in m
        for m in scaling
    ), scaling

    # with min/max in the same body; then back to the platform's policy
    resp = await client.patch(
        spec_url(fn),
        json={"maxInstances": 2, "autoscalingConfigurationPolicy": "PLATFORM_CONFIGURATION"},
    )
    assert resp.status_code == 200, resp.text
    out = resp.json()["gpuSpecification"]
    assert out["maxInstances"] == 2
    assert out["autoscalingConfigurationPolicy"] == "PLATFORM_CONFIGURATION"
    assert "autoscalingConfiguration" not in out


@shared_app
async def test_custom_policy_alone_needs_a_stored_configuration(client: AppClient) -> None:
    fn = await deployed(client, specs=[spec(minInstances=1, maxInstances=3)])
    policy = {"autoscalingConfigurationPolicy": "CUSTOM_CONFIGURATION"}
    resp = await client.patch(spec_url(fn), json=policy)
    assert resp.status_code == 400
    assert [e["field"] for e in resp.json()["errors"]] == ["autoscalingConfiguration"]
    assert (await client.patch(spec_url(fn), json={"autoscalingConfiguration": CUSTOM})).is_success
    resp = await client.patch(spec_url(fn), json=policy)  # the stored one stays in force
    assert resp.status_code == 200
    assert resp.json()["gpuSpecification"]["autoscalingConfiguration"] == CUSTOM


@shared_app
async def test_every_violation_is_listed_and_nothing_changes(client: AppClient) -> None:
    fn = await deployed(client, specs=[spec(minInstances=1, maxInstances=3)])
    before = await deployment(client, fn)
    body = {
        "minInstances": 5,
        "autoscalingConfigurationPolicy": "SOMETIMES",
        "autoscalingConfiguration": {
            "scaleUpDetails": {
                "factor": 1.0,
                "threshold": 101,
                "stickiness": {"size": "PT2H", "threshold": "soon"},
            },
            "scaleDownDetails": {"factor": 1.5, "stickiness": {"size": "PT5M"}},
        },
    }
    resp = await client.patch(spec_url(fn), json=body)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    fields = sorted(e["field"] for e in resp.json()["errors"])
    assert fields == [
        "autoscalingConfiguration.scaleDownDetails.factor",
        "autoscalingConfiguration.scaleDownDetails.stickiness.threshold",
        "autoscalingConfiguration.scaleDownDetails.threshold",
        "autoscalingConfiguration.scaleUpDetails.factor",
        "autoscalingConfiguration.scaleUpDetails.stickiness.threshold",
        "autoscalingConfiguration.scaleUpDetails.threshold",
        "autoscalingConfigurationPolicy",
    ], resp.json()["errors"]
    assert await deployment(client, fn) == before


@pytest.mark.parametrize(
    ("config", "field", "words"),
    [
        (
            {
                "scaleUpDetails": {"factor": 2, "threshold": 20},
                "scaleDownDetails": CUSTOM["scaleDownDetails"],
            },
            "autoscalingConfiguration.scaleUpDetails",
            "must be above the scaleDownDetails threshold (25)",
        ),
        (
            {
                "scaleUpDetails": {
                    "factor": 2,
                    "threshold": 80,
                    "stickiness": {"size": "PT2H", "threshold": "PT1M"},
                }
            },
            "autoscalingConfiguration.scaleUpDetails.stickiness.size",
            "at most PT1H",
        ),
        (
            {
                "scaleDownDetails": {
                    "factor": 0.5,
                    "threshold": 20,
                    "stickiness": {"size": "PT5M", "threshold": "PT5M"},
                }
            },
            "autoscalingConfiguration.scaleDownDetails.stickiness.threshold",
            "shorter than size",
        ),
        (
            {"scaleUpDetails": {"factor": "fast", "threshold": 80}},
            "autoscalingConfiguration.scaleUpDetails.factor",
            "must be a number",
        ),
        ("up", "autoscalingConfiguration", "must be an object"),
    ],
)
@shared_app
async def test_configuration_rules(client: AppClient, config: Any, field: str, words: str) -> None:
    fn = await deployed(client, specs=[spec(minInstances=1, maxInstances=3)])
    resp = await client.patch(spec_url(fn), json={"autoscalingConfiguration": config})
    assert resp.status_code == 400, resp.text
    errors = {e["field"]: e["message"] for e in resp.json()["errors"]}
    assert words in errors[field], errors


@shared_app
async def test_platform_policy_with_a_configuration_is_a_contradiction(
    client: AppClient,
) -> None:
    fn = await deployed(client, specs=[spec(minInstances=1, maxInstances=3)])
    resp = await client.patch(
        spec_url(fn),
        json={
            "autoscalingConfigurationPolicy": "PLATFORM_CONFIGURATION",
            "autoscalingConfiguration": CUSTOM,
        },
    )
    assert resp.status_code == 400
    assert "discards the custom configuration" in resp.json()["errors"][0]["message"]


@shared_app
async def test_an_empty_patch_names_every_field_it_could_have(client: AppClient) -> None:
    fn = await deployed(client, specs=[spec(minInstances=1, maxInstances=3)])
    resp = await client.patch(spec_url(fn), json={})
    assert resp.status_code == 400
    message = resp.json()["errors"][0]["message"]
    assert "autoscalingConfiguration" in message and "minInstances" in message


@shared_app
async def test_the_deprecated_put_accepts_the_configuration(client: AppClient) -> None:
    fn = await deployed(client, specs=[spec(minInstances=1, maxInstances=3)])
    body = {
        "deploymentSpecifications": [
            {**spec(minInstances=1, maxInstances=3), "autoscalingConfiguration": CUSTOM}
        ]
    }
    resp = await client.put(dep_url(fn), json=body)
    assert resp.status_code == 200, resp.text
    shown = resp.json()["deployment"]["deploymentSpecifications"][0]
    assert shown["autoscalingConfigurationPolicy"] == "CUSTOM_CONFIGURATION"
    assert shown["autoscalingConfiguration"] == CUSTOM
    bad = {
        "deploymentSpecifications": [
            {**spec(), "autoscalingConfiguration": {"scaleUpDetails": {"factor": 0.5}}}
        ]
    }
    resp = await client.put(dep_url(fn), json=bad)
    assert resp.status_code == 400
    assert sorted(e["field"] for e in resp.json()["errors"]) == [
        "deploymentSpecifications[0].autoscalingConfiguration.scaleUpDetails.factor",
        "deploymentSpecifications[0].autoscalingConfiguration.scaleUpDetails.threshold",
    ]


_PATCH_SCHEMA = GpuSpecificationPatch.model_json_schema(
    by_alias=True, ref_template="#/components/schemas/{model}"
)
_STORED = StoredSpec(
    id=uuid.UUID(int=1), min_instances=1, max_instances=3, max_request_concurrency=1, fixed={}
)


@settings(max_examples=300, deadline=None)
@given(from_json_schema(_PATCH_SCHEMA, _PATCH_SCHEMA.get("$defs", {})))
def test_any_patch_body_is_a_change_or_a_listed_violation(body: Any) -> None:
    """Whatever the body, a PATCH is either accepted or refused with field violations — no
    other error escapes the validation."""
    try:
        change = validate_patch(body, _STORED)
    except ValidationFailed as exc:
        assert exc.errors
        return
    if change.autoscaling is not None:
        policy, config = change.autoscaling
        assert policy in ("CUSTOM_CONFIGURATION", "PLATFORM_CONFIGURATION")
        assert (config is None) == (policy == "PLATFORM_CONFIGURATION")
