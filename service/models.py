"""Every table, imported in one place for Alembic and the app."""

from service.assets.models import Asset
from service.auth.models import Account, ApiKey
from service.core.db import Base
from service.core.idempotency import IdempotencyRecord
from service.deployments.models import (
    CanaryFigures,
    CanaryRelease,
    Deployment,
    DeploymentEvent,
    DeploymentHistory,
    DeploymentSpec,
    Instance,
    KeptLog,
    LoadReporter,
    ReportedLoad,
    TrafficWeight,
)
from service.functions.models import (
    Function,
    FunctionAuthorization,
    FunctionSecret,
    FunctionVersion,
    VersionTag,
)
from service.invocation.models import InvocationReplica, InvocationRequest
from service.metering.models import GpuInterval, UsageCount
from service.observability.models import Telemetry
from service.registry.models import RegistryCredential, RegistryCredentialArtifactType
from service.tasks.models import Task, TaskEvent, TaskResult

__all__ = [
    "Account",
    "ApiKey",
    "Asset",
    "Base",
    "CanaryFigures",
    "CanaryRelease",
    "Deployment",
    "DeploymentEvent",
    "DeploymentHistory",
    "DeploymentSpec",
    "Function",
    "FunctionAuthorization",
    "FunctionSecret",
    "FunctionVersion",
    "GpuInterval",
    "IdempotencyRecord",
    "Instance",
    "InvocationReplica",
    "InvocationRequest",
    "KeptLog",
    "LoadReporter",
    "RegistryCredential",
    "RegistryCredentialArtifactType",
    "ReportedLoad",
    "Task",
    "TaskEvent",
    "TaskResult",
    "Telemetry",
    "TrafficWeight",
    "UsageCount",
    "VersionTag",
]
