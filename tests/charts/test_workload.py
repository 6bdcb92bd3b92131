"""The nvcf-workload-config ConfigMap (helm.md §4)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.charts.render import ChartRenderer
from service.charts.workload import extract_workload_config
from tests.support.charts import BASE, ArchiveFactory, by_kind, validate


@pytest.fixture
async def renderer() -> AsyncIterator[ChartRenderer]:
    # every render of two documents or more is decoded half in the worker
    async with ChartRenderer(workers=1, split_decode_min_bytes=0) as r:
        yield r


async def test_workload_config_is_parsed_and_removed(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    values = {"workloadConfig": {"featureFlags": {"StatusByWorkerReadiness": True, "Turbo": False}}}
    result = await validate(renderer, corpus_archive(BASE), values)
    assert result.valid
    assert result.workload_config == {"StatusByWorkerReadiness": True}
    assert [(f.rule, f.severity, f.object, f.field) for f in result.warnings] == [
        (
            "workload-config",
            "warning",
            "v1/ConfigMap/nvcf-workload-config",
            "data.config.yaml.featureFlags.Turbo",
        )
    ]
    assert "ConfigMap/nvcf-workload-config" not in by_kind(result.objects)


async def test_without_workload_config_flags_are_empty(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    result = await validate(renderer, corpus_archive(BASE))
    assert result.workload_config == {}


async def test_malformed_workload_config_chart(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    result = await validate(renderer, corpus_archive("workload-config-bad"))
    assert [f.rule for f in result.errors] == ["workload-config"]
    assert "ConfigMap/nvcf-workload-config" not in by_kind(result.objects)


def config_map(data: Any, name: str = "nvcf-workload-config") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


@pytest.mark.parametrize(
    ("data", "flags", "findings"),
    [
        (
            {"config.yaml": "featureFlags: {StatusByWorkerReadiness: false}"},
            {"StatusByWorkerReadiness": False},
            [],
        ),
        ({"config.yaml": "featureFlags: {}"}, {}, []),
        (None, {}, [("error", "data.config.yaml")]),
        ({"other.yaml": "x: 1"}, {}, [("error", "data.config.yaml")]),
        ({"config.yaml": "featureFlags: [a"}, {}, [("error", "data.config.yaml")]),
        ({"config.yaml": "- a\n- b\n"}, {}, [("error", "data.config.yaml")]),
        ({"config.yaml": "flags: {}"}, {}, [("error", "data.config.yaml.featureFlags")]),
        (
            {"config.yaml": "featureFlags: {StatusByWorkerReadiness: maybe}"},
            {},
            [("error", "data.config.yaml.featureFlags")],
        ),
        (
            {"config.yaml": "featureFlags: {New: true, StatusByWorkerReadiness: true}"},
            {"StatusByWorkerReadiness": True},
            [("warning", "data.config.yaml.featureFlags.New")],
        ),
    ],
)
def test_workload_config_table(
    data: Any, flags: dict[str, bool], findings: list[tuple[str, str]]
) -> None:
    other = config_map({"a": "b"}, name="nvcf-workload-config-2")
    kept, parsed, found = extract_workload_config([config_map(data), other])
    assert kept == [other]
    assert parsed == flags
    assert [(f.severity, f.field) for f in found] == findings
    assert all(f.rule == "workload-config" for f in found)
