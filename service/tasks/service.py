"""The task use cases: create (validated against the catalog, the quotas and the result
rules), list, read, cancel, delete, the timeline and results, secrets, GPU usage.

Rules (NVCT's, and where it is silent, decided here; docs/tasks.md):
- A task belongs to the account that created it; any other account gets 404 on every route.
- Exactly one of `containerImage` and `helmChart`; `gpuSpecification` is resolved against the
  catalog like a deployment's; `UPLOAD` needs `resultsLocation` and credentials (an
  `NGC_API_KEY` secret or a registry credential of the account).
- Cancel: a queued task is CANCELED at once; a launched or running one is CANCELED, its
  container asked to stop and killed after `terminationGracePeriodDuration`. Delete cancels an
  active task the same way and removes it from the API at once (its row goes once the cluster
  is clean).
- Secrets never come back, and their names only with `includeSecrets=true`; an update merges
  by name and reaches a running container in place.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.limits import account_quota
from service.auth.repository import lock_account
from service.charts.pipeline import ChartFieldError, ChartPipeline
from service.charts.policy import ValidationPolicy
from service.charts.schemas import HelmValidationPolicyIn
from service.charts.target import not_permitted_message, permitted_clusters
from service.clusters.catalog import Catalog, Cluster
from service.clusters.catalog.resolution import ResolvedTarget, TargetRequest, resolve
from service.clusters.instance_types import InstanceTypeError, parse_instance_type
from service.core.crypto import SecretBox
from service.core.db import after_commit, utcnow
from service.core.durations import parse_timedelta
from service.core.errors import (
    BadRequest,
    FieldError,
    NotFound,
    ServiceUnavailable,
    ValidationFailed,
)
from service.core.http import require_json_object
from service.core.pagination import make_page
from service.core.quotas import Quotas
from service.core.settings import Settings
from service.core.validation import failed, parse
from service.functions.requests import MAX_SECRETS, secret_text
from service.observability.references import canonical, hold, reference_errors
from service.registry.models import ArtifactType
from service.registry.service import credentials_for_host
from service.tasks import repository, transitions
from service.tasks.models import ACTIVE, ON_CLUSTER, Task, TaskEvent, TaskResult, TaskStatus
from service.tasks.results import (
    NGC_API_KEY,
    ResultsTarget,
    parse_results_location,
    results_registry,
)
from service.tasks.schemas import (
    DEFAULT_GRACE,
    DEFAULT_MAX_QUEUED,
    BasicTaskOut,
    BulkTasksIn,
    CreateTaskIn,
    GpuUsageOut,
    TaskArtifactOut,
    TaskEventOut,
    TaskGpuSpecificationOut,
    TaskHealthOut,
    TaskInstanceOut,
    TaskKeyValueOut,
    TaskOut,
    TaskResultOut,
    UpdateSecretsIn,
    java_duration,
    placements_on,
)

#: NVCT's DEFAULT_PAGINATION_LIMIT (NvctConstants)
DEFAULT_LIMIT = 10


class Tasks:
    """The task use cases, with what they read: the catalog, the secrets key and the quotas;
    `wake(task_id)` runs the task loop's next pass now, over that task (after a commit that
    gives it work)."""

    def __init__(
        self,
        catalog: Catalog,
        box: SecretBox,
        quotas: Quotas,
        *,
        settings: Settings,
        pipeline: ChartPipeline | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.catalog = catalog
        self.settings = settings
        self.pipeline = pipeline
        self.box = box
        self.quotas = quotas
        self.clock = clock
        self.wake: Callable[[str], None] = lambda task_id: None

    # ------------------------------------------------------------------ create

    async def create(self, session: AsyncSession, account_id: str, raw: Any) -> Task:
        body = require_json_object(raw)
        model, errors = parse(CreateTaskIn, body)
        target = self._target(body, errors)
        errors += await self._cross_checks(session, account_id, body, errors)
        if errors or model is None or target is None:
            raise ValidationFailed.of(errors, what="task")
        objects: list[Any] | None = None
        clusters = list(target.clusters)
        if model.helm_chart is not None:
            objects, clusters = await self._chart(session, account_id, model, target)
        await self._check_quotas(session, account_id)
        await hold(session, account_id, canonical(body.get("telemetries")))
        now = self.clock()
        secrets = {s.name: secret_text(s.value) for s in model.secrets or []}
        spec = model.gpu_specification
        task = Task(
            id=transitions.ordered_id(),
            account_id=account_id,
            name=model.name,
            description=model.description,
            tags=list(dict.fromkeys(model.tags or [])),
            gpu=target.gpu,
            instance_type=str(target.instance_type),
            backend=spec.backend,
            clusters=spec.clusters,
            candidate_clusters=[c.name for c in clusters],
            configuration=spec.configuration,
            helm_validation_policy=_policy_shown(spec.helm_validation_policy),
            container_image=model.container_image,
            container_args=model.container_args,
            container_environment=_dump(model.container_environment),
            models=_dump(model.models),
            resources=_dump(model.resources),
            helm_chart=model.helm_chart,
            objects=objects,
            result_handling=model.result_handling_strategy
            if body.get("resultHandlingStrategy") is not None
            else self._strategy(body),
            results_location=model.results_location,
            max_runtime_seconds=_seconds(model.max_runtime_duration),
            max_queued_seconds=_seconds(model.max_queued_duration)
            or DEFAULT_MAX_QUEUED.total_seconds(),
            grace_seconds=_seconds(model.termination_grace_period_duration)
            or DEFAULT_GRACE.total_seconds(),
            telemetries=_dump_one(model.telemetries),
            secret_names=sorted(secrets),
            secrets_ciphertext=self.box.encrypt(json.dumps(secrets)) if secrets else None,
            secrets_generation=1 if secrets else 0,
            secrets_delivered=0,
            deleted=False,
            teardown_pending=False,
        )
        transitions.create(session, task, now)
        await session.flush()
        after_commit(session, lambda: self.wake(str(task.id)))
        return task

    async def _chart(
        self,
        session: AsyncSession,
        account_id: str,
        model: CreateTaskIn,
        target: ResolvedTarget,
    ) -> tuple[list[Any], list[Cluster]]:
        """A helm task's chart through the helm functions' pipeline: pulled with the account's
        credentials, rendered with `configuration` for the clusters whose operator permits the
        policy, restricted; every finding that is an error at once."""
        if self.pipeline is None or model.helm_chart is None:
            raise ServiceUnavailable(detail="the chart pipeline is not available")
        spec = model.gpu_specification
        policy = (
            spec.helm_validation_policy.policy()
            if spec.helm_validation_policy is not None
            else ValidationPolicy()
        )
        permitted = permitted_clusters(self.catalog, target.clusters, policy)
        if not permitted:
            message = not_permitted_message(self.catalog, target.clusters, policy)
            raise ValidationFailed.of(
                [FieldError("gpuSpecification.helmValidationPolicy", message)], what="task"
            )
        result = await self.pipeline.validate_for_clusters(
            session,
            account_id,
            clusters=permitted,
            helm_chart=model.helm_chart,
            service_name=None,
            inference_port=0,
            configuration=spec.configuration,
            policy=policy,
            instance_type=target.instance_type,
        )
        if result.errors:
            raise ValidationFailed.of(
                [
                    ChartFieldError(
                        field="helmChart",
                        message=f.message,
                        rule=f.rule,
                        object=f.object,
                        path=f.field,
                    )
                    for f in result.errors
                ],
                what="task",
            )
        return list(result.objects), permitted

    def _target(self, body: dict[str, Any], errors: list[FieldError]) -> ResolvedTarget | None:
        spec = body.get("gpuSpecification")
        if not isinstance(spec, dict) or "gpuSpecification" in failed(errors):
            if spec is None and "gpuSpecification" not in failed(errors):
                errors.append(FieldError("gpuSpecification", "is required"))
            return None
        broken = {e.field for e in errors if e.field.startswith("gpuSpecification.")}
        if broken & {"gpuSpecification.gpu", "gpuSpecification.instanceType"}:
            return None
        try:
            instance_type = parse_instance_type(str(spec.get("instanceType")))
        except InstanceTypeError as exc:
            errors.append(FieldError("gpuSpecification.instanceType", str(exc)))
            return None
        clusters = spec.get("clusters") if isinstance(spec.get("clusters"), list) else []
        backend = spec.get("backend")
        request = TargetRequest(
            gpu=str(spec.get("gpu")),
            instance_type=instance_type,
            backend=backend if isinstance(backend, str) else None,
            clusters=tuple(str(c) for c in clusters or ()),
        )
        resolved = resolve(
            self.catalog,
            request,
            is_helm=isinstance(body.get("helmChart"), str),
            path="gpuSpecification",
        )
        if isinstance(resolved, list):
            errors += resolved
            return None
        return resolved

    async def _cross_checks(
        self,
        session: AsyncSession,
        account_id: str,
        body: dict[str, Any],
        errors: list[FieldError],
    ) -> list[FieldError]:
        """The rules between fields, on the body as sent (every one, with the field rules)."""
        out: list[FieldError] = []
        image, chart = body.get("containerImage"), body.get("helmChart")
        if image is None and chart is None:
            out.append(FieldError("containerImage", "give containerImage or helmChart"))
        elif image is not None and chart is not None:
            out.append(FieldError("helmChart", "give containerImage or helmChart, not both"))
        names = [s.get("name") for s in body.get("secrets") or [] if isinstance(s, dict)]
        repeated = sorted({str(n) for n in names if names.count(n) > 1})
        if repeated:
            out.append(
                FieldError("secrets", f"names must be unique; {', '.join(repeated)} repeated")
            )
        strategy = self._strategy(body)
        if strategy == "UPLOAD" and "resultHandlingStrategy" not in failed(errors):
            target, problems = parse_results_location(body.get("resultsLocation"), self.settings)
            if "resultsLocation" in failed(errors):  # its shape is already told: not twice
                problems = problems[:1] if results_registry(self.settings) is None else []
            out += problems
            if target is not None and not await self._can_push(session, account_id, target, names):
                out.append(
                    FieldError(
                        "secrets",
                        f"resultHandlingStrategy UPLOAD needs credentials to push results: a "
                        f"secret {NGC_API_KEY} (any case) or a MODEL registry credential of the "
                        f"account for {target.host}",
                    )
                )
        elif body.get("resultsLocation") is not None and strategy == "NONE":
            out.append(
                FieldError("resultsLocation", "is only allowed with resultHandlingStrategy UPLOAD")
            )
        telemetries = body.get("telemetries")
        if isinstance(telemetries, dict) and not any(
            f == "telemetries" or f.startswith("telemetries.") for f in failed(errors)
        ):
            # each the account's telemetry receiving its type, as a function version's
            out += await reference_errors(session, account_id, canonical(telemetries))
        return out

    def _strategy(self, body: dict[str, Any]) -> str:
        """The strategy as sent; unnamed, NVCT's UPLOAD, except NONE on a server without a
        results registry when no resultsLocation is given (UPLOAD could only be refused)."""
        named = body.get("resultHandlingStrategy")
        if named is not None:
            return str(named).upper()
        if results_registry(self.settings) is None and body.get("resultsLocation") is None:
            return "NONE"
        return "UPLOAD"

    async def _can_push(
        self, session: AsyncSession, account_id: str, target: ResultsTarget, names: list[Any]
    ) -> bool:
        """NVCT's rule: a secret named NGC_API_KEY in any case, else (here) the account's MODEL
        registry credential for the results registry."""
        if any(isinstance(n, str) and n.upper() == NGC_API_KEY for n in names):
            return True
        stored = await credentials_for_host(
            session, account_id, target.host, box=self.box, artifact_type=ArtifactType.MODEL
        )
        return bool(stored)

    async def _check_quotas(self, session: AsyncSession, account_id: str) -> None:
        async def lock() -> None:
            await lock_account(session, account_id)

        held = await account_quota(session, self.quotas.tasks, account_id)
        await held.check(lambda: repository.count_held(session, account_id), lock)
        active = await account_quota(session, self.quotas.active_tasks, account_id)
        await active.check(lambda: repository.count_active(session, account_id), lock)

    # ------------------------------------------------------------------ reads

    async def owned(self, session: AsyncSession, account_id: str, task_id: uuid.UUID) -> Task:
        task = await repository.get(session, task_id)
        if task is None or task.account_id != account_id or task.deleted:
            raise NotFound(detail=f"task {task_id} not found")
        return task

    async def page(
        self,
        session: AsyncSession,
        account_id: str,
        limit: int | None,
        cursor: str | None,
        status: str | None,
    ) -> tuple[list[Task], int | None, str | None]:
        wanted: TaskStatus | None = None
        if status is not None:
            try:
                wanted = TaskStatus(status.upper())
            except ValueError:
                allowed = ", ".join(s.value for s in TaskStatus)
                raise ValidationFailed.of(
                    [FieldError("status", f"'{status}' is not one of {allowed}")]
                ) from None
        page = make_page(limit or DEFAULT_LIMIT, cursor, DEFAULT_LIMIT)
        rows, next_cursor = await repository.page_of_account(session, account_id, wanted, page)
        return rows, (page.limit if next_cursor else None), next_cursor

    async def bulk(self, session: AsyncSession, account_id: str, raw: Any) -> list[Task]:
        model, errors = parse(BulkTasksIn, require_json_object(raw))
        if errors or model is None:
            raise ValidationFailed.of(errors)
        wanted = list(dict.fromkeys(model.task_ids))
        found = {t.id: t for t in await repository.of_account(session, account_id, wanted)}
        missing = [str(i) for i in wanted if i not in found]
        if missing:  # NVCT validates each id: one unknown (or another account's) is a 404
            noun = "task" if len(missing) == 1 else "tasks"
            raise NotFound(detail=f"{noun} {', '.join(missing)} not found")
        return [found[i] for i in wanted]

    async def events(
        self,
        session: AsyncSession,
        account_id: str,
        task_id: uuid.UUID,
        limit: int | None,
        cursor: str | None,
    ) -> tuple[list[TaskEvent], int | None, str | None]:
        await self.owned(session, account_id, task_id)
        page = make_page(limit or DEFAULT_LIMIT, cursor, DEFAULT_LIMIT)
        rows, next_cursor = await repository.events_page(session, task_id, page)
        return rows, (page.limit if next_cursor else None), next_cursor

    async def results(
        self,
        session: AsyncSession,
        account_id: str,
        task_id: uuid.UUID,
        limit: int | None,
        cursor: str | None,
    ) -> tuple[list[TaskResult], int | None, str | None]:
        await self.owned(session, account_id, task_id)
        page = make_page(limit or DEFAULT_LIMIT, cursor, DEFAULT_LIMIT)
        rows, next_cursor = await repository.results_page(session, task_id, page)
        return rows, (page.limit if next_cursor else None), next_cursor

    # ------------------------------------------------------------------ changes

    async def cancel(self, session: AsyncSession, account_id: str, task_id: uuid.UUID) -> Task:
        task = await self.owned(session, account_id, task_id)
        task = await repository.get_for_update(session, task.id) or task
        if TaskStatus(task.status) not in ACTIVE:
            # NVCT's words (TaskManagementService.MESG_CANCEL_TERMINAL), a 400 as there
            raise BadRequest(
                detail=f"Invalid request: Cannot cancel a Task with '{task.status}' terminal status"
            )
        self._cancel(session, task, "Task canceled by its owner")
        return task

    def _cancel(self, session: AsyncSession, task: Task, message: str) -> None:
        now = self.clock()
        on_cluster = TaskStatus(task.status) in ON_CLUSTER
        if on_cluster:
            grace = java_duration(task.grace_seconds)
            message += f"; the container is asked to stop and killed after {grace}"
            task.stop_requested_at = now
            task.kill_at = now + timedelta(seconds=task.grace_seconds)
        transitions.move(session, task, TaskStatus.CANCELED, now, message)
        after_commit(session, lambda: self.wake(str(task.id)))

    async def delete(self, session: AsyncSession, account_id: str, task_id: uuid.UUID) -> None:
        task = await self.owned(session, account_id, task_id)
        task = await repository.get_for_update(session, task.id) or task
        if TaskStatus(task.status) in ACTIVE:
            self._cancel(session, task, "Task deleted by its owner")
        task.deleted = True
        task.secrets_ciphertext = None
        if not task.teardown_pending:
            await session.flush()
            await repository.remove(session, [task.id])

    async def update_secrets(
        self, session: AsyncSession, account_id: str, task_id: uuid.UUID, raw: Any
    ) -> None:
        model, errors = parse(UpdateSecretsIn, require_json_object(raw))
        if model is not None:
            names = [s.name for s in model.secrets]
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                errors.append(
                    FieldError("secrets", f"names must be unique; {', '.join(repeated)} repeated")
                )
        if errors or model is None:
            raise ValidationFailed.of(errors)
        task = await self.owned(session, account_id, task_id)
        task = await repository.get_for_update(session, task.id) or task
        stored = self.secrets_of(task)
        stored.update({s.name: secret_text(s.value) for s in model.secrets})
        if len(stored) > MAX_SECRETS:
            raise ValidationFailed.of(
                [
                    FieldError(
                        "secrets",
                        f"the task would have {len(stored)} secrets; at most {MAX_SECRETS}",
                    )
                ]
            )
        now = self.clock()
        task.secrets_ciphertext = self.box.encrypt(json.dumps(stored))
        task.secret_names = sorted(stored)
        task.secrets_generation += 1
        transitions.event(session, task, f"Secrets updated: {', '.join(sorted(names))}", now)
        after_commit(session, lambda: self.wake(str(task.id)))

    def secrets_of(self, task: Task) -> dict[str, str]:
        """The task's secrets in plaintext (for its Secret object only)."""
        if not task.secrets_ciphertext:
            return {}
        value = json.loads(self.box.decrypt(task.secrets_ciphertext))
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}

    # ------------------------------------------------------------------ usage

    async def usage(self, session: AsyncSession, account_id: str, nca_id: str) -> list[GpuUsageOut]:
        if nca_id != account_id:
            raise NotFound(detail=f"account {nca_id} not found")
        groups: dict[tuple[str, str], list[Task]] = {}
        for task in await repository.active_of_account(session, account_id):
            groups.setdefault((task.gpu, task.instance_type), []).append(task)
        out: list[GpuUsageOut] = []
        for (gpu, instance_type), tasks in sorted(groups.items()):
            per_cluster: dict[str, int] = {}
            for task in tasks:
                for name in [task.cluster] if task.cluster else task.candidate_clusters:
                    per_cluster[name] = per_cluster.get(name, 0) + 1
            placements = placements_on(
                self.catalog, {name: (n, n) for name, n in per_cluster.items()}
            )
            out.append(
                GpuUsageOut(
                    gpu=gpu,
                    instance_type=instance_type,
                    current_max_usage=len(tasks),
                    current_min_usage=len(tasks),
                    placements=placements,
                )
            )
        return out

    # ------------------------------------------------------------------ views

    def describe(self, task: Task, *, include_secrets: bool = False) -> TaskOut:
        health = None
        group = self._group_name(task)
        if task.health_error:
            health = TaskHealthOut(
                gpu=task.gpu,
                backend=group,
                instance_type=task.instance_type,
                error=task.health_error,
            )
        instances = None
        if task.cluster and task.launched_at is not None:
            cluster = self.catalog.cluster(task.cluster)
            instances = [
                TaskInstanceOut(
                    instance_id=str(task.id),
                    task_id=task.id,
                    instance_type=task.instance_type,
                    instance_state=_instance_state(task),
                    nca_id=task.account_id,
                    gpu=task.gpu,
                    backend=group,
                    location=(cluster.region or task.cluster) if cluster else task.cluster,
                    instance_created_at=task.launched_at,
                    instance_updated_at=task.updated_at,
                )
            ]
        return TaskOut(
            id=task.id,
            nca_id=task.account_id,
            name=task.name,
            status=task.status,
            gpu_specification=TaskGpuSpecificationOut(
                gpu=task.gpu,
                backend=task.backend,
                clusters=task.clusters,
                instance_type=task.instance_type,
                configuration=task.configuration,
                helm_validation_policy=task.helm_validation_policy,
            ),
            container_image=task.container_image,
            container_args=task.container_args,
            container_environment=[TaskKeyValueOut(**e) for e in task.container_environment or []]
            or None,
            models=[TaskArtifactOut(**a) for a in task.models or []] or None,
            resources=[TaskArtifactOut(**a) for a in task.resources or []] or None,
            tags=task.tags or None,
            description=task.description,
            result_handling_strategy=task.result_handling,
            results_location=task.results_location,
            max_runtime_duration=java_duration(task.max_runtime_seconds)
            if task.max_runtime_seconds is not None
            else None,
            max_queued_duration=java_duration(task.max_queued_seconds),
            termination_grace_period_duration=java_duration(task.grace_seconds),
            helm_chart=task.helm_chart,
            health_info=health,
            secrets=list(task.secret_names) if include_secrets else None,
            percent_complete=task.percent_complete,
            last_heartbeat_at=task.last_heartbeat_at,
            last_updated_at=task.updated_at,
            telemetries=task.telemetries,
            created_at=task.created_at,
            instances=instances,
        )

    def _group_name(self, task: Task) -> str:
        name = task.cluster or next(iter(task.candidate_clusters), None)
        cluster = self.catalog.cluster(name) if name else None
        return self.catalog.group_of(cluster).name if cluster else (task.backend or "")


def _instance_state(task: Task) -> str:
    """NVCT's InstanceStateEnum for the task's one instance."""
    if task.status == TaskStatus.LAUNCHED.value:
        return "STARTING"
    if task.status == TaskStatus.RUNNING.value:
        return "RUNNING"
    return "TERMINATED"


def basic(task: Task) -> BasicTaskOut:
    return BasicTaskOut(id=task.id, name=task.name, status=task.status)


def event_out(event: TaskEvent) -> TaskEventOut:
    return TaskEventOut(
        event_id=event.id,
        task_id=event.task_id,
        nca_id=event.account_id,
        message=event.message,
        created_at=event.created_at,
    )


def result_out(result: TaskResult) -> TaskResultOut:
    return TaskResultOut(
        result_id=result.id,
        task_id=result.task_id,
        nca_id=result.account_id,
        name=result.name,
        metadata=result.metadata_ or {},
        created_at=result.created_at,
        reference=result.reference,
        digest=result.digest,
    )


def _policy_shown(policy: HelmValidationPolicyIn | None) -> dict[str, Any] | None:
    """The policy as NVCT echoes it: extraKubernetesTypes only when some were given."""
    if policy is None:
        return None
    return {k: v for k, v in policy.stored().items() if v}


def _seconds(value: str | None) -> float | None:
    return parse_timedelta(value).total_seconds() if value is not None else None


def _dump(items: list[Any] | None) -> list[Any] | None:
    if items is None:
        return None
    return [i.model_dump(mode="json", exclude={"shape"}) for i in items]


def _dump_one(item: Any) -> dict[str, Any] | None:
    return item.model_dump(mode="json", by_alias=True, exclude_none=True) if item else None


async def known_task_ids(maker: async_sessionmaker[AsyncSession]) -> frozenset[str]:
    """Every task id: the namespace collector spares their namespaces."""
    async with maker() as session:
        return frozenset(str(i) for i in await repository.known_ids(session))
