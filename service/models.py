"""Every table, imported in one place for Alembic and the app."""

from service.auth.models import Account, ApiKey
from service.core.db import Base
from service.core.idempotency import IdempotencyRecord
from service.functions.models import Function, FunctionSecret, FunctionVersion, VersionTag

__all__ = [
    "Account",
    "ApiKey",
    "Base",
    "Function",
    "FunctionSecret",
    "FunctionVersion",
    "IdempotencyRecord",
    "VersionTag",
]
