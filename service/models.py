"""Every table, imported in one place for Alembic and the app."""

from service.auth.models import Account, ApiKey
from service.core.db import Base
from service.core.idempotency import IdempotencyRecord
from service.deployments.models import Deployment, DeploymentEvent, DeploymentSpec, Instance
from service.functions.models import Function, FunctionSecret, FunctionVersion, VersionTag
from service.invocation.models import InvocationReplica, InvocationRequest
from service.registry.models import RegistryCredential

__all__ = [
    "Account",
    "ApiKey",
    "Base",
    "Deployment",
    "DeploymentEvent",
    "DeploymentSpec",
    "Function",
    "FunctionSecret",
    "FunctionVersion",
    "IdempotencyRecord",
    "Instance",
    "InvocationReplica",
    "InvocationRequest",
    "RegistryCredential",
    "VersionTag",
]
