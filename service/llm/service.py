"""`GET /v1/models` (beyond NVCF, for clients and UIs to discover what they may call): the
models of the LLM functions the caller may invoke — its account's own and those shared with
it, within what its key or invocation token is limited to — as OpenAI's model list, each
model named `<function-id>/<model-name>` (the `model` a request gives) and owned by the
function's account. A model declared by several versions is listed once. One query.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.service import Principal
from service.functions import repository, sharing

#: the most models one list holds (a function has at most 64 models; the rest are cut)
MAX_LISTED = 10_000


def _granted(principal: Principal, function_id: uuid.UUID, version_id: uuid.UUID) -> bool:
    if principal.functions is not None and function_id not in principal.functions:
        return False
    if principal.grant is None:
        return True
    versions = principal.grant.versions(str(function_id))
    return versions is not None and (not versions or str(version_id) in versions)


def model_list(principal: Principal, rows: Sequence[Any]) -> dict[str, Any]:
    """OpenAI's list object of the models in `rows` (function_id, version id, account_id,
    models, created_at), oldest version first."""
    seen: dict[str, dict[str, Any]] = {}
    for row in rows:
        if not _granted(principal, row.function_id, row.id):
            continue
        created: datetime = row.created_at
        for model in row.models or ():
            if not isinstance(model, dict) or not isinstance(model.get("llmConfig"), dict):
                continue
            name = f"{row.function_id}/{model.get('name')}"
            if name in seen or len(seen) >= MAX_LISTED:
                continue
            seen[name] = {
                "id": name,
                "object": "model",
                "created": int(created.timestamp()),
                "owned_by": row.account_id,
            }
    return {"object": "list", "data": list(seen.values())}


async def list_models(session: AsyncSession, principal: Principal) -> dict[str, Any]:
    grants = await sharing.grants_of(session, principal.account_id)
    rows = await repository.llm_versions(
        session,
        sharing.visible_versions(principal.account_id, grants, sharing.ALL_VISIBILITIES),
        only=principal.functions,
    )
    return model_list(principal, rows)
