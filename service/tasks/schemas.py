"""Request and response shapes of the task routes, as NVCT's DTOs (CreateTaskRequest,
TaskDto in TaskResponse{task}, ListTasksResponse, BulkTaskDetailsRequest,
ListBasicTaskDetailsResponse, EventDto, ResultDto, UpdateSecretsRequest, GpuUsageDto).

Durations are ISO-8601 on the wire and written back as Java's `Duration.toString()`
(`PT72H`, `PT1H30M`), as NVCT answers them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, ClassVar

from pydantic import Field

from service.charts.schemas import HelmValidationPolicyIn
from service.clusters.catalog import Catalog
from service.core.durations import DurationError, parse_timedelta
from service.core.schemas import CamelModel, Tags, Timestamp
from service.core.validation import Check, Expect, MaxItems, OneOf, RequestModel, matches
from service.functions.requests import (
    MAX_ARTIFACTS,
    MAX_ENVIRONMENT,
    MAX_SECRETS,
    NAME_RE,
    ArtifactIn,
    KeyValueIn,
    SecretIn,
    TelemetriesIn,
)

RESULT_STRATEGIES = ("UPLOAD", "NONE")
#: NVCT's defaults
DEFAULT_MAX_QUEUED = timedelta(hours=72)
DEFAULT_GRACE = timedelta(hours=1)
#: no duration of a task may be longer (bounds every clock a client sets)
MAX_DURATION = timedelta(days=366)
#: `<org>/[<team>/]<model>`, as NVCT documents resultsLocation
RESULTS_LOCATION_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*){1,2}$")
#: task ids one bulk request may name
MAX_BULK_IDS = 1000


def _duration(value: str) -> str | None:
    try:
        parsed = parse_timedelta(value)
    except DurationError:
        return f"'{value}' is not an ISO-8601 duration such as PT4H30M (no years or months)"
    if parsed <= timedelta(0):
        return f"'{value}' must be longer than zero"
    if parsed > MAX_DURATION:
        return f"'{value}' is longer than the longest allowed, P366D"
    return None


Duration = Annotated[
    str,
    Expect((str,), "must be an ISO-8601 duration such as PT4H30M"),
    Field(max_length=64),
    Check(_duration, {"format": "duration", "examples": ["PT4H30M"]}),
]
TaskName = Annotated[
    str,
    Field(min_length=1, max_length=128),
    matches(
        NAME_RE.pattern,
        "'{value}' must start with a letter or digit and contain only letters, digits, '-' and '_'",
    ),
]


def java_duration(seconds: float) -> str:
    """`Duration.toString()` of Java, which NVCT answers with: PT72H, PT1H30M, PT0.5S."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    fraction = seconds - whole
    out = "PT"
    if hours:
        out += f"{hours}H"
    if minutes:
        out += f"{minutes}M"
    if secs or fraction or out == "PT":
        out += f"{secs + fraction:g}S"
    return out


class TaskGpuSpecificationIn(RequestModel):
    null_when_missing: ClassVar[tuple[str, ...]] = ()
    shape: ClassVar[str] = "with gpu and instanceType"

    gpu: str = Field(min_length=1, max_length=64)
    instance_type: str = Field(min_length=1, max_length=128)
    backend: str | None = Field(default=None, min_length=1, max_length=128)
    clusters: (
        Annotated[
            list[Annotated[str, Field(min_length=1, max_length=128)]],
            MaxItems(64),
            Expect((list,), "must be a list of cluster names"),
        ]
        | None
    ) = None
    configuration: dict[str, Any] | None = None
    helm_validation_policy: HelmValidationPolicyIn | None = None


class CreateTaskIn(RequestModel):
    """Body of `POST /v1/nvct/tasks` (NVCT's CreateTaskRequest)."""

    name: TaskName
    gpu_specification: TaskGpuSpecificationIn
    container_image: str | None = Field(default=None, min_length=1, max_length=1024)
    container_args: str | None = Field(default=None, max_length=4096)
    container_environment: (
        Annotated[
            list[KeyValueIn],
            MaxItems(MAX_ENVIRONMENT),
            Expect((list,), "must be a list of {key, value}"),
        ]
        | None
    ) = None
    models: (
        Annotated[
            list[ArtifactIn],
            MaxItems(MAX_ARTIFACTS),
            Expect((list,), "must be a list of {name, version, uri}"),
        ]
        | None
    ) = Field(
        default=None,
        description="Recorded and shown on the task, not downloaded (as a function's "
        "`models`): the container's `/config/models` is an empty directory it may "
        "fill itself.",
    )
    resources: (
        Annotated[
            list[ArtifactIn],
            MaxItems(MAX_ARTIFACTS),
            Expect((list,), "must be a list of {name, version, uri}"),
        ]
        | None
    ) = Field(
        default=None,
        description="Recorded and shown on the task, not downloaded (as a function's "
        "`resources`): the container's `/config/resources` is an empty directory it may "
        "fill itself.",
    )
    tags: Tags | None = None
    description: str | None = Field(default=None, max_length=256)
    max_runtime_duration: Duration | None = None
    max_queued_duration: Duration | None = None
    termination_grace_period_duration: Duration | None = None
    result_handling_strategy: Annotated[str, OneOf(RESULT_STRATEGIES, "UPLOAD")] = "UPLOAD"
    results_location: (
        Annotated[
            str,
            Field(max_length=512),
            matches(
                RESULTS_LOCATION_RE.pattern,
                "'{value}' must be <org>/[<team>/]<model>: lower-case letters, digits, '.', "
                "'_' and '-'",
            ),
        ]
        | None
    ) = None
    helm_chart: str | None = Field(default=None, min_length=1, max_length=2048)
    telemetries: TelemetriesIn | None = None
    secrets: (
        Annotated[
            list[SecretIn],
            MaxItems(MAX_SECRETS),
            Expect((list,), "must be a list of {name, value}"),
        ]
        | None
    ) = None


class BulkTasksIn(RequestModel):
    """Body of `POST /v1/nvct/tasks/bulk`."""

    null_when_missing: ClassVar[tuple[str, ...]] = ("taskIds",)

    task_ids: Annotated[
        list[uuid.UUID],
        Check(
            lambda v: (
                None if isinstance(v, list) and v else "is required: a non-empty list of task ids"
            ),
            before=True,
        ),
        MaxItems(MAX_BULK_IDS),
    ]


class UpdateSecretsIn(RequestModel):
    """Body of `PUT /v1/nvct/secrets/tasks/{taskId}`."""

    null_when_missing: ClassVar[tuple[str, ...]] = ("secrets",)

    secrets: Annotated[
        list[SecretIn],
        Check(
            lambda v: (
                None
                if isinstance(v, list) and v
                else "is required: a non-empty list of {name, value}"
            ),
            before=True,
        ),
        MaxItems(MAX_SECRETS),
    ]


# ------------------------------------------------------------------------------ responses


class TaskGpuSpecificationOut(CamelModel):
    gpu: str
    backend: str | None = None
    clusters: list[str] | None = None
    instance_type: str
    configuration: dict[str, Any] | None = None
    helm_validation_policy: dict[str, Any] | None = None


class TaskKeyValueOut(CamelModel):
    key: str
    value: str


class TaskArtifactOut(CamelModel):
    name: str
    version: str
    uri: str


class TaskHealthOut(CamelModel):
    gpu: str
    backend: str
    instance_type: str | None = None
    error: str


class TaskInstanceOut(CamelModel):
    instance_id: str
    task_id: uuid.UUID
    instance_type: str
    instance_state: str
    nca_id: str
    gpu: str
    backend: str
    location: str
    #: NVCT's id of the ICMS request behind the instance: none for a self-hosted instance
    icms_request_id: str | None = None
    instance_created_at: Timestamp
    instance_updated_at: Timestamp


class TaskOut(CamelModel):
    id: uuid.UUID
    nca_id: str
    name: str
    status: str
    gpu_specification: TaskGpuSpecificationOut
    container_image: str | None = None
    container_args: str | None = None
    container_environment: list[TaskKeyValueOut] | None = None
    models: list[TaskArtifactOut] | None = None
    resources: list[TaskArtifactOut] | None = None
    tags: list[str] | None = None
    description: str | None = None
    result_handling_strategy: str
    results_location: str | None = None
    max_runtime_duration: str | None = None
    max_queued_duration: str
    termination_grace_period_duration: str
    helm_chart: str | None = None
    health_info: TaskHealthOut | None = None
    secrets: list[str] | None = Field(
        default=None, description="secret names, only with includeSecrets=true"
    )
    percent_complete: int | None = None
    last_heartbeat_at: Timestamp | None = None
    last_updated_at: Timestamp | None = None
    telemetries: dict[str, Any] | None = None
    created_at: Timestamp
    instances: list[TaskInstanceOut] | None = None


class TaskResponse(CamelModel):
    task: TaskOut


class ListTasksResponse(CamelModel):
    tasks: list[TaskOut]
    limit: int | None = Field(default=None, description="absent from the last slice")
    cursor: str | None = Field(default=None, description="absent from the last slice")


class BasicTaskOut(CamelModel):
    id: uuid.UUID
    name: str
    status: str


class ListBasicTasksResponse(CamelModel):
    nca_id: str
    tasks: list[BasicTaskOut]


class TaskEventOut(CamelModel):
    event_id: uuid.UUID
    task_id: uuid.UUID
    nca_id: str
    message: str
    created_at: Timestamp


class ListEventsResponse(CamelModel):
    events: list[TaskEventOut]
    limit: int | None = None
    cursor: str | None = None


class TaskResultOut(CamelModel):
    result_id: uuid.UUID
    task_id: uuid.UUID
    nca_id: str
    name: str
    metadata: dict[str, Any]
    created_at: Timestamp
    #: beyond NVCT (UPLOAD): where the result was pushed
    reference: str | None = None
    digest: str | None = None


class ListResultsResponse(CamelModel):
    results: list[TaskResultOut]
    limit: int | None = None
    cursor: str | None = None


class GpuPlacementOut(CamelModel):
    cluster_id: str
    cluster: str
    cluster_group_id: str
    cluster_group: str
    cloud_provider: str
    region: str
    current_max_usage: int
    current_min_usage: int


def placements_on(
    catalog: Catalog, per_cluster: Mapping[str, tuple[int, int]]
) -> list[GpuPlacementOut]:
    """NVCF's placement rows, by cluster name: (most, least) usage on each cluster the
    catalog knows (a name it no longer knows is left out)."""
    placements = []
    for name, (most, least) in sorted(per_cluster.items()):
        cluster = catalog.cluster(name)
        if cluster is None:
            continue
        group = catalog.group_of(cluster)
        placements.append(
            GpuPlacementOut(
                cluster_id=cluster.name,
                cluster=cluster.name,
                cluster_group_id=group.name,
                cluster_group=group.name,
                cloud_provider=cluster.provider,
                region=cluster.region or "",
                current_max_usage=most,
                current_min_usage=least,
            )
        )
    return placements


class GpuUsageOut(CamelModel):
    gpu: str
    instance_type: str
    current_max_usage: int
    current_min_usage: int
    placements: list[GpuPlacementOut]


class ListGpuUsageResponse(CamelModel):
    gpus: list[GpuUsageOut]
