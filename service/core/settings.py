"""Service settings (operations.md §2): environment variables prefixed `NVCF_`, or a `.env` file.

Its fields are written in three parts, in the order of docs/configuration.md: the platform
(settings_platform.py), the deployments (settings_deployments.py), serving
(settings_serving.py); the rules that read the values whole are here.
"""

from __future__ import annotations

import ipaddress
import re
from functools import cached_property
from pathlib import Path

from pydantic import SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.core.settings_deployments import DeploymentSettings
from service.core.settings_platform import PlatformSettings, comma_list
from service.core.settings_serving import ServingSettings

#: `host[:port][/path]`: a DNS name, IPv4 or bracketed IPv6 literal, then OCI path components
_RESULTS_REGISTRY_RE = re.compile(
    r"^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"
    r"|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)


# the parts in reverse: pydantic orders the fields from the last base to the first
class Settings(ServingSettings, DeploymentSettings, PlatformSettings, BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="NVCF_", env_file=".env", extra="ignore", frozen=True
    )

    @field_validator(
        "registry_allowlist",
        "insecure_registries",
        "worker_utils_image_registries",
        "telemetry_allowlist",
        mode="before",
    )
    @classmethod
    def _comma_list(cls, value: object) -> object:
        return comma_list(value)

    @field_validator("admin_token_networks", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        split = comma_list(value)
        for network in split if isinstance(split, frozenset) else ():
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as exc:
                raise ValueError(f"not a network (CIDR): {network!r}") from exc
        return split

    @field_validator("invoke_host_suffix")
    @classmethod
    def _host_suffix(cls, value: str | None) -> str | None:
        if value is None or not value.strip(". "):
            return None
        return value.strip(". ").lower()

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

    @field_validator("otel_endpoint", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("asset_s3_bucket", "asset_s3_endpoint_url", "asset_public_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("task_results_registry", mode="before")
    @classmethod
    def _results_registry(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        text = value.strip().rstrip("/").lower()
        if not text:
            return None
        if not _RESULTS_REGISTRY_RE.match(text):
            raise ValueError(
                "must be host[:port] with an optional /path (lower-case letters and digits "
                "separated by '.', '_', '__' or '-'), without a scheme, e.g. "
                "'registry.example.com:5000/nvct-results'"
            )
        return text

    @model_validator(mode="after")
    def _s3_needs_bucket(self) -> Settings:
        if self.asset_storage == "s3" and self.asset_s3_bucket is None:
            raise ValueError("NVCF_ASSET_STORAGE=s3 needs NVCF_ASSET_S3_BUCKET")
        if (self.asset_s3_access_key_id is None) != (self.asset_s3_secret_access_key is None):
            raise ValueError(
                "NVCF_ASSET_S3_ACCESS_KEY_ID and NVCF_ASSET_S3_SECRET_ACCESS_KEY go together"
            )
        return self

    @property
    def asset_files_root(self) -> Path:
        """Where per-request asset and output directories are made."""
        return self.asset_files_dir or self.data_dir / "request-files"

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
