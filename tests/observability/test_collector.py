"""The collector configuration a Kubernetes workload's sidecar gets from its telemetries: one
exporter per telemetry by provider, its key only as an env reference, the workload's labels
set over the container's, checked against our model of the collector's configuration
(tests/support/otelcol.py: no collector schema or binary is available offline)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from service.backends.collector_pod import POD_ENV, TelemetrySidecar
from service.core.db import utcnow
from service.observability import mtls
from service.observability.collector import Named, collector_config, workload_attributes
from service.observability.models import Kind, Telemetry
from tests.support import otelcol
from tests.support.certs import TestCa

ATTRIBUTES = workload_attributes("acct-1", "inst-1", function_id="fn-1", version_id="ver-1")


def telemetry(
    provider: str, endpoint: str, kinds: tuple[Kind, ...], protocol: str = "HTTP", n: int = 0
) -> Telemetry:
    now = utcnow()
    return Telemetry(
        id=uuid.UUID(int=n + 1),
        account_id="acct-1",
        name=f"t{n}",
        endpoint=endpoint,
        protocol=protocol,
        provider=provider,
        types=[k.value for k in kinds],
        secret_ciphertext="",
        created_at=now,
        updated_at=now,
    )


def named(t: Telemetry, key: str, kinds: tuple[Kind, ...] | None = None) -> Named:
    return Named(t, key, frozenset(kinds if kinds is not None else t.kinds))


def valid(sidecar: TelemetrySidecar | None) -> dict[str, Any]:
    assert sidecar is not None
    otelcol.validate(sidecar.config, set(sidecar.keys) | set(POD_ENV))
    # the file the collector reads is the same configuration
    assert json.loads(sidecar.config_text()) == sidecar.config
    return dict(sidecar.config)


ALL = (Kind.LOGS, Kind.METRICS, Kind.TRACES)


def test_each_provider_gets_its_exporter_and_its_key_only_as_an_env_reference() -> None:
    given = [
        named(telemetry("OTEL_COLLECTOR", "https://otel.example.com/otlp/", ALL, n=0), "k0"),
        named(telemetry("OTEL_COLLECTOR", "http://otel.example.com:4317", ALL, "GRPC", 1), "k1"),
        named(telemetry("GRAFANA_CLOUD", "https://otlp.grafana.net/otlp", ALL, n=2), "123:k2"),
        named(
            telemetry("PROMETHEUS", "https://prom.example.com/api/v1/write", (Kind.METRICS,), n=3),
            "k3",
        ),
        named(
            telemetry(
                "VICTORIAMETRICS", "https://vm.example.com/api/v1/write", (Kind.METRICS,), n=4
            ),
            "k4",
        ),
        named(telemetry("DATADOG", "datadoghq.eu", (Kind.LOGS, Kind.METRICS), n=5), "k5"),
        named(telemetry("DATADOG", "https://intake.example.com", (Kind.METRICS,), n=6), "k6"),
    ]
    sidecar = collector_config(given, ATTRIBUTES)
    config = valid(sidecar)
    assert sidecar is not None
    ids = [str(uuid.UUID(int=n + 1)) for n in range(7)]
    exporters = config["exporters"]
    assert set(exporters) == {
        f"otlp_http/{ids[0]}",
        f"otlp_grpc/{ids[1]}",
        f"otlp_http/{ids[2]}",
        f"prometheus_remote_write/{ids[3]}",
        f"prometheus_remote_write/{ids[4]}",
        f"datadog/{ids[5]}",
        f"datadog/{ids[6]}",
    }
    otlp_http = exporters[f"otlp_http/{ids[0]}"]
    assert otlp_http["endpoint"] == "https://otel.example.com/otlp"
    assert otlp_http["headers"] == {"Authorization": "Bearer ${env:NVCF_TELEMETRY_0_KEY}"}
    grpc = exporters[f"otlp_grpc/{ids[1]}"]
    assert (grpc["endpoint"], grpc["tls"]) == ("otel.example.com:4317", {"insecure": True})
    grafana = exporters[f"otlp_http/{ids[2]}"]
    assert grafana["auth"] == {"authenticator": f"basicauth/{ids[2]}"}
    assert config["extensions"][f"basicauth/{ids[2]}"] == {
        "client_auth": {
            "username": "${env:NVCF_TELEMETRY_2_USER}",
            "password": "${env:NVCF_TELEMETRY_2_PASSWORD}",
        }
    }
    remote = exporters[f"prometheus_remote_write/{ids[3]}"]
    assert remote["endpoint"] == "https://prom.example.com/api/v1/write"
    assert remote["resource_to_telemetry_conversion"] == {"enabled": True}
    assert exporters[f"datadog/{ids[5]}"]["api"] == {
        "key": "${env:NVCF_TELEMETRY_5_KEY}",
        "site": "datadoghq.eu",
    }
    assert exporters[f"datadog/{ids[6]}"]["metrics"] == {"endpoint": "https://intake.example.com"}
    # the keys are in the Secret's data, never in the configuration
    assert sidecar.keys == {
        "NVCF_TELEMETRY_0_KEY": "k0",
        "NVCF_TELEMETRY_1_KEY": "k1",
        "NVCF_TELEMETRY_2_USER": "123",
        "NVCF_TELEMETRY_2_PASSWORD": "k2",
        "NVCF_TELEMETRY_3_KEY": "k3",
        "NVCF_TELEMETRY_4_KEY": "k4",
        "NVCF_TELEMETRY_5_KEY": "k5",
        "NVCF_TELEMETRY_6_KEY": "k6",
    }
    text = sidecar.config_text()
    assert not any(f'"{key}"' in text or f" {key}" in text for key in sidecar.keys.values())
    assert "k0" not in repr(sidecar)
    pipelines = config["service"]["pipelines"]
    assert pipelines["traces"]["exporters"] == [
        f"otlp_http/{ids[0]}",
        f"otlp_grpc/{ids[1]}",
        f"otlp_http/{ids[2]}",
    ]
    assert set(pipelines["metrics"]["exporters"]) == set(exporters)
    assert pipelines["logs"]["exporters"] == [
        f"otlp_http/{ids[0]}",
        f"otlp_grpc/{ids[1]}",
        f"otlp_http/{ids[2]}",
        f"datadog/{ids[5]}",
    ]


def test_the_collector_receives_on_the_reserved_ports_and_the_pods_own_log_files() -> None:
    config = valid(
        collector_config(
            [named(telemetry("OTEL_COLLECTOR", "https://o.example.com", ALL), "k")], ATTRIBUTES
        )
    )
    assert config["receivers"]["otlp"]["protocols"] == {
        "grpc": {"endpoint": "127.0.0.1:14357"},
        "http": {"endpoint": "127.0.0.1:14358"},
    }
    filelog = config["receivers"]["file_log"]
    assert filelog["include"] == ["/var/log/pods/self/*/*.log"]
    assert filelog["exclude"] == ["/var/log/pods/self/nvcf-otel-collector/*.log"]
    assert config["service"]["pipelines"]["logs"]["receivers"] == ["otlp", "file_log"]
    # how far each file was read survives a restart of the collector: no line sent twice
    assert filelog["storage"] == "file_storage"
    assert config["extensions"]["file_storage"] == {"directory": "/var/lib/nvcf-otelcol"}
    assert config["service"]["pipelines"]["traces"]["receivers"] == ["otlp"]
    assert config["extensions"]["health_check"] == {"endpoint": "127.0.0.1:13133"}
    reader = config["service"]["telemetry"]["metrics"]["readers"][0]
    assert reader["pull"]["exporter"]["prometheus"] == {"host": "127.0.0.1", "port": 18888}


def test_the_workloads_labels_are_set_over_whatever_the_container_sends() -> None:
    config = valid(
        collector_config(
            [named(telemetry("OTEL_COLLECTOR", "https://o.example.com", ALL), "k")], ATTRIBUTES
        )
    )
    actions = config["processors"]["resource"]["attributes"]
    assert {(a["key"], a["value"], a["action"]) for a in actions} == {
        ("nvcf.account", "acct-1", "upsert"),
        ("nvcf.function.id", "fn-1", "upsert"),
        ("nvcf.function.version.id", "ver-1", "upsert"),
        ("nvcf.instance.id", "inst-1", "upsert"),
        ("k8s.pod.name", "${env:POD_NAME}", "upsert"),
    }
    for pipeline in config["service"]["pipelines"].values():
        assert pipeline["processors"] == ["memory_limiter", "resource", "batch"]
    task = workload_attributes("acct-1", "task-1", task_name="train")
    assert task == {"nvcf.account": "acct-1", "nvcf.task.id": "task-1", "nvcf.task.name": "train"}


def test_an_endpoint_cannot_make_the_collector_expand_another_keys_variable() -> None:
    evil = "https://evil.example.com/${env:NVCF_TELEMETRY_1_KEY}"
    given = [
        named(telemetry("OTEL_COLLECTOR", evil, (Kind.TRACES,), n=0), "k0"),
        named(telemetry("OTEL_COLLECTOR", "https://o.example.com", (Kind.TRACES,), n=1), "k1"),
    ]
    config = valid(collector_config(given, ATTRIBUTES))
    exporter = config["exporters"][f"otlp_http/{uuid.UUID(int=1)}"]
    assert exporter["endpoint"] == "https://evil.example.com/$${env:NVCF_TELEMETRY_1_KEY}"
    assert "NVCF_TELEMETRY_1_KEY" not in otelcol.env_names(exporter)


def test_only_the_types_the_workload_names_are_sent_and_unsendable_ones_are_left_out() -> None:
    both = telemetry("OTEL_COLLECTOR", "https://o.example.com", ALL, n=0)
    refused = telemetry("SPLUNK", "https://splunk.example.com", ALL, n=1)
    config = valid(
        collector_config([named(both, "k", (Kind.METRICS,)), named(refused, "s")], ATTRIBUTES)
    )
    assert set(config["service"]["pipelines"]) == {"metrics"}
    assert "file_log" not in config["receivers"]
    assert collector_config([named(refused, "s")], ATTRIBUTES) is None


def test_client_certificates_are_presented_by_the_collector_from_its_secret() -> None:
    ca = TestCa()
    client = ca.issue("tenant-exporter", server=False)
    value = {"clientCert": client.cert, "clientKey": client.key, "caFile": ca.pem}
    prom = telemetry("PROMETHEUS", "https://prom.example.com/api/v1/write", (Kind.METRICS,))
    sidecar = collector_config([named(prom, mtls.stored(value))], ATTRIBUTES)
    config = valid(sidecar)
    [exporter] = config["exporters"].values()
    assert exporter["tls"] == {
        "cert_pem": "${env:NVCF_TELEMETRY_0_CERT}",
        "key_pem": "${env:NVCF_TELEMETRY_0_CERT_KEY}",
        "ca_pem": "${env:NVCF_TELEMETRY_0_CA}",
    }
    assert "headers" not in exporter  # no bearer: the certificate authenticates
    assert sidecar is not None and sidecar.keys == {
        "NVCF_TELEMETRY_0_CERT": client.cert,
        "NVCF_TELEMETRY_0_CERT_KEY": client.key,
        "NVCF_TELEMETRY_0_CA": ca.pem,
    }
    assert "PRIVATE KEY" not in sidecar.config_text() and "PRIVATE KEY" not in repr(sidecar)
