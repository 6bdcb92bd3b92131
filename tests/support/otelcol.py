"""Our own model of the OpenTelemetry Collector configuration parts the platform generates
(service/observability/collector.py).

The collector publishes no configuration schema (each component's Go struct is its schema,
checked only by the collector binary), and no contrib binary is available offline here, so the
generated configuration is checked against this model: every key of the components we use, as
the contrib components name them (unknown keys refused), plus the rules the collector applies
between sections (a pipeline's components defined, an authenticator an enabled extension,
each `${env:NAME}` one the sidecar's Secret provides).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Endpoint(Strict):
    endpoint: str


class OtlpProtocols(Strict):
    grpc: Endpoint
    http: Endpoint


class OtlpReceiver(Strict):
    protocols: OtlpProtocols


class FilelogReceiver(Strict):
    include: list[str]
    exclude: list[str] = []
    start_at: Literal["beginning", "end"]
    include_file_path: bool
    storage: str | None = None
    operators: list[dict[str, Any]]


class MemoryLimiter(Strict):
    check_interval: str
    limit_percentage: int = Field(gt=0, le=100)
    spike_limit_percentage: int = Field(gt=0, le=100)


class Action(Strict):
    key: str
    value: str
    action: Literal["insert", "update", "upsert", "delete"]


class ResourceProcessor(Strict):
    attributes: list[Action]


class Batch(Strict):
    pass


class Queue(Strict):
    enabled: bool
    queue_size: int = Field(gt=0)


class Retry(Strict):
    enabled: bool
    max_elapsed_time: str


class Authenticator(Strict):
    authenticator: str


class Tls(Strict):
    insecure: bool


class OtlpHttpExporter(Strict):
    endpoint: str
    headers: dict[str, str] = {}
    auth: Authenticator | None = None
    timeout: str
    sending_queue: Queue
    retry_on_failure: Retry


class OtlpGrpcExporter(OtlpHttpExporter):
    tls: Tls


class ClientTls(Strict):
    """configtls's client settings with inline PEMs (a client certificate, the CAs)."""

    cert_pem: str
    key_pem: str
    ca_pem: str | None = None


class RemoteWriteExporter(Strict):
    endpoint: str
    headers: dict[str, str] = {}
    auth: Authenticator | None = None
    tls: ClientTls | None = None
    resource_to_telemetry_conversion: dict[Literal["enabled"], bool]
    timeout: str
    remote_write_queue: Queue
    retry_on_failure: Retry


class DatadogApi(Strict):
    key: str
    site: str | None = None


class DatadogExporter(Strict):
    api: DatadogApi
    metrics: Endpoint | None = None
    logs: Endpoint | None = None
    timeout: str
    sending_queue: Queue
    retry_on_failure: Retry


class ClientAuth(Strict):
    username: str
    password: str


class BasicAuth(Strict):
    client_auth: ClientAuth


class Pipeline(Strict):
    receivers: list[str] = Field(min_length=1)
    processors: list[str]
    exporters: list[str] = Field(min_length=1)


class PrometheusPull(Strict):
    host: str
    port: int


class Reader(Strict):
    pull: dict[Literal["exporter"], dict[Literal["prometheus"], PrometheusPull]]


class MetricsTelemetry(Strict):
    readers: list[Reader]


class ServiceTelemetry(Strict):
    metrics: MetricsTelemetry


class Service(Strict):
    extensions: list[str]
    pipelines: dict[Literal["logs", "metrics", "traces"], Pipeline]
    telemetry: ServiceTelemetry


class Config(Strict):
    receivers: dict[str, Any]
    processors: dict[str, Any]
    exporters: dict[str, Any]
    extensions: dict[str, Any]
    service: Service


RECEIVERS: dict[str, type[BaseModel]] = {"otlp": OtlpReceiver, "file_log": FilelogReceiver}
PROCESSORS: dict[str, type[BaseModel]] = {
    "memory_limiter": MemoryLimiter,
    "resource": ResourceProcessor,
    "batch": Batch,
}
EXPORTERS: dict[str, type[BaseModel]] = {
    "otlp_http": OtlpHttpExporter,
    "otlp_grpc": OtlpGrpcExporter,
    "prometheus_remote_write": RemoteWriteExporter,
    "datadog": DatadogExporter,
}


class FileStorage(Strict):
    directory: str


EXTENSIONS: dict[str, type[BaseModel]] = {
    "health_check": Endpoint,
    "basicauth": BasicAuth,
    "file_storage": FileStorage,
}
#: a component id: `type[/name]`, as the collector parses it
COMPONENT_ID = re.compile(r"^[a-z][a-z0-9_]*(/[^\s/]+)?$")
ENV_REF = re.compile(r"(?<!\$)\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def _components(section: Mapping[str, Any], kinds: Mapping[str, type[BaseModel]]) -> None:
    for component_id, body in section.items():
        assert COMPONENT_ID.match(component_id), component_id
        kind = component_id.split("/", 1)[0]
        assert kind in kinds, f"{component_id}: not a component the platform generates"
        kinds[kind].model_validate(body if body is not None else {})


def env_names(value: Any) -> set[str]:
    """Every `${env:NAME}` the configuration expands (a `$${...}` is literal)."""
    if isinstance(value, dict):
        return {n for v in value.values() for n in env_names(v)}
    if isinstance(value, list):
        return {n for v in value for n in env_names(v)}
    return set(ENV_REF.findall(value)) if isinstance(value, str) else set()


def validate(config: Mapping[str, Any], env: set[str]) -> Config:
    """The configuration checked as the collector would check it, `env` the variables set."""
    model = Config.model_validate(config)
    _components(model.receivers, RECEIVERS)
    _components(model.processors, PROCESSORS)
    _components(model.exporters, EXPORTERS)
    _components(model.extensions, EXTENSIONS)
    for name in model.service.extensions:
        assert name in model.extensions, f"service.extensions: {name} is not defined"
    for kind, pipeline in model.service.pipelines.items():
        for section, names in (
            (model.receivers, pipeline.receivers),
            (model.processors, pipeline.processors),
            (model.exporters, pipeline.exporters),
        ):
            for name in names:
                assert name in section, f"pipeline {kind}: {name} is not defined"
    for exporter in model.exporters.values():
        auth = (exporter or {}).get("auth")
        if auth is not None:
            assert auth["authenticator"] in model.service.extensions
    storage = (model.receivers.get("file_log") or {}).get("storage")
    if storage is not None:
        assert storage in model.service.extensions, f"file_log: {storage} is not enabled"
    used = {n for p in model.service.pipelines.values() for n in p.exporters}
    assert used == set(model.exporters), "an exporter in no pipeline"
    missing = env_names(config) - env
    assert not missing, f"variables not provided: {sorted(missing)}"
    return model
