"""Automatic modifications (helm.md §3.2): what changes, what never does, and the reports."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.charts.modify import apply_modifications
from service.charts.render import ChartRenderer
from tests.support.charts import BASE, ArchiveFactory, by_kind, validate


@pytest.fixture
async def renderer() -> AsyncIterator[ChartRenderer]:
    # every render of two documents or more is decoded half in the worker
    async with ChartRenderer(workers=1, split_decode_min_bytes=0) as r:
        yield r


async def test_chart_pod_spec_is_cleaned(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    values = {
        "podSpecExtra": {
            "nodeSelector": {"gpu": "h100"},
            "nodeName": "node-1",
            "priorityClassName": "high",
            "serviceAccountName": "builder",
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}},
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
            },
        }
    }
    result = await validate(renderer, corpus_archive(BASE), values)
    assert result.valid and result.warnings == []
    sp = "spec.template.spec"
    ref = "apps/v1/Deployment/mini-service-inference"
    assert [(f.rule, f.severity, f.object, f.field) for f in result.info] == [
        ("modified", "info", ref, f"{sp}.nodeSelector"),
        ("modified", "info", ref, f"{sp}.nodeName"),
        ("modified", "info", ref, f"{sp}.priorityClassName"),
        ("modified", "info", ref, f"{sp}.serviceAccountName"),
        ("modified", "info", ref, f"{sp}.affinity.nodeAffinity"),
        ("modified", "info", ref, f"{sp}.automountServiceAccountToken"),
    ]
    spec = by_kind(result.objects)["Deployment/mini-service-inference"]["spec"]["template"]["spec"]
    for removed in ("nodeSelector", "nodeName", "priorityClassName", "serviceAccountName"):
        assert removed not in spec
    assert spec["affinity"] == {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}
    }
    assert spec["automountServiceAccountToken"] is False


def pod(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


@pytest.mark.parametrize(
    ("container", "escalation", "changed"),
    [
        ({"name": "c", "securityContext": {}}, False, True),
        ({"name": "c", "securityContext": {"runAsUser": 1}}, False, True),
        ({"name": "c"}, None, False),  # no security context: left alone
        ({"name": "c", "securityContext": {"allowPrivilegeEscalation": True}}, True, False),
        ({"name": "c", "securityContext": {"privileged": True}}, None, False),
        (
            {"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
            None,
            False,
        ),
        (
            {"name": "c", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}},
            False,
            True,
        ),
    ],
)
def test_allow_privilege_escalation_defaults(
    container: dict[str, Any], escalation: bool | None, changed: bool
) -> None:
    objects = [pod({"automountServiceAccountToken": False, "initContainers": [container]})]
    original = copy.deepcopy(objects)
    [out], findings = apply_modifications(objects)
    assert objects == original  # input untouched
    sc = out["spec"]["initContainers"][0].get("securityContext")
    assert (sc or {}).get("allowPrivilegeEscalation") == escalation
    field = "spec.initContainers[0].securityContext.allowPrivilegeEscalation"
    assert [f.field for f in findings] == ([field] if changed else [])


@pytest.mark.parametrize(
    ("automount", "expected", "reported"),
    [(None, False, True), (True, True, False), (False, False, False)],
)
def test_automount_set_only_when_unset(
    automount: bool | None, expected: bool, reported: bool
) -> None:
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if automount is not None:
        spec["automountServiceAccountToken"] = automount
    [out], findings = apply_modifications([pod(spec)])
    assert out["spec"]["automountServiceAccountToken"] is expected
    assert len(findings) == int(reported)


def test_objects_without_pods_are_unchanged() -> None:
    objects = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}},
    ]
    out, findings = apply_modifications(objects)
    assert out == objects and findings == []


def test_cronjob_pod_template_is_modified() -> None:
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {"nodeName": "n"}}}}},
    }
    [out], findings = apply_modifications([cron])
    spec = out["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert spec == {"automountServiceAccountToken": False}
    assert [f.field for f in findings] == [
        "spec.jobTemplate.spec.template.spec.nodeName",
        "spec.jobTemplate.spec.template.spec.automountServiceAccountToken",
    ]
