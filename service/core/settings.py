"""Service settings (operations.md §2): environment variables prefixed `NVCF_`, or a `.env` file."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

CommaList = Annotated[frozenset[str], NoDecode]


def _split(value: object) -> object:
    if isinstance(value, str):
        return frozenset(p.strip().lower() for p in value.split(",") if p.strip())
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="NVCF_", env_file=".env", extra="ignore", frozen=True
    )

    data_dir: Path = Path("./.nvcf")
    database_url: str | None = None
    clusters_file: Path | None = None
    default_account: str = Field(default="nvcf-default", min_length=1, max_length=128)
    bootstrap_api_key: SecretStr | None = None
    jwt_secret: SecretStr | None = None
    jwks_url: str | None = None
    jwks_file: Path | None = None
    secrets_key: SecretStr | None = None
    registry_allowlist: CommaList = frozenset()
    insecure_registries: CommaList = frozenset()
    helm_enforce_security: bool = False
    chart_max_bytes: int = Field(default=10 * 1024 * 1024, gt=0)
    chart_max_unpacked_bytes: int = Field(default=50 * 1024 * 1024, gt=0)
    render_timeout: float = Field(default=30.0, gt=0)
    render_workers: int = Field(default=2, ge=1, le=64)
    render_memory_limit_bytes: int = Field(default=1024 * 1024 * 1024, ge=0)
    # False forces Helm's install action for every chart (service/charts/helm_engine.py).
    helm_engine_path: bool = True
    chart_cache_max_bytes: int = Field(default=2 * 1024 * 1024 * 1024, gt=0)
    chart_fetch_timeout: float = Field(default=30.0, gt=0)
    default_kube_version: str = Field(default="1.30.0", pattern=r"^v?\d+\.\d+(\.\d+)?$")
    # Per-account quotas (service/core/quotas.py); instances count maxInstances of live
    # deployments.
    quota_functions: int = Field(default=1000, ge=1)
    quota_versions_per_function: int = Field(default=100, ge=1)
    quota_instances: int = Field(default=1000, ge=1)
    quota_registry_credentials: int = Field(default=50, ge=1)
    quota_api_keys: int = Field(default=100, ge=1)
    # Per-account API rate limit: `rate_limit_burst` requests at once, `rate_limit_per_second`
    # on average (0 disables); counters in Redis when `redis_url` is set (shared by replicas).
    rate_limit_per_second: float = Field(default=100.0, ge=0)
    rate_limit_burst: int = Field(default=1000, ge=1)
    redis_url: str | None = Field(default=None, pattern=r"^rediss?://")
    # The version read cache and its fast path (service/functions/read_cache.py); effective
    # with SQLite only, where one process sees every commit.
    version_read_cache: bool = True
    reconcile_interval: float = Field(default=2.0, gt=0)
    reconciler_enabled: bool = True
    reconcile_lease_seconds: float = Field(default=60.0, gt=0)
    reconcile_resync_seconds: float = Field(default=10.0, ge=0)
    reconcile_concurrency: int = Field(default=8, ge=1, le=256)
    # Deployments claimed and finished together in one unit of work (one transaction each).
    reconcile_batch_size: int = Field(default=50, ge=1, le=1000)
    # Garbage collection of orphaned instance namespaces (0 disables it).
    reconcile_gc_seconds: float = Field(default=300.0, ge=0)
    reconcile_gc_timeout_seconds: float = Field(default=60.0, gt=0)
    reconcile_gc_min_age_seconds: float = Field(default=120.0, ge=0)
    health_pod_scheduling_timeout: float = Field(default=600, ge=0)
    health_image_pull_timeout: float = Field(default=60, ge=0)
    health_restart_loop_timeout: float = Field(default=600, ge=0)
    health_init_timeout: float = Field(default=7200, ge=0)
    health_worker_startup_timeout: float = Field(default=7200, ge=0)
    health_worker_degradation_period: float = Field(default=1800, ge=0)
    health_pending_timeout: float = Field(default=10800, ge=0)
    health_failing_backoff: float = Field(default=90, ge=0)
    log_format: Literal["text", "json"] = "text"
    auto_migrate: bool = True
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    # Connection bounds (service/core/server.py), in seconds: a request head must arrive within
    # `http_header_timeout` of its first byte (or of the connection opening), its body within
    # `http_body_timeout` of the head; an idle kept-alive connection closes after
    # `http_keepalive_timeout`; at most `http_max_connections` are open at once (fewer when the
    # file-descriptor limit is lower), each one beyond is answered 503 and closed.
    http_header_timeout: float = Field(default=10.0, gt=0)
    http_body_timeout: float = Field(default=60.0, gt=0)
    http_keepalive_timeout: float = Field(default=5.0, gt=0)
    http_max_connections: int = Field(default=1000, ge=1)
    idempotency_ttl_seconds: int = Field(default=24 * 3600, gt=0)

    @field_validator("registry_allowlist", "insecure_registries", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        return _split(value)

    @field_validator("bootstrap_api_key")
    @classmethod
    def _bootstrap_shape(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith("nvapi-"):
            raise ValueError("must start with 'nvapi-'")
        return value

    @field_validator("database_url")
    @classmethod
    def _db_driver(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+psycopg://")):
            raise ValueError("must start with 'sqlite+aiosqlite://' or 'postgresql+psycopg://'")
        return value

    @cached_property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'nvcf.db').resolve()}"


def settings_error_line(exc: Exception) -> str:
    """One line naming the bad setting(s), for start-up failures."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            parts.append(f"NVCF_{loc.upper()}: {err['msg']}")
        return "invalid setting: " + "; ".join(parts)
    return f"invalid setting: {exc}"
