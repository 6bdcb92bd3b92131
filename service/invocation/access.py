"""Who may invoke what: the one place the invocation plane asks which function versions a
caller may reach.

Today a caller invokes its own account's functions only: another account's function is a 404,
exactly like an unknown one. Sharing a function with other accounts extends `visible_versions`
(and nothing else): every invocation route, the status poll and the queue routes resolve
versions through it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, and_, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.service import Principal
from service.deployments.models import Deployment, DeploymentDesired
from service.functions.models import FunctionVersion

#: the version columns invocation needs (never the whole row: secrets, objects, findings)
VERSION_COLUMNS = (
    FunctionVersion.id,
    FunctionVersion.function_id,
    FunctionVersion.account_id,
    FunctionVersion.name,
    FunctionVersion.status,
    FunctionVersion.inference_url,
    FunctionVersion.inference_port,
    FunctionVersion.helm_chart_service_name,
    FunctionVersion.container_image,
    FunctionVersion.health,
    FunctionVersion.rate_limit,
)


async def visible_versions(
    session: AsyncSession,
    principal: Principal,
    function_id: uuid.UUID,
    version_id: uuid.UUID | None = None,
) -> Sequence[Row[Any]]:
    """The versions of a function the caller may invoke (all of them, or the one asked for),
    each with its live deployment's id and creation time (None when not deployed)."""
    stmt = (
        select(*VERSION_COLUMNS, Deployment.id.label("deployment_id"), Deployment.created_at)
        .outerjoin(
            Deployment,
            and_(
                Deployment.version_id == FunctionVersion.id,
                Deployment.desired == DeploymentDesired.DEPLOYED,
            ),
        )
        .where(
            FunctionVersion.function_id == function_id,
            FunctionVersion.account_id == principal.account_id,
        )
    )
    if version_id is not None:
        stmt = stmt.where(FunctionVersion.id == version_id)
    return (await session.execute(stmt)).all()


def may_poll(principal: Principal, request_account: str) -> bool:
    """Whether the caller may read a request's state: the account that made it."""
    return principal.account_id == request_account
