"""The OpenTelemetry Collector configuration of a Kubernetes workload that names telemetries
(its sidecar: backends/collector_pod.py), generated from the telemetries and their keys.

- Receivers: OTLP on the reserved ports of the pod's loopback (gRPC 14357, HTTP 14358), and
  `file_log` of the pod's own container log files (the collector's own excluded; how far each
  was read kept by `file_storage` in the pod, so a restarted collector sends no line twice).
- Processors: `memory_limiter`, `resource` (the workload's function, version, instance and
  account set over whatever the container sends, so nothing is labelled as another
  account's), `batch`.
- Exporters, one per telemetry, by provider: `otlp_http` / `otlp_grpc` (OTEL_COLLECTOR: a bearer
  key; GRAFANA_CLOUD: basic auth `instanceId:token` through a `basicauth` extension),
  `prometheus_remote_write` (PROMETHEUS, VICTORIAMETRICS, KRATOS_THANOS: a bearer key, or
  client certificates as `tls` inline PEMs; the resource attributes as labels), `datadog`
  (DATADOG: by site name, or an intake URL). Each with a bounded queue, bounded retries and a
  timeout.
- One pipeline per type (logs, metrics, traces) a telemetry receives.

Keys appear only as `${env:NAME}` (the sidecar takes them from a Secret); every other string
taken from the tenant or the database has its `$` doubled, so an endpoint cannot name another
variable. The collector's own metrics are on 18888, its health check on 13133 (loopback).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.ext.asyncio import AsyncSession

from service.backends.collector_pod import CONTAINER_NAME, LOGS_DIR, STATE_DIR, TelemetrySidecar
from service.core.crypto import SecretBox
from service.observability import mtls, repository
from service.observability.models import Kind, Protocol, Provider, Telemetry
from service.observability.references import FIELDS
from service.observability.service import key_of
from service.observability.wires import Wire, target_of, wire_of

log = logging.getLogger("nvcf.observability")

OTLP_GRPC_PORT = 14357
OTLP_HTTP_PORT = 14358
METRICS_PORT = 18888
HEALTH_PORT = 13133
LOOPBACK = "127.0.0.1"
#: seconds of one export request; how long a failing batch is retried before it is dropped
TIMEOUT = "10s"
RETRY_FOR = "60s"
#: batches waiting per exporter (beyond: dropped, counted in the collector's own metrics)
QUEUE_SIZE = 1000
PROCESSORS = ["memory_limiter", "resource", "batch"]


@dataclass(frozen=True)
class Named:
    """A telemetry a workload names, its key, and the types the workload sends it."""

    telemetry: Telemetry
    key: str
    kinds: frozenset[Kind]


def literal(text: str) -> str:
    """`text` as the collector reads it literally (no `${...}` expansion)."""
    return text.replace("$", "$$")


def _env(name: str) -> str:
    return "${env:" + name + "}"


def _common() -> dict[str, Any]:
    return {
        "timeout": TIMEOUT,
        "sending_queue": {"enabled": True, "queue_size": QUEUE_SIZE},
        "retry_on_failure": {"enabled": True, "max_elapsed_time": RETRY_FOR},
    }


def _exporter(
    n: int, named: Named, keys: dict[str, str], extensions: dict[str, Any]
) -> tuple[str, dict[str, Any]] | None:
    """The exporter of one telemetry (its keys and extensions added), or None without a wire."""
    telemetry = named.telemetry
    provider = Provider(telemetry.provider)
    wire = wire_of(provider)
    target, _ = target_of(provider, telemetry.endpoint)
    if wire is None or target is None:
        return None
    key_env = f"NVCF_TELEMETRY_{n}_KEY"
    name = str(telemetry.id)
    if wire is Wire.DATADOG:
        keys[key_env] = named.key
        config: dict[str, Any] = {"api": {"key": _env(key_env)}, **_common()}
        if target.site:
            config["api"]["site"] = target.host.removeprefix("api.")
        else:
            config["metrics"] = {"endpoint": literal(target.url)}
            config["logs"] = {"endpoint": literal(target.url)}
        return f"datadog/{name}", config
    auth: dict[str, Any] = {}
    client = mtls.of_key(named.key) if wire is Wire.REMOTE_WRITE else None
    if client is not None:  # the client certificate authenticates (configtls's inline PEMs)
        keys[f"NVCF_TELEMETRY_{n}_CERT"], keys[f"NVCF_TELEMETRY_{n}_CERT_KEY"] = (
            client.cert,
            client.key,
        )
        tls = {
            "cert_pem": _env(f"NVCF_TELEMETRY_{n}_CERT"),
            "key_pem": _env(f"NVCF_TELEMETRY_{n}_CERT_KEY"),
        }
        if client.ca:
            keys[f"NVCF_TELEMETRY_{n}_CA"] = client.ca
            tls["ca_pem"] = _env(f"NVCF_TELEMETRY_{n}_CA")
        auth = {"tls": tls}
    elif provider is Provider.GRAFANA_CLOUD:
        user, _, password = named.key.partition(":")
        keys[f"NVCF_TELEMETRY_{n}_USER"], keys[f"NVCF_TELEMETRY_{n}_PASSWORD"] = user, password
        extensions[f"basicauth/{name}"] = {
            "client_auth": {
                "username": _env(f"NVCF_TELEMETRY_{n}_USER"),
                "password": _env(f"NVCF_TELEMETRY_{n}_PASSWORD"),
            }
        }
        auth = {"auth": {"authenticator": f"basicauth/{name}"}}
    else:
        keys[key_env] = named.key
        auth = {"headers": {"Authorization": "Bearer " + _env(key_env)}}
    if wire is Wire.REMOTE_WRITE:
        return f"prometheus_remote_write/{name}", {
            "endpoint": literal(target.url),
            "resource_to_telemetry_conversion": {"enabled": True},
            "timeout": TIMEOUT,
            "remote_write_queue": {"enabled": True, "queue_size": QUEUE_SIZE},
            "retry_on_failure": {"enabled": True, "max_elapsed_time": RETRY_FOR},
            **auth,
        }
    if Protocol(telemetry.protocol) is Protocol.GRPC:
        host = f"[{target.host}]" if ":" in target.host else target.host
        return f"otlp_grpc/{name}", {
            "endpoint": literal(f"{host}:{target.port}"),
            "tls": {"insecure": urlsplit(target.url).scheme == "http"},
            **auth,
            **_common(),
        }
    return f"otlp_http/{name}", {"endpoint": literal(target.url.rstrip("/")), **auth, **_common()}


def _receivers() -> dict[str, Any]:
    return {
        "otlp": {
            "protocols": {
                "grpc": {"endpoint": f"{LOOPBACK}:{OTLP_GRPC_PORT}"},
                "http": {"endpoint": f"{LOOPBACK}:{OTLP_HTTP_PORT}"},
            }
        },
        "file_log": {
            "include": [f"{LOGS_DIR}/*/*.log"],
            "exclude": [f"{LOGS_DIR}/{CONTAINER_NAME}/*.log"],
            "start_at": "beginning",
            "include_file_path": True,
            "storage": "file_storage",
            "operators": [
                {"type": "container", "add_metadata_from_filepath": False},
                {
                    "type": "regex_parser",
                    "parse_from": 'attributes["log.file.path"]',
                    "regex": f"^{LOGS_DIR}/(?P<container>[^/]+)/",
                    "parse_to": "resource",
                },
                {
                    "type": "move",
                    "from": 'resource["container"]',
                    "to": 'resource["k8s.container.name"]',
                },
            ],
        },
    }


def collector_config(
    named: Sequence[Named], attributes: Mapping[str, str]
) -> TelemetrySidecar | None:
    """The sidecar of a workload naming `named`, its resource labelled with `attributes`;
    None when no telemetry has a wire here."""
    keys: dict[str, str] = {}
    extensions: dict[str, Any] = {"health_check": {"endpoint": f"{LOOPBACK}:{HEALTH_PORT}"}}
    exporters: dict[str, Any] = {}
    by_kind: dict[Kind, list[str]] = {}
    ordered = sorted(named, key=lambda n: str(n.telemetry.id))
    for n, entry in enumerate(ordered):
        made = _exporter(n, entry, keys, extensions)
        if made is None:
            continue
        exporter_id, config = made
        exporters[exporter_id] = config
        for kind in Kind:
            if kind in entry.kinds and kind in entry.telemetry.kinds:
                by_kind.setdefault(kind, []).append(exporter_id)
    if not by_kind:
        return None
    receivers = _receivers()
    pipelines = {
        kind.value.lower(): {
            "receivers": ["otlp", "file_log"] if kind is Kind.LOGS else ["otlp"],
            "processors": list(PROCESSORS),
            "exporters": ids,
        }
        for kind, ids in by_kind.items()
    }
    if Kind.LOGS in by_kind:
        extensions["file_storage"] = {"directory": STATE_DIR}
    else:
        del receivers["file_log"]
    resource = [
        {"key": key, "value": literal(value), "action": "upsert"}
        for key, value in attributes.items()
    ]
    resource.append({"key": "k8s.pod.name", "value": _env("POD_NAME"), "action": "upsert"})
    config = {
        "receivers": receivers,
        "processors": {
            "memory_limiter": {
                "check_interval": "1s",
                "limit_percentage": 80,
                "spike_limit_percentage": 20,
            },
            "resource": {"attributes": resource},
            "batch": {},
        },
        "exporters": exporters,
        "extensions": extensions,
        "service": {
            "extensions": sorted(extensions),
            "pipelines": pipelines,
            "telemetry": {
                "metrics": {
                    "readers": [
                        {
                            "pull": {
                                "exporter": {"prometheus": {"host": LOOPBACK, "port": METRICS_PORT}}
                            }
                        }
                    ]
                }
            },
        },
    }
    return TelemetrySidecar(config, keys)


def workload_attributes(
    account: str,
    instance_id: str,
    *,
    function_id: str = "",
    version_id: str = "",
    task_name: str = "",
) -> dict[str, str]:
    """The resource attributes of a function instance's (or a task's) exported signals, named
    as the in-process export names them."""
    attributes = {"nvcf.account": account}
    if function_id:
        attributes["nvcf.function.id"] = function_id
        attributes["nvcf.function.version.id"] = version_id
        attributes["nvcf.instance.id"] = instance_id
    else:
        attributes["nvcf.task.id"] = instance_id
        attributes["nvcf.task.name"] = task_name
    return attributes


async def sidecar_for(
    session: AsyncSession,
    box: SecretBox | None,
    account_id: str,
    telemetries: Mapping[str, Any] | None,
    attributes: Mapping[str, str],
) -> TelemetrySidecar | None:
    """The collector of a workload of `account_id` naming `telemetries` (a TelemetriesDto as
    stored); None when it names none, or none can be sent (each reason logged)."""
    kinds: dict[uuid.UUID, set[Kind]] = {}
    for field, value in (telemetries or {}).items():
        if field in FIELDS and value:
            kinds.setdefault(uuid.UUID(str(value)), set()).add(FIELDS[field])
    if not kinds:
        return None
    if box is None:
        log.warning("telemetries of account %s: no secrets key to read their keys", account_id)
        return None
    named: list[Named] = []
    for telemetry in await repository.by_ids(session, account_id, set(kinds)):
        key = key_of(telemetry, box)
        if key is not None:
            named.append(Named(telemetry, key, frozenset(kinds[telemetry.id])))
    return collector_config(named, attributes)
