"""Validation of applied objects for the simulated cluster, and the pod template they carry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.backends.protocol import AdapterError, InstanceSpec, check_namespace, object_metadata
from service.backends.simulated.model import (
    FAIL_AFTER_ANNOTATION,
    FAULT_ANNOTATION,
    FAULT_INSTANCES_ANNOTATION,
    FAULTS,
    READY_AFTER_ANNOTATION,
    WORKLOAD_KINDS,
    as_list,
    as_map,
    parse_duration,
)
from service.backends.simulated.tasks import ScriptError, TaskScript, script_of
from service.core.numbers import natural


def check_object(instance: InstanceSpec, obj: Any, ready_seconds: float) -> None:
    metadata = object_metadata(obj)
    check_namespace(instance, metadata)
    if obj["kind"] in WORKLOAD_KINDS:
        annotations = as_map(as_map(pod_template(obj).get("metadata")).get("annotations"))
        fault = annotations.get(FAULT_ANNOTATION)
        if fault is not None and fault not in FAULTS:
            raise AdapterError(
                f"unknown {FAULT_ANNOTATION} {fault!r} on {obj['kind']}/{metadata['name']}; "
                f"expected one of {', '.join(sorted(FAULTS))}",
                retryable=False,
            )
        limit = annotations.get(FAULT_INSTANCES_ANNOTATION)
        if limit is not None and natural(str(limit), max_digits=9) is None:
            raise AdapterError(
                f"{FAULT_INSTANCES_ANNOTATION} {limit!r} on {obj['kind']}/{metadata['name']} "
                "must be a whole number of instances",
                retryable=False,
            )
        if instance.task:
            try:
                task_script(pod_template(obj), ready_seconds)
            except ScriptError as exc:
                raise AdapterError(str(exc), retryable=False) from exc
        for key in (READY_AFTER_ANNOTATION, FAIL_AFTER_ANNOTATION):
            if key in annotations:
                try:
                    parse_duration(str(annotations[key]))
                except ValueError as exc:
                    raise AdapterError(str(exc), retryable=False) from exc


def task_script(template: Mapping[str, Any], ready_seconds: float) -> TaskScript:
    containers = as_list(as_map(template.get("spec")).get("containers"))
    env = as_list(as_map(containers[0]).get("env")) if containers else []
    return script_of(env, ready_seconds)


def pod_template(obj: Mapping[str, Any]) -> dict[str, Any]:
    if obj.get("kind") == "Pod":
        return {"metadata": as_map(obj.get("metadata")), "spec": as_map(obj.get("spec"))}
    return as_map(as_map(obj.get("spec")).get("template"))
