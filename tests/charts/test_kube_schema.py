"""Rendered objects against the Kubernetes schema of a version (kube_schema), without Helm."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from service.charts.decode import decode_manifest
from service.charts.kube_schema import (
    schema_version,
    schemas_for,
    standard_api_versions,
    supported_minors,
    validate_objects,
)

WEB: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "labels": {"app": "web"}},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "hostNetwork": False,
                "containers": [
                    {
                        "name": "web",
                        "image": "nginx",
                        "ports": [{"name": "http", "containerPort": 8000}],
                        "resources": {"limits": {"cpu": 0.5, "memory": "1Gi"}},
                    }
                ],
            },
        },
    },
}
SERVICE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "entrypoint"},
    "spec": {"ports": [{"port": 80, "targetPort": "http"}, {"port": 81, "targetPort": 8080}]},
}


def rows(
    objects: list[dict[str, Any]], version: str = "1.30.0", **kw: Any
) -> list[tuple[Any, ...]]:
    return [
        (f.rule, f.severity, f.object, f.field) for f in validate_objects(objects, version, **kw)
    ]


def test_well_typed_objects_pass() -> None:
    assert validate_objects([WEB, SERVICE], "1.30.0") == []


def test_wrong_types_name_the_object_and_the_field() -> None:
    bad = copy.deepcopy(WEB)
    bad["spec"]["replicas"] = "two"
    bad["spec"]["template"]["spec"]["hostNetwork"] = "true"
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8000"
    findings = validate_objects([bad], "1.30.0")
    assert [(f.rule, f.severity, f.object, f.field) for f in findings] == [
        ("schema-invalid", "error", "apps/v1/Deployment/web", "spec.replicas"),
        (
            "schema-invalid",
            "error",
            "apps/v1/Deployment/web",
            "spec.template.spec.containers[0].ports[0].containerPort",
        ),
        ("schema-invalid", "error", "apps/v1/Deployment/web", "spec.template.spec.hostNetwork"),
    ]
    assert findings[0].message == (
        'Deployment/web: spec.replicas must be an integer, not the string "two" '
        "(Kubernetes 1.30 schema)"
    )
    assert "must be a boolean, not the string" in findings[2].message


def test_yaml_1_1_y_is_a_string_and_so_an_error() -> None:
    manifest = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
        "spec:\n  hostNetwork: y\n  containers: [{name: c, image: busybox}]\n"
    )
    objects, _ = decode_manifest(manifest)
    assert objects[0]["spec"]["hostNetwork"] == "y"
    [finding] = validate_objects(objects, "1.30.0")
    assert (finding.object, finding.field) == ("v1/Pod/p", "spec.hostNetwork")
    assert finding.message.startswith(
        'Pod/p: spec.hostNetwork must be a boolean, not the string "y"'
    )


def test_nulls_are_unset_fields_and_int_or_string_takes_both() -> None:
    nulls = copy.deepcopy(WEB)
    nulls["metadata"]["annotations"] = None
    container = nulls["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolicy"] = None
    container["resources"]["requests"] = None
    assert validate_objects([nulls, SERVICE], "1.30.0") == []


def test_missing_required_and_wrong_nested_types() -> None:
    bad = copy.deepcopy(WEB)
    del bad["spec"]["template"]["spec"]["containers"][0]["name"]
    bad["spec"]["template"]["metadata"]["labels"] = {"app": 1}
    assert rows([bad]) == [
        ("schema-invalid", "error", "apps/v1/Deployment/web", "spec.template.metadata.labels.app"),
        ("schema-invalid", "error", "apps/v1/Deployment/web", "spec.template.spec.containers[0]"),
    ]


def test_api_versions_a_version_does_not_serve() -> None:
    hpa = {
        "apiVersion": "autoscaling/v2beta2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "scale"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 2},
    }
    assert validate_objects([hpa], "1.25.4") == []  # removed in 1.26
    [finding] = validate_objects([hpa], "1.30.0")
    assert (finding.rule, finding.severity, finding.field) == (
        "api-version-unsupported",
        "error",
        "apiVersion",
    )
    assert finding.message == (
        "HorizontalPodAutoscaler/scale: Kubernetes 1.30 does not serve HorizontalPodAutoscaler "
        "in autoscaling/v2beta2 (it serves HorizontalPodAutoscaler in autoscaling/v1, "
        "autoscaling/v2)"
    )
    # a cluster that declares the version serves it (an aggregated or extra API)
    declared = validate_objects([hpa], "1.30.0", declared_api_versions=["autoscaling/v2beta2"])
    assert [f.rule for f in declared] == ["schema-skipped"]


def test_custom_resources_are_skipped_once_with_an_info() -> None:
    widgets = [
        {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": n}} for n in "ab"
    ]
    assert rows(widgets) == [("schema-skipped", "info", None, None)]
    assert "example.com/v1.Widget" in validate_objects(widgets, "1.30.0")[0].message


def test_versions_without_a_schema_use_the_nearest_and_say_so() -> None:
    first, last = supported_minors()[0], supported_minors()[-1]
    older = schema_version(f"{first[0]}.{first[1] - 1}.3")
    assert older.minor == f"{first[0]}.{first[1]}" and older.note is not None
    assert f"validated against Kubernetes {older.minor}, the nearest" in older.note
    newer = schema_version(f"v{last[0]}.{last[1] + 5}.0")
    assert newer.minor == f"{last[0]}.{last[1]}"
    assert schema_version("1.30.2-gke.1").note is None
    [note] = validate_objects([SERVICE], f"{first[0]}.{first[1] - 1}.0")
    assert (note.rule, note.severity) == ("schema-version", "info")


def test_standard_api_versions_are_what_the_version_serves() -> None:
    versions = standard_api_versions("1.30.0")
    assert {"v1", "apps/v1", "apps/v1/Deployment", "v1/ConfigMap", "batch/v1/CronJob"} <= set(
        versions
    )
    assert "policy/v1beta1" not in versions  # removed in 1.25
    assert not [v for v in versions if "alpha" in v or v.endswith("List")]
    assert "autoscaling/v2beta2" in standard_api_versions("1.25.0")
    assert "autoscaling/v2beta2" not in versions


def _mutations(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every leaf of `value` replaced by a value of each other JSON type."""
    out: list[tuple[tuple[Any, ...], Any]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _mutations(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _mutations(v, (*path, i))
    else:
        out += [(path, other) for other in ("text", 7, 2.5, True, [1], {"k": "v"})]
    return out


def _replaced(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    copied = copy.deepcopy(obj)
    holder = copied
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = value
    return copied


@pytest.mark.parametrize("base", [WEB, SERVICE], ids=["Deployment", "Service"])
def test_the_fast_check_agrees_with_jsonschema(base: dict[str, Any]) -> None:
    """The compiled predicate passes exactly what jsonschema passes (it only decides whether
    jsonschema has to look), over every leaf of the object turned into each JSON type."""
    schemas = schemas_for("1.30")
    group, _, version = base["apiVersion"].rpartition("/")
    name = schemas.index[(group, version, base["kind"])]
    check, validator = schemas.check(name), schemas.validator(name)
    for path, value in _mutations(base):
        if path[-1] in ("apiVersion", "kind"):
            continue
        obj = _replaced(base, path, value)
        fast = check(obj)
        exact = not list(validator.iter_errors(json.loads(json.dumps(obj))))
        assert fast == exact, (path, value)
