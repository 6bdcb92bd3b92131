"""A telemetry in use by a function version cannot be deleted, also when the two race: a
delete waits for a version being stored naming the telemetry and is refused, and a version
being stored while the telemetry's delete commits waits for it and is refused; either way no
version names a telemetry that is gone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.crypto import SecretBox
from service.core.db import make_sessionmaker
from service.core.errors import BadRequest, ValidationFailed
from service.functions import repository as functions_repository
from service.functions import service as functions_service
from service.functions.models import FunctionVersion
from service.functions.validation import validate_create
from service.observability import repository, service
from service.observability.references import reference_errors
from tests.support.api import CONTAINER_FN
from tests.support.races import Writers, writers
from tests.support.telemetries import OTLP

ACCOUNT = "acct-telemetry"
BOX = SecretBox(Fernet.generate_key())


@dataclass
class Race:
    w: Writers
    maker: async_sessionmaker[AsyncSession]
    telemetry_id: uuid.UUID

    async def store_version(self, session: AsyncSession) -> uuid.UUID:
        """A function's first version naming the telemetry, as its creation stores it (after
        the request's check of what it names), not committed."""
        named = {"logsTelemetryId": str(self.telemetry_id)}
        spec = validate_create({**CONTAINER_FN, "telemetries": named})
        assert await reference_errors(session, ACCOUNT, spec.telemetries) == []
        fid = await functions_service.add_function(session, ACCOUNT)
        assert fid is not None
        version = await functions_service.create_version(
            session, account_id=ACCOUNT, spec=spec, box=BOX, function_id=fid, new_function=True
        )
        return version.id

    async def delete(self) -> None:
        async with self.maker() as session, session.begin():
            await service.delete(
                session, ACCOUNT, self.telemetry_id, functions_repository.telemetry_users
            )

    async def exists(self) -> bool:
        async with self.maker() as session:
            return await repository.by_id(session, self.telemetry_id) is not None


@pytest.fixture
async def race(database_url: str) -> AsyncIterator[Race]:
    async with writers(database_url) as w:
        maker = make_sessionmaker(w.engine)
        async with maker() as session, session.begin():
            spec = await service.validate_create(OTLP, ())
            telemetry = await service.create(session, account_id=ACCOUNT, spec=spec, box=BOX)
        yield Race(w, maker, telemetry.id)


async def test_a_delete_arriving_while_a_version_naming_the_telemetry_is_stored_is_refused(
    race: Race,
) -> None:
    async with race.maker() as creating:
        vid = await race.store_version(creating)
        deleting = asyncio.create_task(race.delete())

        async def held_up() -> bool:
            return deleting.done() or await race.w.waiting() >= 1

        await race.w.until(held_up)
        await creating.commit()
    with pytest.raises(BadRequest, match="in use by function"):
        await deleting
    assert await race.exists()
    async with race.maker() as session:
        assert await session.get(FunctionVersion, vid) is not None


async def test_a_version_stored_while_the_telemetrys_delete_commits_is_refused(
    race: Race,
) -> None:
    async with race.maker() as deleting:
        await service.delete(
            deleting, ACCOUNT, race.telemetry_id, functions_repository.telemetry_users
        )

        async def create() -> uuid.UUID:
            async with race.maker() as session:
                vid = await race.store_version(session)
                await session.commit()
                return vid

        creating = asyncio.create_task(create())
        await race.w.until_waiting()
        await deleting.commit()
    with pytest.raises(ValidationFailed) as refused:
        await creating
    assert [e.field for e in refused.value.errors or []] == ["telemetries.logsTelemetryId"]
    assert not await race.exists()
    async with race.maker() as session:
        assert await functions_repository.telemetry_users(session, ACCOUNT, race.telemetry_id) == []
