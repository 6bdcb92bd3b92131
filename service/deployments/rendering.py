"""The chart render path shared by a deploy and a configuration PATCH: the version's pinned
chart (by digest: no pull when cached) rendered with a specification's configuration and
checked for its clusters exactly as at deploy; findings become field errors with rule ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.service import Principal
from service.charts.pipeline import (
    DEFAULT_INFERENCE_PORT,
    ChartFieldError,
    ChartPipeline,
    ChartValidation,
)
from service.charts.policy import ValidationPolicy
from service.charts.target import not_permitted_message, permitted_clusters, stored_policy
from service.clusters.catalog import Catalog, Cluster
from service.clusters.instance_types import InstanceType
from service.core.errors import FieldError, ServiceUnavailable
from service.deployments.models import DeploymentSpec
from service.deployments.validation import RevisionChange
from service.functions.models import FunctionVersion


async def render(
    pipeline: ChartPipeline,
    session: AsyncSession,
    principal: Principal,
    version: FunctionVersion,
    *,
    clusters: Sequence[Cluster],
    instance_type: InstanceType | str,
    configuration: dict[str, Any] | None,
    policy: ValidationPolicy,
    path: str,
) -> tuple[ChartValidation, list[FieldError]]:
    """Render the version's pinned chart (by digest: no pull when cached) with a
    specification's configuration and check it for its clusters — the one path of a deploy
    and of a configuration PATCH; the findings as errors under `path`."""
    if version.helm_chart is None:
        raise ServiceUnavailable(detail="the chart pipeline is not available")
    result = await pipeline.validate_for_clusters(
        session,
        principal.account_id,
        clusters=clusters,
        helm_chart=version.helm_chart,
        service_name=version.helm_chart_service_name or "",
        inference_port=version.inference_port or DEFAULT_INFERENCE_PORT,
        configuration=configuration,
        policy=policy,
        instance_type=instance_type,
        digest=version.helm_chart_digest,
    )
    errors: list[FieldError] = []
    for finding in result.errors:
        where = "instanceType" if finding.rule == "multi-node-full-node" else "configuration"
        errors.append(
            ChartFieldError(
                field=f"{path}{where}",
                message=finding.message,
                rule=finding.rule,
                object=finding.object,
                path=finding.field,
            )
        )
    return result, errors


async def revision_objects(
    pipeline: ChartPipeline,
    catalog: Catalog,
    session: AsyncSession,
    principal: Principal,
    version: FunctionVersion,
    spec: DeploymentSpec,
    change: RevisionChange,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, list[Any], list[FieldError]]:
    """The new revision's configuration, stored policy and objects, rendered and checked as at
    deploy for the spec's candidate clusters that permit the policy; or the violations."""
    configuration = change.configuration if change.configuration_given else spec.configuration
    stored = (
        change.helm_validation_policy
        if change.helm_validation_policy is not None
        else spec.helm_validation_policy
    )
    policy = change.policy if change.policy is not None else stored_policy(stored)
    candidates = [c for name in spec.candidate_clusters or [] if (c := catalog.cluster(str(name)))]
    clusters = permitted_clusters(catalog, candidates, policy)
    if candidates and not clusters:
        message = not_permitted_message(catalog, candidates, policy)
        return None, None, [], [FieldError("helmValidationPolicy", message)]
    result, errors = await render(
        pipeline,
        session,
        principal,
        version,
        clusters=clusters,
        instance_type=spec.instance_type,
        configuration=configuration,
        policy=policy,
        path="",
    )
    return configuration, stored, list(result.objects), errors
