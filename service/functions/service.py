"""Function registry operations. Services flush; the request's transaction commits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.crypto import SecretBox
from service.core.db import utcnow
from service.core.errors import FieldError, NotFound, ValidationFailed
from service.core.events import Events
from service.core.pagination import Page
from service.functions import repository, sharing
from service.functions.events import AccessChanged, VersionDeleted
from service.functions.models import Function, FunctionSecret, FunctionVersion, VersionTag
from service.functions.validation import FunctionSpec, MetadataUpdate, ModelUpdate
from service.observability import references

STATUSES = ("ACTIVE", "DEPLOYING", "ERROR", "INACTIVE", "DEGRADED", "DEGRADING")


@dataclass(frozen=True)
class ListFilters:
    name: str | None = None
    status: str | None = None
    tag: str | None = None
    #: the caller's own functions (private), those shared with it (authorized)
    visibility: frozenset[str] = sharing.ALL_VISIBILITIES


def parse_status_filter(value: str | None) -> str | None:
    if value is None:
        return None
    upper = value.upper()
    if upper not in STATUSES:
        raise ValidationFailed.of(
            [FieldError("status", f"must be one of {', '.join(STATUSES)}, got '{value}'")]
        )
    return upper


async def create_version(
    session: AsyncSession,
    *,
    account_id: str,
    spec: FunctionSpec,
    box: SecretBox,
    function_id: uuid.UUID,
    new_function: bool = False,
    chart_digest: str | None = None,
    findings: list[dict[str, Any]] | None = None,
) -> FunctionVersion:
    """A new version of the caller's function `function_id`, or the first one of the function
    `add_function` has just inserted (`new_function`); the telemetries it names are kept
    from deletion until the transaction ends."""
    await references.hold(session, account_id, spec.telemetries)
    now = utcnow()
    llm_invocation_config = spec.llm_invocation_config
    if not new_function:
        await get_function(session, account_id, function_id)
        siblings = await repository.versions_of(session, function_id)
        llm_invocation_config = _reconcile_new_version(spec, siblings)
    version = FunctionVersion(
        id=uuid.uuid4(),
        function_id=function_id,
        account_id=account_id,
        name=spec.name,
        status="INACTIVE",
        inference_url=spec.inference_url,
        inference_port=spec.inference_port,
        container_image=spec.container_image,
        utils_container_image=spec.utils_container_image,
        container_args=spec.container_args,
        container_environment=spec.container_environment,
        helm_chart=spec.helm_chart,
        helm_chart_service_name=spec.helm_chart_service_name,
        helm_chart_digest=chart_digest,
        models=spec.models,
        resources=spec.resources,
        api_body_format=spec.api_body_format,
        function_type=spec.function_type,
        health=spec.health,
        health_uri=spec.health_uri,
        description=spec.description,
        tags=spec.tags,
        rate_limit=spec.rate_limit,
        llm_invocation_config=llm_invocation_config,
        telemetries=spec.telemetries,
        findings=findings,
        created_at=now,
        updated_at=now,
        secret_names=sorted(n for n, _ in spec.secrets),
    )
    session.add(version)
    session.add_all(
        FunctionSecret(version_id=version.id, name=n, ciphertext=box.encrypt(v))
        for n, v in spec.secrets
    )
    session.add_all(VersionTag(version_id=version.id, tag=t) for t in spec.tags)
    await session.flush()
    return version


def _llm_configs(models: list[Any] | None) -> dict[str, dict[str, Any]]:
    """A version's models' llmConfig by model name."""
    return {
        m["name"]: m["llmConfig"]
        for m in models or ()
        if isinstance(m, dict) and isinstance(m.get("llmConfig"), dict)
    }


def _set_llm_fields(version: FunctionVersion, changes: dict[str, dict[str, str]]) -> None:
    """Set `changes` ({model name: {llmConfig field: value}}) on the version's models; the
    JSON is replaced, not changed in place, so that the change is written."""
    if not any(name in changes for name in _llm_configs(version.models)):
        return
    models = []
    for model in version.models or ():
        fields = changes.get(str(model.get("name"))) if isinstance(model, dict) else None
        if fields and isinstance(model.get("llmConfig"), dict):
            model = {**model, "llmConfig": {**model["llmConfig"], **fields}}
        models.append(model)
    version.models = models
    version.updated_at = utcnow()


def _reconcile_new_version(
    spec: FunctionSpec, siblings: list[FunctionVersion]
) -> dict[str, Any] | None:
    """NVCF's rules for a new version of a function with LLM versions: every version has the
    same functionType; a model's uris and tokenizer are those of the other versions; the
    mutable fields given (tokenRateLimit, routingMethod) and llmInvocationConfig are set on
    every version. Returns the new version's llmInvocationConfig (the others' when not given)."""
    kinds = {s.function_type for s in siblings}
    if "LLM" not in kinds and spec.function_type != "LLM":
        return spec.llm_invocation_config
    if kinds != {spec.function_type}:
        other = sorted(kinds - {spec.function_type})[0]
        raise ValidationFailed.of(
            [
                FieldError(
                    "functionType",
                    f"must be {other}, as the function's other versions are: all versions of "
                    "a function share the functionType when one is LLM",
                )
            ]
        )
    errors: list[FieldError] = []
    changes: dict[str, dict[str, str]] = {}
    existing: dict[str, dict[str, Any]] = {}
    for sibling in siblings:
        for name, config in _llm_configs(sibling.models).items():
            existing.setdefault(name, config)
    for i, (name, config) in enumerate(
        (m["name"], m.get("llmConfig") or {}) for m in spec.models or ()
    ):
        before = existing.get(name)
        if before is None:
            continue
        if sorted(config.get("uris", ())) != sorted(before.get("uris", ())):
            errors.append(
                FieldError(
                    f"models[{i}].llmConfig.uris",
                    f"must be {before.get('uris')}, as model '{name}' has in the function's "
                    "other versions (uris and tokenizer cannot change between versions)",
                )
            )
        if config.get("tokenizer") != before.get("tokenizer"):
            errors.append(
                FieldError(
                    f"models[{i}].llmConfig.tokenizer",
                    f"must be {before.get('tokenizer')!r}, as model '{name}' has in the "
                    "function's other versions",
                )
            )
        fields = {k: config[k] for k in ("tokenRateLimit", "routingMethod") if k in config}
        if fields:
            changes[name] = fields
    if errors:
        raise ValidationFailed.of(errors)
    for sibling in siblings:
        _set_llm_fields(sibling, changes)
        if spec.llm_invocation_config is not None:
            sibling.llm_invocation_config = spec.llm_invocation_config
    if spec.llm_invocation_config is not None:
        return spec.llm_invocation_config
    return siblings[0].llm_invocation_config if siblings else None


def _apply_llm_update(
    version: FunctionVersion, siblings: list[FunctionVersion], update: MetadataUpdate
) -> None:
    """`modelUpdates` and `llmInvocationConfig` on every version of the function (NVCF: one
    source of truth per function); an unknown model is a 404, a non-LLM function a 400."""
    given = ["modelUpdates"] if update.model_updates else []
    if update.llm_invocation_config is not None:
        given.append("llmInvocationConfig")
    if not given:
        return
    if version.function_type != "LLM":
        raise ValidationFailed.of(
            [
                FieldError(name, f"only LLM functions have it; this one is {version.function_type}")
                for name in given
            ]
        )
    known = _llm_configs(version.models)
    unknown = [
        FieldError(
            f"modelUpdates[{i}].modelName",
            f"function {version.function_id} version {version.id} has no model '{u.model_name}'",
        )
        for i, u in enumerate(update.model_updates)
        if u.model_name not in known
    ]
    if unknown:
        detail = "; ".join(e.message for e in unknown)
        raise NotFound(detail=detail, errors=unknown)
    changes = {u.model_name: _fields_of(u) for u in update.model_updates}
    for sibling in siblings:
        _set_llm_fields(sibling, changes)
        if update.llm_invocation_config is not None:
            sibling.llm_invocation_config = update.llm_invocation_config
            sibling.updated_at = utcnow()


def _fields_of(update: ModelUpdate) -> dict[str, str]:
    out: dict[str, str] = {}
    if update.token_rate_limit is not None:
        out["tokenRateLimit"] = update.token_rate_limit
    if update.routing_method is not None:
        out["routingMethod"] = update.routing_method
    return out


async def add_function(
    session: AsyncSession, account_id: str, *, below: int | None = None
) -> uuid.UUID | None:
    """Insert a new function of the account and return its id. With `below`, only while the
    account has fewer functions than that, counted by the insert itself: the usual quota case
    costs no round trip of its own (None: nothing inserted, the caller counts under a lock)."""
    return await repository.add_function(session, account_id, below)


async def count_functions(session: AsyncSession, account_id: str) -> int:
    return await repository.count_functions(session, account_id)


async def count_versions(session: AsyncSession, function_id: uuid.UUID) -> int:
    return await repository.count_versions(session, function_id)


async def get_function(session: AsyncSession, account_id: str, function_id: uuid.UUID) -> Function:
    """The caller's own function, else 404 (also when it is only shared with the caller)."""
    fn = await repository.function_by_id(session, function_id)
    if fn is None or fn.account_id != account_id:
        raise NotFound(detail=f"function {function_id} not found")
    return fn


async def get_version(
    session: AsyncSession,
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    *,
    locked: bool = False,
) -> FunctionVersion:
    """The caller's own version, else 404: for changes (reads: `sharing.readable_version`);
    `locked`: as it is now, no other writer (a deploy) changing it until the transaction ends."""
    read = repository.lock_version if locked else repository.version_by_id
    version = await read(session, version_id)
    if version is None or version.account_id != account_id or version.function_id != function_id:
        raise NotFound(detail=f"version {version_id} of function {function_id} not found")
    return version


async def check_listable(session: AsyncSession, account_id: str, function_id: uuid.UUID) -> None:
    """404 unless the caller owns the function or some of it is shared with it."""
    fn = await repository.function_by_id(session, function_id)
    if fn is not None and fn.account_id == account_id:
        return
    if fn is None or not (await sharing.grants_of(session, account_id)).any_of(function_id):
        raise NotFound(detail=f"function {function_id} not found")


async def list_versions(
    session: AsyncSession,
    account_id: str,
    *,
    filters: ListFilters,
    page: Page,
    function_id: uuid.UUID | None = None,
    only: frozenset[uuid.UUID] | None = None,
) -> tuple[Sequence[FunctionVersion], str | None]:
    """The versions the caller may list: its own and those shared with it, as `filters` ask
    (`only`: of these functions, for a key limited to them)."""
    grants = (
        await sharing.grants_of(session, account_id)
        if sharing.AUTHORIZED in filters.visibility
        else sharing.Grants()
    )
    return await repository.page_versions(
        session,
        sharing.visible_versions(account_id, grants, filters.visibility),
        page,
        function_id=function_id,
        only=only,
        name=filters.name,
        status=filters.status,
        tag=filters.tag,
    )


async def list_function_ids(
    session: AsyncSession, account_id: str, visibility: frozenset[str] = sharing.ALL_VISIBILITIES
) -> list[uuid.UUID]:
    grants = (
        await sharing.grants_of(session, account_id)
        if sharing.AUTHORIZED in visibility
        else sharing.Grants()
    )
    return await repository.function_ids(
        session, sharing.visible_functions(account_id, grants, visibility)
    )


async def version_ids(session: AsyncSession, function_id: uuid.UUID) -> list[uuid.UUID]:
    """Every version of a function, oldest first."""
    return await repository.version_ids(session, function_id)


async def update_metadata(
    session: AsyncSession,
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    update: MetadataUpdate,
    *,
    events: Events,
) -> FunctionVersion:
    version = await get_version(session, account_id, function_id, version_id)
    if update.model_updates or update.llm_invocation_config is not None:
        _apply_llm_update(version, await repository.versions_of(session, function_id), update)
    if update.tags is not None:
        version.tags = update.tags
        await repository.replace_tags(session, version.id, update.tags)
    if update.description is not None:
        version.description = update.description
    if update.rate_limit is not None:
        version.rate_limit = update.rate_limit
        await events.publish(session, AccessChanged(function_id))
    version.updated_at = utcnow()
    await session.flush()
    return version


async def delete_rate_limit(
    session: AsyncSession,
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    *,
    events: Events,
) -> None:
    """Remove the caller's version's `rateLimit` (none: nothing changes, as NVCF's 204)."""
    version = await get_version(session, account_id, function_id, version_id)
    if version.rate_limit is None:
        return
    version.rate_limit = None
    await events.publish(session, AccessChanged(function_id))
    version.updated_at = utcnow()
    await session.flush()


async def delete_version(
    session: AsyncSession,
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    *,
    events: Events,
) -> None:
    """Delete a version and its secrets; the function goes with its last version.

    `VersionDeleted` is announced first (deployments marks the version's live deployment
    `deleting`: it outlives the version row, and the reconciler tears its instances down).
    """
    # locked: a deploy of it committing meanwhile is waited for, so its deployment is seen
    version = await get_version(session, account_id, function_id, version_id, locked=True)
    await events.publish(session, VersionDeleted(version_id))
    await repository.delete_version(session, version)
