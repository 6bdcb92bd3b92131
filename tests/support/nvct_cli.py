"""nvcf-cli's task requests (NVIDIA/nvcf `src/clis/nvcf-cli/cmd/task.go` and
`internal/client/tasks.go`), built as its Go code builds them, for replay tests.

`create_body` follows `loadTaskCreateConfig` (a JSON file, then each flag that was given
overriding it) and `runTaskCreate` (secrets: the `--secrets` pairs first, then the file's),
and marshals `CreateTaskRequest` as `encoding/json` does: in struct order, `omitempty` fields
left out when empty, the others always sent. `request` gives the method, path (query encoded
as Go's `url.Values.Encode`: keys sorted) and headers of `makeNVCTRequest`.
"""

from __future__ import annotations

import copy
import json
from typing import Any
from urllib.parse import quote, urlencode

#: `makeNVCTRequest`'s headers: Accept always, Content-Type with a body
ACCEPT = {"Accept": "application/json"}
JSON_BODY = {**ACCEPT, "Content-Type": "application/json"}

#: `GpuSpecificationDto` field order; gpu and instanceType have no omitempty
_GPU_FIELDS = ("gpu", "backend", "clusters", "instanceType", "configuration")
_ALWAYS_GPU = ("gpu", "instanceType")
#: `CreateTaskRequest` field order (name and gpuSpecification have no omitempty)
_CREATE_FIELDS = (
    "name",
    "gpuSpecification",
    "containerImage",
    "containerArgs",
    "containerEnvironment",
    "models",
    "resources",
    "tags",
    "description",
    "maxRuntimeDuration",
    "maxQueuedDuration",
    "terminationGracePeriodDuration",
    "resultHandlingStrategy",
    "resultsLocation",
    "helmChart",
    "telemetries",
    "secrets",
)
#: flag -> the config field it overrides (string flags)
_STRING_FLAGS = {
    "name": "name",
    "image": "containerImage",
    "container-args": "containerArgs",
    "description": "description",
    "max-runtime": "maxRuntimeDuration",
    "max-queued": "maxQueuedDuration",
    "termination-grace": "terminationGracePeriodDuration",
    "result-strategy": "resultHandlingStrategy",
    "results-location": "resultsLocation",
    "helm-chart": "helmChart",
}
_TELEMETRY_FLAGS = {
    "logs-telemetry-id": "logsTelemetryId",
    "metrics-telemetry-id": "metricsTelemetryId",
    "traces-telemetry-id": "tracesTelemetryId",
}


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {} or value is False


def _artifact(raw: str) -> dict[str, str]:
    """`parseArtifactString`: name:version:uri, the URI keeping its ':'."""
    parts = raw.split(":")
    if len(parts) < 3:
        raise ValueError(f"invalid artifact {raw!r}: insufficient parts, need 3")
    return {"name": parts[0], "version": parts[1], "uri": ":".join(parts[2:])}


def _artifact_dto(item: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": item.get("name", "")}
    for key in ("version", "uri"):
        if not _empty(item.get(key)):
            out[key] = item[key]
    return out


def _secrets(raw: Any, pairs: list[str]) -> list[dict[str, Any]]:
    """`parseSecretsList`: the CLI's `name=value` pairs, then the file's entries (strings
    `name=value` or objects {name, value}); a value left out is omitted (omitempty)."""
    out: list[dict[str, Any]] = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"invalid secret format {pair!r}: must be name=value")
        out.append({"name": name, "value": value})
    for item in raw or []:
        if isinstance(item, str):
            name, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"invalid secret format {item!r}: must be name=value")
            out.append({"name": name, "value": value})
        else:
            secret: dict[str, Any] = {"name": item.get("name", "")}
            if not _empty(item.get("value")):
                secret["value"] = item["value"]
            out.append(secret)
    return out


def create_body(file: dict[str, Any] | None = None, **flags: Any) -> dict[str, Any]:
    """The body of `task create [--input-file FILE] [--flag value]…`: flags by their CLI
    name with '-' as '_' (lists for the slice flags)."""
    cfg: dict[str, Any] = copy.deepcopy(file or {})
    given = {k.replace("_", "-"): v for k, v in flags.items()}
    for flag, field in _STRING_FLAGS.items():
        if flag in given:
            cfg[field] = given[flag]
    spec_flags = {
        "gpu": "gpu",
        "instance-type": "instanceType",
        "backend": "backend",
        "clusters": "clusters",
    }
    if any(f in given for f in spec_flags):
        flagged = cfg.setdefault("gpuSpecification", {}) or {}
        cfg["gpuSpecification"] = flagged
        for flag, field in spec_flags.items():
            if flag in given:
                flagged[field] = given[flag]
    if "container-env" in given:
        env = []
        for item in given["container-env"]:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"invalid container-env {item!r}: expected key=value")
            env.append({"key": key, "value": value})
        cfg["containerEnvironment"] = env
    if "tags" in given:
        cfg["tags"] = given["tags"]
    if any(f in given for f in _TELEMETRY_FLAGS):
        telemetries = cfg.setdefault("telemetries", {}) or {}
        cfg["telemetries"] = telemetries
        for flag, field in _TELEMETRY_FLAGS.items():
            if flag in given:
                telemetries[field] = given[flag]
    for flag, field in (("models", "models"), ("resources", "resources")):
        if flag in given:
            cfg[field] = [_artifact(raw) for raw in given[flag]]

    body: dict[str, Any] = {}
    spec_in = cfg.get("gpuSpecification") or {}
    spec: dict[str, Any] = {}
    for key in _GPU_FIELDS:
        value = spec_in.get(key)
        if key in _ALWAYS_GPU:
            spec[key] = value or ""
        elif not _empty(value):
            spec[key] = value
    policy = spec_in.get("helmValidationPolicy")
    if policy is not None:
        out_policy: dict[str, Any] = {"name": policy.get("name", "")}
        if policy.get("extraKubernetesTypes"):
            out_policy["extraKubernetesTypes"] = [
                {k: v for k, v in t.items() if not _empty(v)}
                for t in policy["extraKubernetesTypes"]
            ]
        spec["helmValidationPolicy"] = out_policy
    telemetries = cfg.get("telemetries") or {}
    telemetries = {k: v for k, v in telemetries.items() if not _empty(v)}
    values: dict[str, Any] = {
        **cfg,
        "gpuSpecification": spec,
        "containerEnvironment": [
            {"key": e.get("key", ""), "value": e.get("value", "")}
            for e in cfg.get("containerEnvironment") or []
        ],
        "models": [_artifact_dto(m) for m in cfg.get("models") or []],
        "resources": [_artifact_dto(r) for r in cfg.get("resources") or []],
        "telemetries": telemetries or None,
        "secrets": _secrets(cfg.get("secrets"), list(given.get("secrets") or [])),
    }
    for key in _CREATE_FIELDS:
        value = values.get(key)
        if key in ("name", "gpuSpecification"):
            body[key] = value if value is not None else ""
        elif not _empty(value):
            body[key] = value
    return body


def bulk_body(file: dict[str, Any] | None = None, task_ids: list[str] | None = None) -> Any:
    """`task bulk [--task-ids a,b] [--input-file F]`'s body: the flag's ids, then the file's."""
    return {"taskIds": [*(task_ids or []), *((file or {}).get("taskIds") or [])]}


def secrets_body(file: dict[str, Any] | None = None, pairs: list[str] | None = None) -> Any:
    """`task update-secrets [--input-file F] [--secrets name=value]…`'s body."""
    return {"secrets": _secrets((file or {}).get("secrets"), pairs or [])}


def marshal(body: Any) -> bytes:
    """`json.Marshal`: compact, `<`, `>` and `&` escaped."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


def task_path(task_id: str, tail: str = "") -> str:
    return f"/v1/nvct/tasks/{quote(task_id, safe='')}{tail}"


def query(**params: Any) -> str:
    """`url.Values.Encode` of the non-zero options, keys sorted; "" when none."""
    given = sorted((k, str(v)) for k, v in params.items() if not _empty(v) and v != 0)
    return "?" + urlencode(given) if given else ""
