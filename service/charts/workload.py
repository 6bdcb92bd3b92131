"""The `nvcf-workload-config` ConfigMap (helm.md §4): removed from the objects, flags parsed."""

from __future__ import annotations

from typing import Any

from service.charts.decode import DecodeError, load_documents
from service.charts.findings import Finding, KubeObject, is_kind, object_name, object_ref

WORKLOAD_CONFIG_NAME = "nvcf-workload-config"
KNOWN_FLAGS = frozenset({"StatusByWorkerReadiness"})


def extract_workload_config(
    objects: list[KubeObject],
) -> tuple[list[KubeObject], dict[str, bool], list[Finding]]:
    """Return the objects without the workload ConfigMap(s), the known flags, and findings.

    Malformed configuration is a `workload-config` error; unknown flags are ignored with a
    `workload-config` warning.
    """
    kept: list[KubeObject] = []
    flags: dict[str, bool] = {}
    findings: list[Finding] = []
    for obj in objects:
        if is_kind(obj, "v1", "ConfigMap") and object_name(obj) == WORKLOAD_CONFIG_NAME:
            parsed, problems = _parse(obj)
            flags.update(parsed)
            findings.extend(problems)
        else:
            kept.append(obj)
    return kept, flags, findings


def _parse(obj: KubeObject) -> tuple[dict[str, bool], list[Finding]]:
    ref = object_ref(obj)

    def error(field: str, message: str) -> tuple[dict[str, bool], list[Finding]]:
        return {}, [Finding("workload-config", "error", ref, field, message)]

    data = obj.get("data")
    text = data.get("config.yaml") if isinstance(data, dict) else None
    if not isinstance(text, str):
        return error("data.config.yaml", "the workload configuration has no data.config.yaml")
    try:
        docs = [d for d in load_documents(text) if d is not None]
    except DecodeError as exc:
        return error("data.config.yaml", f"config.yaml is not valid YAML: {exc}")
    if len(docs) != 1 or not isinstance(docs[0], dict):
        return error("data.config.yaml", "config.yaml must be one mapping with featureFlags")
    doc: dict[str, Any] = docs[0]
    feature_flags = doc.get("featureFlags")
    if not isinstance(feature_flags, dict):
        return error(
            "data.config.yaml.featureFlags",
            "config.yaml must contain featureFlags: {name: true|false}",
        )
    flags: dict[str, bool] = {}
    findings: list[Finding] = []
    bad = sorted(str(k) for k, v in feature_flags.items() if not isinstance(v, bool))
    if bad:
        return error(
            "data.config.yaml.featureFlags",
            "feature flags must be true or false: " + ", ".join(bad),
        )
    for name, value in feature_flags.items():
        if name in KNOWN_FLAGS:
            flags[name] = value
        else:
            findings.append(
                Finding(
                    "workload-config",
                    "warning",
                    ref,
                    f"data.config.yaml.featureFlags.{name}",
                    f"unknown feature flag {name!r} is ignored",
                )
            )
    return flags, findings
