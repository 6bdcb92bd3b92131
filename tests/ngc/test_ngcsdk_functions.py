"""ngcsdk's `cloud_function.functions` and `.deployments` over the org-scoped paths
(`/v2/orgs/{org}/nvcf/...`): create → list → info → deploy → update → delete, each request as
ngcsdk 4.37 sends it (recorded against this server; tests/support/ngcsdk.py), each answer read
the way its code reads it."""

from __future__ import annotations

import time

import jwt
import pytest

from tests.support.api import bearer, new_key
from tests.support.app import JWT_SECRET, AppClient
from tests.support.ngcsdk import (
    AuthenticationException,
    NgcSdk,
    ResourceNotFoundException,
    Sent,
    spec_from_dict,
)

SCOPES = [
    "register_function",
    "list_functions",
    "list_functions_details",
    "update_function",
    "delete_function",
    "deploy_function",
]
#: `functions.create(name="echo", inference_url="/echo", inference_port=8000,
#: container_image="nvcr.io/acme/echo:1.0")`, as ngcsdk builds the body
CREATE_BODY = {
    "name": "echo",
    "inferenceUrl": "/echo",
    "inferencePort": 8000,
    "functionType": "DEFAULT",
    "containerImage": "nvcr.io/acme/echo:1.0",
}
#: `TargetedDeploymentSpecification.from_str("L40S:DGXC.GPU.L40S_1x:1:1").to_dict()`
SPEC = {
    "gpu": "L40S",
    "minInstances": 1,
    "maxInstances": 1,
    "instanceType": "DGXC.GPU.L40S_1x",
    "maxRequestConcurrency": 1,
    "preferredOrder": 1,
}
CALLER = Sent("POST", "/v3/keys/get-caller-info", 200)


async def configured(client: AppClient) -> NgcSdk:
    key = await new_key(client, SCOPES, account="acme")
    sdk = NgcSdk(client)
    await sdk.configure(api_key=key, org_name="acme")
    sdk.sent.clear()
    return sdk


async def test_create_list_info_deploy_update_delete(client: AppClient) -> None:
    sdk = await configured(client)
    fns = "/v2/orgs/acme/nvcf/functions"

    # functions.create: validate, image look-up (403: go on), POST
    created = await sdk.create_function(CREATE_BODY)
    fn = created.function
    fid, vid = fn.id, fn.versionId
    assert isinstance(fid, str) and isinstance(vid, str)
    assert fn.name == "echo" and fn.status == "INACTIVE" and fn.ncaId == "acme"
    assert fn.containerImage == "nvcr.io/acme/echo:1.0" and fn.functionType == "DEFAULT"
    assert sdk.sent == [
        CALLER,
        Sent("GET", "/v2/org/acme/repos/echo/images/1.0", 403),
        Sent("POST", fns, 200),
    ]

    # functions.list (DotDict: response.functions), and with a function id
    listed = await sdk.list_functions()
    assert [(f.id, f.versionId) for f in listed.functions] == [(fid, vid)]
    versions = await sdk.list_functions(function_id=fid)
    assert [f.versionId for f in versions.functions] == [vid]

    # functions.info
    info = await sdk.info(fid, vid)
    assert info.function.id == fid and info.function.inferenceUrl == "/echo"
    assert info.function.inferencePort == 8000

    # deployments.create: info, deployment info (404 expected), POST
    sdk.sent.clear()
    deployed = await sdk.deploy(fid, vid, [SPEC])
    dep_path = f"/v2/orgs/acme/nvcf/deployments/functions/{fid}/versions/{vid}"
    assert sdk.sent == [
        CALLER,
        CALLER,
        Sent("GET", f"{fns}/{fid}/versions/{vid}", 200),
        CALLER,
        Sent("GET", dep_path, 404),
        Sent("POST", dep_path, 200),
    ]
    dep = deployed.deployment
    assert dep.functionId == fid and dep.functionVersionId == vid
    assert dep.functionStatus == "DEPLOYING"
    (spec,) = [spec_from_dict(vars(s)) for s in dep.deploymentSpecifications]
    assert spec["gpu"] == "L40S" and spec["instanceType"] == "DGXC.GPU.L40S_1x"
    assert spec["minInstances"] == 1 and spec["maxInstances"] == 1
    assert isinstance(spec["gpuSpecificationId"], str)

    # deployments.info
    again = await sdk.deployment_info(fid, vid)
    assert [spec_from_dict(vars(s)) for s in again.deployment.deploymentSpecifications] == [spec]

    # deployments.update: the previous specification's gpuSpecificationId is sent back
    updated = await sdk.update_deployment(fid, vid, [{**SPEC, "maxInstances": 2}])
    (new_spec,) = [spec_from_dict(vars(s)) for s in updated.deployment.deploymentSpecifications]
    assert new_spec == {**spec, "maxInstances": 2}

    # functions.update (the rate limit; json_response=False)
    await sdk.update_function(fid, vid, {"rateLimit": {"rateLimit": "100-S"}})
    assert (await sdk.info(fid, vid)).function.rateLimit.rateLimit == "100-S"

    # deployments.list
    deployments = (await sdk.list_deployments()).deployments
    assert [(d.functionId, d.functionVersionId) for d in deployments] == [(fid, vid)]

    # deployments.delete (its JSON answer is returned as is)
    undeployed = await sdk.delete_deployment(fid, vid)
    assert undeployed["function"]["id"] == fid

    # functions.delete (json_response=False)
    assert await sdk.delete_function(fid, vid) == ""
    with pytest.raises(ResourceNotFoundException):
        await sdk.info(fid, vid)
    assert (await sdk.list_functions()).functions == []


async def test_a_new_version_through_ngcsdk(client: AppClient) -> None:
    sdk = await configured(client)
    first = (await sdk.create_function(CREATE_BODY)).function
    # functions.create(function_id=...) posts to .../functions/{id}/versions
    body = {**CREATE_BODY, "inferencePort": 9000}
    second = await sdk.api("POST", f"v2/orgs/acme/nvcf/functions/{first.id}/versions", body)
    assert second["function"]["id"] == first.id
    assert second["function"]["versionId"] != first.versionId


async def test_the_team_alias_paths_serve_the_same_calls(client: AppClient) -> None:
    sdk = await configured(client)
    fn = (await sdk.create_function(CREATE_BODY)).function
    resp = await sdk.request("GET", f"v2/orgs/acme/teams/t1/nvcf/functions/{fn.id}/versions")
    assert [f["versionId"] for f in resp.json()["functions"]] == [fn.versionId]


async def test_calls_with_a_jwt(client: AppClient) -> None:
    claims = {"sub": "acme", "scopes": SCOPES, "exp": int(time.time()) + 600}
    token = jwt.encode(claims, JWT_SECRET, algorithm="HS256")
    sdk = NgcSdk(client)
    await sdk.configure(api_key=token, org_name="acme")
    sdk.sent.clear()
    fn = (await sdk.create_function(CREATE_BODY)).function
    listed = await sdk.list_functions()
    assert [f.id for f in listed.functions] == [fn.id]
    # a JWT is validated without a server call before each NVCF call
    assert [s.path for s in sdk.sent] == [
        "/v2/org/acme/repos/echo/images/1.0",
        "/v2/orgs/acme/nvcf/functions",
        "/v2/orgs/acme/nvcf/functions",
    ]


async def test_a_revoked_key_fails_the_next_call(client: AppClient) -> None:
    acme_admin = await new_key(client, ["admin"], account="acme")
    sdk = await configured(client)
    keys = (await client.get("/v2/nvcf/api-keys", headers=bearer(acme_admin))).json()["apiKeys"]
    (used,) = [k for k in keys if "deploy_function" in k["scopes"]]
    resp = await client.delete(f"/v2/nvcf/api-keys/{used['id']}", headers=bearer(acme_admin))
    assert resp.status_code == 204
    with pytest.raises(AuthenticationException):  # the check before the call
        await sdk.list_functions()
    assert sdk.sent[-1] == Sent("POST", "/v3/keys/get-caller-info", 401)
