"""Deployment routes as NVIDIA's nvcf-cli calls them (`deploy`, `deploy update`, `undeploy`,
`function get` while it deploys): requests as its Go client marshals them, responses decoded
the way its structs decode them (tests/support/go_decode.py)."""

from __future__ import annotations

import uuid

from service.core.db import utcnow
from service.deployments.models import Instance
from tests.support.api import CONTAINER_FN, create_fn
from tests.support.app import AppClient
from tests.support.go_decode import (
    CLUSTER_GROUPS_RESPONSE,
    DEPLOYMENT_RESPONSE,
    FUNCTION_DETAILS_WRAPPER,
    GET_FUNCTION_RESPONSE,
    LIST_FUNCTIONS_RESPONSE,
    UPDATE_GPU_SPECIFICATION_RESPONSE,
    assert_go_decodes,
)

V = "/v2/nvcf"


async def test_deploy_read_scale_and_undeploy_as_the_cli_does(api: AppClient) -> None:
    groups = await api.get(f"{V}/clusterGroups")  # `cluster list`, to pick gpu and type
    assert_go_decodes(groups.json(), CLUSTER_GROUPS_RESPONSE)
    fn = await create_fn(api, **CONTAINER_FN)
    url = f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    # DeployFunction: GPUSpecificationDto, gpu/instanceType/min/max always sent
    body = {
        "deploymentSpecifications": [
            {
                "gpu": "L40",
                "instanceType": "DGXC.GPU.L40_1x",
                "minInstances": 1,
                "maxInstances": 2,
                "maxRequestConcurrency": 10,
            }
        ]
    }
    deployed = await api.post(url, json=body)
    assert deployed.status_code == 200, deployed.text

    got = await api.get(url)  # GetDeployment
    assert_go_decodes(got.json(), DEPLOYMENT_RESPONSE)
    dep = got.json()["deployment"]
    # `deploy update` finds the spec by gpu and instanceType as given, then PATCHes it
    (spec,) = [
        s
        for s in dep["deploymentSpecifications"]
        if s["gpu"] == "L40" and s["instanceType"] == "DGXC.GPU.L40_1x"
    ]
    patched = await api.patch(
        f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{spec['gpuSpecificationId']}",
        json={"maxInstances": 3},
    )
    assert patched.status_code == 200, patched.text
    assert_go_decodes(patched.json(), UPDATE_GPU_SPECIFICATION_RESPONSE)

    # `function get` while it deploys, with a running instance
    async with api.app.state.sessionmaker() as session, session.begin():
        session.add(
            Instance(
                id=uuid.uuid4(),
                deployment_id=uuid.UUID(dep["deploymentId"]),
                spec_id=uuid.UUID(spec["gpuSpecificationId"]),
                account_id="nvcf-default",
                cluster="sim-dgxc",
                phase="Running",
                since=utcnow(),
            )
        )
    one = await api.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
    assert_go_decodes(one.json(), GET_FUNCTION_RESPONSE)
    assert_go_decodes(one.json(), FUNCTION_DETAILS_WRAPPER)
    assert one.json()["function"]["activeInstances"][0]["instanceStatus"] == "RUNNING"
    assert_go_decodes((await api.get(f"{V}/functions")).json(), LIST_FUNCTIONS_RESPONSE)

    # DeleteDeployment: the CLI wants a 200
    undeployed = await api.delete(url, params={"graceful": "true"})
    assert undeployed.status_code == 200, undeployed.text
    assert_go_decodes(undeployed.json(), FUNCTION_DETAILS_WRAPPER)
