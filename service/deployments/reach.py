"""What a key limited to named functions reaches (auth/restrict.py's `FunctionReach`), answered
here, where both the functions' and the deployments' tables are visible; the composition hands
it to auth."""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy.ext.asyncio import AsyncSession

from service.deployments import repository as deployments
from service.functions import repository as functions_repository
from service.functions import sharing


class FunctionReach:
    async def function_of_deployment(
        self, session: AsyncSession, deployment_id: uuid.UUID
    ) -> uuid.UUID | None:
        return await deployments.function_of_deployment(session, deployment_id)

    async def own_functions(
        self, session: AsyncSession, account_id: str, ids: Collection[uuid.UUID]
    ) -> set[uuid.UUID]:
        return await functions_repository.owned_function_ids(session, account_id, ids)

    async def shared_functions(
        self, session: AsyncSession, account_id: str, ids: Collection[uuid.UUID]
    ) -> set[uuid.UUID]:
        grants = await sharing.grants_of(session, account_id)
        return {fid for fid in ids if grants.any_of(fid)}
