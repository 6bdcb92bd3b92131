"""The instances quota's maintained count (usage.py, issue 32): after deploys, scaling and
undeploys through the API it equals the sum over the account's live deployments, and the quota
refuses and admits on it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from service.deployments import usage
from service.deployments.models import Deployment, DeploymentSpec
from tests.support.api import create_fn
from tests.support.app import AppClient, ClientFactory

V = "/v2/nvcf"
L40 = {"gpu": "L40", "backend": "nvcf-default", "minInstances": 0, "maxInstances": 2}


def url(fn: dict[str, Any]) -> str:
    return f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"


async def counts(client: AppClient, account: str) -> tuple[int, int]:
    """(the maintained count, the sum over live deployments by a scan)."""
    async with client.app.state.sessionmaker() as session:
        kept = await usage.deployed_instances(session, account)
        scanned = await session.scalar(
            select(func.coalesce(func.sum(DeploymentSpec.max_instances), 0))
            .join(Deployment, Deployment.id == DeploymentSpec.deployment_id)
            .where(Deployment.account_id == account, Deployment.desired == "deployed")
        )
        return kept, int(scanned or 0)


async def test_the_count_follows_deploys_scaling_and_undeploys(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(quota_instances=5, reconciler_enabled=False)
    a, b, c = [await create_fn(client, name=n) for n in ("a", "b", "c")]
    resp = await client.post(url(a), json={"deploymentSpecifications": [L40]})
    assert resp.status_code == 200, resp.text
    account = (await client.get(f"{V}/functions/{a['id']}/versions/{a['versionId']}")).json()[
        "function"
    ]["ncaId"]
    dep = resp.json()["deployment"]
    assert await counts(client, account) == (2, 2)
    two = {**L40, "minInstances": 1, "maxInstances": 3}
    resp = await client.post(url(b), json={"deploymentSpecifications": [two]})
    assert resp.status_code == 200, resp.text
    assert await counts(client, account) == (5, 5)

    # full: a third deployment is refused, naming the maintained count
    refused = await client.post(url(c), json={"deploymentSpecifications": [L40]})
    assert refused.status_code == 400, refused.text
    assert "the account has 5 instances" in refused.json()["errors"][0]["message"]
    assert await counts(client, account) == (5, 5)

    # scaling a down frees one place; undeploying b frees three
    spec_id = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    patch = f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{spec_id}"
    assert (await client.patch(patch, json={"maxInstances": 1})).status_code == 200
    assert await counts(client, account) == (4, 4)
    assert (await client.delete(url(b))).status_code == 200
    assert await counts(client, account) == (1, 1)
    resp = await client.post(url(c), json={"deploymentSpecifications": [L40]})
    assert resp.status_code == 200, resp.text
    assert await counts(client, account) == (3, 3)

    # deleting a version undeploys it: its places are freed
    assert (
        await client.delete(f"{V}/functions/{a['id']}/versions/{a['versionId']}")
    ).status_code in (
        200,
        204,
    )
    assert await counts(client, account) == (2, 2)
