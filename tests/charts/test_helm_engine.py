"""The setting `NVCF_HELM_ENGINE_PATH` (service/charts/helm_engine.py): on (the default) a chart
the engine path can answer is answered by it, off every chart is answered by Helm's install
action, and either way the objects and findings are the same. Which path answered is read
where a user sees it: the `helm_path` field of the log record `render_checked` writes (and
`RenderOutput.helm_path`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.charts.findings import PipelineResult
from service.charts.helm_engine import ENGINE, INSTALL
from service.charts.pipeline import ChartPipeline
from service.charts.render import ChartRenderer
from service.core.settings import Settings
from tests.support.charts import BASE, CORPUS, HOOK, build_chart, flat_chart, validate

LOGGER = "service.charts.helm_engine"


def simple(workdir: Path) -> Path:
    return flat_chart(workdir, None, {})


def hooks(workdir: Path) -> Path:
    """The corpus hook chart (with its subchart), plus a test hook of Helm's own."""
    return build_chart(
        "hook-skipped",
        workdir,
        {"templates/tests/test-connection.yaml": HOOK.format(name="t", events="test")},
    )


def subchart_and_kube_version(workdir: Path) -> Path:
    """inference-ok with its subchart, and a `kubeVersion` the default cluster meets."""
    meta = (CORPUS / BASE / "Chart.yaml").read_text() + "kubeVersion: '>=1.20.0-0'\n"
    return build_chart(BASE, workdir, {"Chart.yaml": meta})


def uncertain(workdir: Path) -> Path:
    """A document whose kind Helm reads by its text: the engine's output is refused."""
    odd = "apiVersion: v1\nkind: 7\nmetadata: {name: k}\n"
    return flat_chart(workdir, None, {"templates/odd.yaml": odd})


Chart = Callable[[Path], Path]
#: chart -> (helm_path, helm_fallback) of the answer with the engine path on
ON: list[tuple[Chart, tuple[str, bool]]] = [
    (simple, (ENGINE, False)),
    (hooks, (ENGINE, False)),
    (subchart_and_kube_version, (ENGINE, False)),
    (uncertain, (INSTALL, True)),
]


async def answered(
    engine_path: bool, archive: Path, caplog: pytest.LogCaptureFixture
) -> tuple[PipelineResult, list[tuple[Any, Any]]]:
    """validate_chart through a renderer with the setting `engine_path`; the result and the
    `(helm_path, helm_fallback)` of every answer logged."""
    caplog.clear()
    async with ChartRenderer(workers=1, helm_engine_path=engine_path) as renderer:
        with caplog.at_level(logging.INFO, logger=LOGGER):
            result = await validate(renderer, archive, namespace="ns")
    logged = [
        (getattr(r, "helm_path", None), getattr(r, "helm_fallback", None))
        for r in caplog.records
        if r.name == LOGGER
    ]
    return result, logged


@pytest.mark.parametrize(("chart", "on"), ON, ids=[chart.__name__ for chart, _ in ON])
async def test_same_answer_with_the_engine_path_on_and_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, chart: Chart, on: tuple[str, bool]
) -> None:
    archive = chart(tmp_path)
    fast, fast_paths = await answered(True, archive, caplog)
    exact, exact_paths = await answered(False, archive, caplog)
    assert fast_paths == [on]
    assert exact_paths == [(INSTALL, False)]
    assert fast.as_dict() == exact.as_dict()
    assert fast.objects
    # the uncertain chart's kind 7 is refused by the policy, alike on both paths
    assert [f.rule for f in fast.errors] == (["kind-not-allowed"] if chart is uncertain else [])
    if chart is hooks:
        assert fast.hooks_skipped == exact.hooks_skipped != []
    if chart is subchart_and_kube_version:
        assert "v1/ConfigMap/mini-service-extras" in {
            f"{o['apiVersion']}/{o['kind']}/{o['metadata']['name']}" for o in fast.objects
        }


async def test_the_render_says_which_path_made_it(tmp_path: Path) -> None:
    archive = simple(tmp_path)
    for engine_path, expected in ((True, ENGINE), (False, INSTALL)):
        async with ChartRenderer(workers=1, helm_engine_path=engine_path) as renderer:
            output = await renderer.render(archive, namespace="ns", engine=True)
            assert (output.helm_path, output.sorted_by_kind) == (expected, expected == INSTALL)
            # a caller that does not allow the engine gets the install action either way
            output = await renderer.render(archive, namespace="ns", engine=False)
            assert output.helm_path == INSTALL


def test_the_setting_reaches_the_renderer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(data_dir=tmp_path).helm_engine_path is True
    monkeypatch.setenv("NVCF_HELM_ENGINE_PATH", "false")
    settings = Settings(data_dir=tmp_path)
    assert settings.helm_engine_path is False
    assert ChartPipeline.from_settings(settings, None).renderer.helm_engine_path is False
    on = Settings(data_dir=tmp_path, helm_engine_path=True)
    assert ChartPipeline.from_settings(on, None).renderer.helm_engine_path is True
