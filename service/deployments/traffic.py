"""A function's traffic split (docs/rollouts.md, "Traffic"): the weights by which the
invocations that name no version are shared among the function's invocable versions.

No split: the newest invocable version takes them all (invocation/routing.py). A split names
only the function's own versions, each ACTIVE or DEGRADING with a live deployment when it is
set, with weights summing to 100. A version of the split that stops being invocable (or that
a caller may not invoke) takes no traffic; the others share it by their weights.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt
from pydantic.alias_generators import to_camel
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.errors import FieldError
from service.core.validation import MaxItems, RequestModel, int_between
from service.deployments import repository
from service.deployments.models import TrafficWeight
from service.functions import repository as functions_repository

#: versions in one split, at most
MAX_SPLIT = 16
TOTAL = 100
INVOCABLE = ("ACTIVE", "DEGRADING")


class TrafficWeightIn(RequestModel):
    version_id: uuid.UUID
    weight: Annotated[StrictInt, int_between(0, TOTAL)]

    shape: ClassVar[str] = "with versionId and weight"


class TrafficRequest(RequestModel):
    """Body of `PUT /functions/{functionId}/traffic`: the split from now on (empty: none)."""

    traffic: Annotated[list[TrafficWeightIn], MaxItems(MAX_SPLIT)]


class TrafficWeightOut(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    version_id: uuid.UUID
    weight: int


class TrafficSplit(BaseModel):
    """A function's split; `traffic` empty: the newest invocable version takes it all."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    function_id: uuid.UUID
    traffic: list[TrafficWeightOut] = Field(default_factory=list)


async def weights(session: AsyncSession, function_id: uuid.UUID) -> dict[uuid.UUID, int]:
    """The function's split by version (empty: none)."""
    return await repository.traffic_weights(session, function_id)


async def split_of(session: AsyncSession, function_id: uuid.UUID) -> TrafficSplit:
    found = await weights(session, function_id)
    listed = sorted(found.items(), key=lambda item: (-item[1], str(item[0])))
    return TrafficSplit(
        function_id=function_id,
        traffic=[TrafficWeightOut(version_id=v, weight=w) for v, w in listed],
    )


async def violations(
    session: AsyncSession, function_id: uuid.UUID, split: Sequence[TrafficWeightIn]
) -> list[FieldError]:
    """Every reason the split cannot be the function's, each naming its entry. Its versions
    are read as they are now and kept from deletion until the split is stored."""
    errors: list[FieldError] = []
    ids = [w.version_id for w in split]
    await functions_repository.hold_versions(session, ids)
    rows = await repository.with_live_deployment(
        session, functions_repository.versions_with_ids(ids)
    )
    known = {r.id: (r.function_id, r.status, r.deployment_id) for r in rows}
    seen: set[uuid.UUID] = set()
    for i, entry in enumerate(split):
        where, vid = f"traffic[{i}].versionId", entry.version_id
        if vid in seen:
            errors.append(FieldError(where, f"version {vid} is listed more than once"))
            continue
        seen.add(vid)
        found = known.get(vid)
        if found is None or found[0] != function_id:
            errors.append(FieldError(where, f"{vid} is not a version of function {function_id}"))
        elif found[1] not in INVOCABLE or found[2] is None:
            status = found[1] if found[2] is not None or found[1] != "ACTIVE" else "not deployed"
            errors.append(
                FieldError(
                    where,
                    f"version {vid} is {status} and cannot take traffic; only invocable "
                    "(ACTIVE or DEGRADING, deployed) versions can",
                )
            )
    total = sum(w.weight for w in split)
    if split and total != TOTAL:
        errors.append(FieldError("traffic", f"the weights must sum to {TOTAL}, got {total}"))
    return errors


async def replace(
    session: AsyncSession, function_id: uuid.UUID, split: Sequence[TrafficWeightIn]
) -> None:
    """The function's split from now on (checked by `violations`); empty: none."""
    await repository.clear_traffic(session, function_id)
    session.add_all(
        TrafficWeight(function_id=function_id, version_id=w.version_id, weight=w.weight)
        for w in split
    )
    await session.flush()
