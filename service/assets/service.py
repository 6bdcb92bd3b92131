"""The asset service: create, read, list, delete and download assets of an account, confirm
uploads, resolve the references of an invocation, and purge what expired.

Rules (NVCF's, and where it is silent, decided here; docs/assets.md):
- Assets belong to the account that created them; any other account gets 404, and an
  invocation referencing one is told it does not exist (the same words as for an unknown id).
- An asset expires `NVCF_ASSET_TTL_SECONDS` after it was created: it is no longer listed,
  read or usable, and the purge deletes its row and object.
- An upload is confirmed by asking the store (HEAD) when the asset is shown, referenced or
  downloaded, and when the account signs a new upload URL; until then it is "not uploaded"
  (shown, downloaded and deleted: 404, as NVCF). A larger object than `NVCF_ASSET_MAX_BYTES`
  (possible on S3, which cannot bound a PUT) or one that would pass the account's
  `asset_bytes` quota is deleted from the store and refused; the asset can be uploaded again
  through a valid upload URL.
- The `asset_bytes` quota counts an asset not yet confirmed as `NVCF_ASSET_MAX_BYTES` (what
  its upload may bring) until it is: an upload URL is signed only while the uploaded sizes
  and these reservations leave room, and the local store's URL takes no more than that room,
  so an account never holds more than its quota. An asset still not uploaded once its
  upload window is over (the URL's life and `NVCF_ASSET_UPLOAD_TIMEOUT_SECONDS`) can never be
  and is removed (`settle`: on the account's next create, and by the purge).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import anyio
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.assets import repository
from service.assets.files import REFERENCES_HEADER, sweep
from service.assets.models import Asset, result_key
from service.assets.schemas import AssetOut, CreateAssetRequest
from service.assets.signing import PURPOSE, Signer
from service.assets.storage import ObjectStore, open_store
from service.auth.limits import account_quota
from service.auth.repository import lock_account
from service.core.crypto import SecretBox
from service.core.db import utcnow
from service.core.errors import FieldError, NotFound, ValidationFailed
from service.core.http import require_json_object
from service.core.quotas import QuotaExceeded, Quotas
from service.core.settings import Settings
from service.core.validation import parse

log = logging.getLogger("nvcf.assets")

#: rows and objects the purge removes per round (the next round takes the rest)
PURGE_BATCH = 500
#: seconds past the worker timeout after which a request's directory is surely abandoned
STALE_MARGIN = 300.0


@dataclass(frozen=True)
class NewAsset:
    asset: Asset
    upload_url: str


def validate_create(raw: Any) -> CreateAssetRequest:
    model, errors = parse(CreateAssetRequest, require_json_object(raw))
    if errors or model is None:
        raise ValidationFailed.of(errors, what="asset")
    return model


def describe(asset: Asset) -> AssetOut:
    return AssetOut(
        asset_id=asset.id,
        description=asset.description,
        content_type=asset.content_type,
        created_at=asset.created_at,
    )


def parse_references(values: Sequence[str], field: str, limit: int) -> list[uuid.UUID]:
    """Asset ids as NVCF reads them: every value split at commas, blanks skipped, each a
    UUID; duplicates kept once. Every malformed id is named, and more than `limit` refused."""
    ids: dict[uuid.UUID, None] = {}
    errors: list[FieldError] = []
    for value in values:
        for part in value.split(","):
            item = part.strip()
            if not item:
                continue
            try:
                ids[uuid.UUID(item)] = None
            except ValueError:
                errors.append(FieldError(field, f"'{item[:64]}' is not an asset id (a UUID)"))
    if len(ids) > limit:
        errors.append(
            FieldError(
                field,
                f"{len(ids)} assets referenced; an invocation may use at most "
                f"{limit} (NVCF_ASSET_MAX_REFERENCES)",
            )
        )
    if errors:
        raise ValidationFailed.of(errors, what="asset references")
    return list(ids)


class Assets:
    """The asset plane of one process: its store and rules (component `assets`, its deps.py)."""

    def __init__(
        self, settings: Settings, store: ObjectStore, signer: Signer, quotas: Quotas
    ) -> None:
        self.settings = settings
        self.store = store
        self.signer = signer
        self.quotas = quotas

    @classmethod
    async def open(cls, settings: Settings, box: SecretBox, quotas: Quotas) -> Assets:
        signer = Signer(box.derive(PURPOSE))
        return cls(settings, await open_store(settings, signer), signer, quotas)

    def base_url(self, request_base: str) -> str:
        return (self.settings.asset_public_url or request_base).rstrip("/")

    # ------------------------------------------------------------------ the routes

    async def create(
        self, session: AsyncSession, account_id: str, spec: CreateAssetRequest, base_url: str
    ) -> NewAsset:
        now = utcnow()
        # the account's uploads and reservations, counted under its lock: two creates never
        # both take the same room
        await lock_account(session, account_id)
        assets = await account_quota(session, self.quotas.assets, account_id)
        waiting = await self.settle(
            session,
            await repository.pending(session, now, assets.limit, account_id=account_id),
            now,
        )
        await assets.check(
            lambda: repository.count_live(session, account_id, now),
            lambda: lock_account(session, account_id),
        )
        asset_bytes = await account_quota(session, self.quotas.asset_bytes, account_id)
        uploaded = await repository.bytes_used(session, account_id, now)
        reserved = len(waiting) * self.settings.asset_max_bytes
        room = asset_bytes.limit - uploaded - reserved
        if room <= 0:
            raise asset_bytes.refused(
                f"the account's assets hold {uploaded} bytes uploaded and {len(waiting)} "
                f"not yet uploaded, each counted as {self.settings.asset_max_bytes} bytes "
                f"(NVCF_ASSET_MAX_BYTES) until it is; at most {asset_bytes.limit}"
            )
        asset = Asset(
            id=uuid.uuid4(),
            account_id=account_id,
            content_type=spec.content_type,
            description=spec.description,
            created_at=now,
            expires_at=now + timedelta(seconds=self.settings.asset_ttl_seconds),
        )
        session.add(asset)
        await session.flush()
        # The local store refuses an upload past this at once; S3 cannot bound a PUT: its
        # object is checked when it is next confirmed.
        limit = min(self.settings.asset_max_bytes, room)
        url = await self.store.upload_url(
            asset.key,
            base_url=self.base_url(base_url),
            max_bytes=limit,
            content_type=asset.content_type,
            description=asset.description,
        )
        log.info("asset %s created (account %s)", asset.id, account_id)
        return NewAsset(asset, url)

    async def get(self, session: AsyncSession, account_id: str, asset_id: uuid.UUID) -> Asset:
        asset = await repository.get(session, asset_id)
        if asset is None or asset.account_id != account_id or asset.expires_at <= utcnow():
            raise NotFound(detail=f"asset {asset_id} not found")
        return asset

    async def list_live(self, session: AsyncSession, account_id: str) -> Sequence[Asset]:
        return await repository.list_live(session, account_id, utcnow())

    async def uploaded(self, session: AsyncSession, account_id: str, asset_id: uuid.UUID) -> Asset:
        """The account's asset, its upload confirmed; else 404 saying why (NVCF answers 404
        for an asset whose object is not in its bucket)."""
        asset = await self.get(session, account_id, asset_id)
        problem = await self.confirm(session, asset)
        if problem is not None:
            raise NotFound(detail=f"asset {asset_id} {problem}")
        return asset

    async def download_url(
        self, session: AsyncSession, account_id: str, asset_id: uuid.UUID, base_url: str
    ) -> str:
        asset = await self.uploaded(session, account_id, asset_id)
        return await self.store.download_url(
            asset.key, base_url=self.base_url(base_url), content_type=asset.content_type
        )

    async def delete(self, session: AsyncSession, account_id: str, asset_id: uuid.UUID) -> None:
        asset = await self.uploaded(session, account_id, asset_id)
        await repository.remove(session, asset)
        await session.flush()
        await self.store.delete(asset.key)
        log.info("asset %s deleted (account %s)", asset_id, account_id)

    # ------------------------------------------------------------------ uploads

    async def confirm(self, session: AsyncSession, asset: Asset) -> str | None:
        """Make sure the asset's upload is complete and within its bounds: None when it is
        (its size recorded), else why not, in words that follow "asset <id> "."""
        if asset.size_bytes is not None:
            return None
        size = await self.store.size(asset.key)
        if size is None:
            return "has not been uploaded yet: PUT its file to the uploadUrl first"
        limit = self.settings.asset_max_bytes
        if size > limit:
            await self.store.delete(asset.key)
            return (
                f"was refused: its {size} bytes pass the limit of {limit} bytes "
                "(NVCF_ASSET_MAX_BYTES); the upload was deleted"
            )
        try:
            asset_bytes = await account_quota(session, self.quotas.asset_bytes, asset.account_id)
            await asset_bytes.check(
                lambda: repository.bytes_used(
                    session, asset.account_id, utcnow(), besides=asset.id
                ),
                lambda: lock_account(session, asset.account_id),
                adding=size,
            )
        except QuotaExceeded as exc:
            await self.store.delete(asset.key)
            why = "; ".join(e.message for e in exc.errors)
            return f"was refused and its upload deleted: {exc.detail} {why}"
        asset.size_bytes = size
        asset.uploaded_at = utcnow()
        await session.flush()
        return None

    def upload_window(self) -> timedelta:
        """How long after its creation an asset's upload may still arrive: its URL's life and
        the time an upload started then may take."""
        return timedelta(
            seconds=self.settings.asset_url_seconds + self.settings.asset_upload_timeout_seconds
        )

    async def settle(
        self, session: AsyncSession, waiting: Sequence[Asset], now: datetime
    ) -> list[Asset]:
        """Confirm the uploads of assets not yet confirmed; remove those whose upload window
        is over without one (they can never be uploaded). Those still waiting."""
        closed = now - self.upload_window()
        still: list[Asset] = []
        for asset in waiting:
            if await self.confirm(session, asset) is None:
                continue
            if asset.created_at <= closed:
                await repository.remove(session, asset)
                log.info("asset %s never uploaded: removed", asset.id)
            else:
                still.append(asset)
        await session.flush()
        return still

    # ------------------------------------------------------------------ invocations

    async def resolve(
        self,
        session: AsyncSession,
        account_id: str,
        ids: Sequence[uuid.UUID],
        field: str = REFERENCES_HEADER,
    ) -> list[Asset]:
        """The assets an invocation references, in order, each confirmed uploaded; else one
        400 naming every asset that is unknown (or another account's), expired, not uploaded
        or refused."""
        if not ids:
            return []
        rows = await repository.many(session, ids)
        now = utcnow()
        errors: list[FieldError] = []
        found: list[Asset] = []
        for asset_id in ids:
            asset = rows.get(asset_id)
            if asset is None or asset.account_id != account_id:
                errors.append(FieldError(field, f"asset {asset_id} does not exist"))
            elif asset.expires_at <= now:
                errors.append(
                    FieldError(
                        field, f"asset {asset_id} expired at {asset.expires_at:%Y-%m-%dT%H:%M:%SZ}"
                    )
                )
            else:
                found.append(asset)
        for asset in found:
            problem = await self.confirm(session, asset)
            if problem is not None:
                errors.append(FieldError(field, f"asset {asset.id} {problem}"))
        if errors:
            raise ValidationFailed.of(errors, what="asset references")
        return found

    async def result_url(self, request_id: uuid.UUID, base_url: str) -> str:
        """The signed download URL of a request's large result (results.py stores it)."""
        return await self.store.download_url(
            result_key(request_id), base_url=self.base_url(base_url), content_type="application/zip"
        )

    # ------------------------------------------------------------------ purge

    async def purge(self, maker: async_sessionmaker[AsyncSession]) -> int:
        """Delete expired assets (rows, then objects), large results older than the polling
        result TTL, and abandoned partial uploads; how many objects went."""
        now = utcnow()
        async with maker() as session, session.begin():
            stale = await repository.pending(
                session, now, PURGE_BATCH, created_before=now - self.upload_window()
            )
            await self.settle(session, stale, now)
        async with maker() as session, session.begin():
            ids = await repository.expired(session, now, PURGE_BATCH)
            await repository.delete_ids(session, ids)
        cutoff = now - timedelta(seconds=self.settings.invoke_result_ttl_seconds)
        results = await self.store.older_than("results/", cutoff, PURGE_BATCH)
        keys = [f"assets/{i}" for i in ids] + results
        for key in keys:
            await self.store.delete(key)
        await self.store.sweep()
        # what crashed processes left of their requests' directories (files.py)
        age = self.settings.invoke_worker_timeout_seconds + STALE_MARGIN
        left = await anyio.to_thread.run_sync(sweep, self.settings.asset_files_root, age)
        if left:
            log.info("removed %d request directories crashed processes left", left)
        if keys:
            log.info("purged %d expired assets and %d old large results", len(ids), len(results))
        return len(keys)
