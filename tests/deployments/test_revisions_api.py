"""The revision fields of the GPU specification PATCH, the revisions list and rollback, as a
client sees them when the request is refused (every violation listed, nothing changed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.api import create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.charts import PushCorpus
from tests.support.e2e import V, dep_url, deployment
from tests.support.helm_e2e import deploy as deploy_helm
from tests.support.helm_e2e import setup, spec
from tests.support.registry import RegistryServer

L40 = {"gpu": "L40", "backend": "nvcf-default", "minInstances": 1, "maxInstances": 2}


def spec_url(dep: dict[str, Any]) -> str:
    sid = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    return f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{sid}"


async def test_a_container_function_has_no_configuration_to_change(api: AppClient) -> None:
    fn = await create_fn(api)
    resp = await api.post(dep_url(fn), json={"deploymentSpecifications": [L40]})
    assert resp.status_code == 200, resp.text
    dep = resp.json()["deployment"]
    gs = dep["deploymentSpecifications"][0]
    assert (gs["revision"], gs["targetRevision"]) == (1, 1)
    assert "rollout" not in gs

    resp = await api.patch(
        spec_url(dep),
        json={
            "configuration": {"replicaCount": 2},
            "helmValidationPolicy": {"name": "Unrestricted"},
            "minInstances": 3,
        },
    )
    assert resp.status_code == 400, resp.text
    fields = [e["field"] for e in resp.json()["errors"]]
    assert sorted(fields) == ["configuration", "helmValidationPolicy", "minInstances"]
    assert "only for helm functions" in resp.json()["errors"][0]["message"]

    empty = await api.patch(spec_url(dep), json={})
    assert empty.status_code == 400 and "configuration" in empty.json()["detail"]
    bad_shape = await api.patch(spec_url(dep), json={"configuration": ["not", "a", "map"]})
    assert bad_shape.status_code == 400
    assert {e["field"] for e in bad_shape.json()["errors"]} == {"configuration"}

    after = await deployment(api, fn)
    assert after["deploymentSpecifications"][0]["minInstances"] == 1
    revisions = (await api.get(spec_url(dep) + "/revisions")).json()["revisions"]
    assert len(revisions) == 1
    [first] = revisions
    assert (first["revision"], first["current"], first["target"]) == (1, True, True)
    assert first["createdBy"].startswith("api-key:")
    assert "nvapi-" not in str(revisions)

    # the target already: nothing changes; an unknown revision: 404
    same = await api.post(spec_url(dep) + "/revisions/1/rollback")
    assert same.status_code == 200 and same.json()["gpuSpecification"]["targetRevision"] == 1
    assert (await api.post(spec_url(dep) + "/revisions/2/rollback")).status_code == 404
    zero = await api.post(spec_url(dep) + "/revisions/0/rollback")
    assert zero.status_code == 400
    # what str.isdigit() or int() accept: ², ①, a fullwidth 1, a sign, 4,301 digits
    for bad in ("%C2%B2", "%E2%91%A0", "%EF%BC%91", "%2B1", "1_0", "9" * 4301):
        refused = await api.post(spec_url(dep) + f"/revisions/{bad}/rollback")
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.json()["errors"][0]["field"] == "revision"

    # another account sees none of it
    other = await api.get(f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/x/revisions")
    assert other.status_code == 400  # not a UUID


@pytest.mark.registry
async def test_a_bad_configuration_and_scaling_are_refused_together(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client, [fn] = await setup(client_factory, tmp_path, anon_registry, push_corpus)
    dep = await deploy_helm(client, fn, spec({"image": {"tag": "1.0"}}))
    resp = await client.patch(
        spec_url(dep),
        json={"configuration": {"service": {"type": "NodePort"}}, "maxInstances": 900},
    )
    assert resp.status_code == 400, resp.text
    errors = resp.json()["errors"]
    assert [e["field"] for e in errors] == ["maxInstances", "configuration"]
    assert errors[1]["rule"] == "service-type"
    after = await deployment(client, fn)
    gs = after["deploymentSpecifications"][0]
    assert (gs["maxInstances"], gs["targetRevision"]) == (1, 1)
    assert gs["configuration"] == {"image": {"tag": "1.0"}}

    # the same configuration again makes no revision
    same = await client.patch(spec_url(dep), json={"configuration": {"image": {"tag": "1.0"}}})
    assert same.status_code == 200
    assert same.json()["gpuSpecification"]["targetRevision"] == 1
