"""Rendering real corpus charts in isolated workers, and decoding rendered manifests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.charts.decode import decode_manifest, load_documents
from service.charts.render import ChartRenderer, ChartRenderError
from tests.support.charts import BASE, ArchiveFactory, by_kind, validate


@pytest.fixture
async def renderer() -> AsyncIterator[ChartRenderer]:
    async with ChartRenderer(workers=2, timeout=30, split_decode_min_bytes=0) as r:
        yield r


async def test_passing_chart_renders_clean(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    result = await validate(renderer, corpus_archive(BASE))
    assert result.valid
    assert result.errors == [] and result.warnings == []
    objects = by_kind(result.objects)
    assert sorted(objects) == [
        "ConfigMap/mini-service-extras",
        "Deployment/mini-service-inference",
        "Service/entrypoint",
    ]
    # the subchart's default value is overridden by the parent chart's values.yaml
    assert objects["ConfigMap/mini-service-extras"]["data"]["message"] == "hello"
    # the only modification of the sample: the service account token is not mounted
    assert [(f.rule, f.field) for f in result.info] == [
        ("modified", "spec.template.spec.automountServiceAccountToken")
    ]


async def test_values_overrides_change_the_render(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    archive = corpus_archive(BASE)
    default = await renderer.render(archive, namespace="ns-a")
    changed = await renderer.render(
        archive,
        values={"replicaCount": 3, "image": {"tag": "2.0"}, "extras": {"message": "bye"}},
        namespace="sr-1234",
        kube_version="1.29.4",
    )
    assert default.manifest != changed.manifest
    before = by_kind(decode_manifest(default.manifest)[0])
    after = by_kind(decode_manifest(changed.manifest)[0])
    deployment = after["Deployment/mini-service-inference"]
    assert deployment["spec"]["replicas"] == 3
    # maps deep-merge: the repository survives an override of the tag only
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "nvcr.io/nvidia/inference-test:2.0"
    assert before["Deployment/mini-service-inference"]["spec"]["replicas"] == 1
    extras = after["ConfigMap/mini-service-extras"]["data"]
    assert extras == {"message": "bye", "kubeVersion": "v1.29.4", "namespace": "sr-1234"}
    assert before["ConfigMap/mini-service-extras"]["data"]["namespace"] == "ns-a"


async def test_api_versions_reach_capabilities(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    template = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: caps}\n"
        'data: {has: {{ .Capabilities.APIVersions.Has "example.com/v1/Widget" | quote }}}\n'
    )
    archive = corpus_archive(BASE, files={"templates/caps.yaml": template})
    without = await renderer.render(archive, namespace="ns")
    with_api = await renderer.render(
        archive, namespace="ns", api_versions=["example.com/v1/Widget"]
    )
    assert by_kind(decode_manifest(without.manifest)[0])["ConfigMap/caps"]["data"]["has"] == "false"
    assert by_kind(decode_manifest(with_api.manifest)[0])["ConfigMap/caps"]["data"]["has"] == "true"


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        (
            BASE,
            {"boom": True},
            "execution error at (inference-test/templates/checks.yaml:2:4): boom was requested",
        ),
        (
            BASE,
            {"needFoo": True},
            "execution error at (inference-test/templates/checks.yaml:5:10): "
            "foo is required when needFoo is set",
        ),
        (
            "bad-template",
            None,
            "parse error at (inference-test/templates/broken.yaml:6): "
            'function "nosuchfunction" not defined',
        ),
        (BASE, {"replicaCount": "three"}, "- at '/replicaCount': got string, want integer"),
        (BASE, {"replicaCount": 0}, "- at '/replicaCount': minimum: got 0, want 1"),
    ],
)
async def test_helm_errors_carry_file_and_line(
    renderer: ChartRenderer,
    corpus_archive: ArchiveFactory,
    name: str,
    values: dict[str, Any] | None,
    message: str,
) -> None:
    with pytest.raises(ChartRenderError) as caught:
        await renderer.render(corpus_archive(name), values=values, namespace="ns")
    assert caught.value.rule == "render-error"
    assert message in caught.value.detail
    result = await validate(renderer, corpus_archive(name), values)
    assert [(f.rule, f.object) for f in result.errors] == [("render-error", None)]
    assert message in result.errors[0].message
    assert not result.valid and result.objects == []


async def test_library_chart_is_refused(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    result = await validate(renderer, corpus_archive("library-chart"))
    assert [f.rule for f in result.errors] == ["library-chart"]
    assert "library chart" in result.errors[0].message


async def test_alias_bomb_chart_is_refused(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    result = await validate(renderer, corpus_archive("alias-bomb"))
    assert [f.rule for f in result.errors] == ["render-error"]
    assert "excessive aliasing" in result.errors[0].message


async def test_endless_template_hits_time_limit_and_worker_is_replaced(
    corpus_archive: ArchiveFactory,
) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    async with ChartRenderer(workers=1, timeout=1.0) as renderer:
        beat = asyncio.create_task(ticker())
        with pytest.raises(ChartRenderError) as caught:
            await renderer.render(corpus_archive("endless"), namespace="ns")
        beat.cancel()
        assert caught.value.rule == "render-timeout"
        assert caught.value.detail == "rendering exceeded the 1 s time limit"
        assert ticks > 1  # the event loop kept running during the render
        assert renderer.started == 1
        result = await validate(renderer, corpus_archive(BASE))
        assert result.valid
        assert renderer.started == 2  # the killed worker was replaced


async def test_other_renders_proceed_while_one_is_stuck(
    corpus_archive: ArchiveFactory,
) -> None:
    async with ChartRenderer(workers=2, timeout=600) as renderer:
        stuck = asyncio.create_task(renderer.render(corpus_archive("endless"), namespace="ns"))
        result = await validate(renderer, corpus_archive(BASE))
        assert result.valid
        assert not stuck.done()
        # cancelling a render (a client went away) kills its worker instead of leaking it
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        assert (await validate(renderer, corpus_archive(BASE))).valid


async def test_memory_hungry_template_hits_memory_limit(
    corpus_archive: ArchiveFactory,
) -> None:
    async with ChartRenderer(workers=1, memory_limit_bytes=256 * 1024 * 1024) as renderer:
        with pytest.raises(ChartRenderError) as caught:
            await renderer.render(corpus_archive("memory-hog"), namespace="ns")
        assert caught.value.rule == "render-memory"
        assert caught.value.detail == "rendering exceeded the 256 MiB memory limit"
        result = await validate(renderer, corpus_archive(BASE))
        assert result.valid


async def test_workers_are_reused(renderer: ChartRenderer, corpus_archive: ArchiveFactory) -> None:
    for _ in range(4):
        await renderer.render(corpus_archive(BASE), namespace="ns")
    assert renderer.started == 1
    results = await asyncio.gather(
        *(renderer.render(corpus_archive(BASE), namespace="ns") for _ in range(4))
    )
    assert len({r.manifest for r in results}) == 1
    assert renderer.started == 2


async def test_hooks_and_crds_are_left_out_and_reported(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    hooks = await validate(renderer, corpus_archive("hook-skipped"))
    assert hooks.valid
    assert [(f.rule, f.object, f.field) for f in hooks.warnings] == [
        ("hook-skipped", "batch/v1/Job/mini-service-migrate", "metadata.annotations.helm.sh/hook")
    ]
    assert hooks.hooks_skipped == ["batch/v1/Job/mini-service-migrate"]
    assert "Job/mini-service-migrate" not in by_kind(hooks.objects)

    crds = await validate(renderer, corpus_archive("crd-skipped"))
    assert crds.valid
    assert [(f.rule, f.object) for f in crds.warnings] == [
        ("crd-skipped", "apiextensions.k8s.io/v1/CustomResourceDefinition/widgets.example.com"),
        ("crd-skipped", "apiextensions.k8s.io/v1/CustomResourceDefinition/gadgets.example.com"),
    ]
    assert all(o["kind"] != "CustomResourceDefinition" for o in crds.objects)


async def test_oversized_object_is_not_parsed(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory
) -> None:
    result = await validate(renderer, corpus_archive("too-large"))
    assert [(f.rule, f.object) for f in result.errors] == [("object-too-large", None)]
    assert "inference-test/templates/big.yaml" in result.errors[0].message
    assert "ConfigMap/big" not in by_kind(result.objects)


async def test_closed_renderer_refuses(corpus_archive: ArchiveFactory) -> None:
    renderer = ChartRenderer(workers=1)
    await renderer.render(corpus_archive(BASE), namespace="ns")  # leaves an idle worker
    await renderer.aclose()
    with pytest.raises(RuntimeError):
        await renderer.render(corpus_archive(BASE), namespace="ns")


# --- decoding -------------------------------------------------------------------------------

BOMB = "\n".join(
    [
        "apiVersion: v1",
        "kind: ConfigMap",
        "metadata: {name: lol}",
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]"
            for p, n in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


def test_decode_bounds_alias_expansion() -> None:
    objects, findings = decode_manifest(f"---\n# Source: c/templates/bomb.yaml\n{BOMB}\n")
    assert objects == []
    assert [(f.rule, f.severity) for f in findings] == [("yaml-alias-bomb", "error")]
    assert "c/templates/bomb.yaml" in findings[0].message


def test_decode_rejects_recursive_alias() -> None:
    _, findings = decode_manifest("a: &x [*x]\n")
    assert [f.rule for f in findings] == ["yaml-alias-bomb"]


def test_decode_keeps_small_aliases_unshared() -> None:
    [doc] = load_documents("base: &b {x: 1}\ncopy: *b\n")
    assert doc == {"base": {"x": 1}, "copy": {"x": 1}}
    doc["copy"]["x"] = 2
    assert doc["base"]["x"] == 1


def test_decode_splits_and_skips_empty_documents() -> None:
    manifest = (
        "---\n# Source: c/templates/empty.yaml\n\n---\n# Source: c/templates/a.yaml\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n"
        "data: {when: 2024-01-01, on: yes}\n---\n---\n"
        "apiVersion: v1\nkind: Secret\nmetadata: {name: b}\n"
    )
    objects, findings = decode_manifest(manifest)
    assert findings == []
    assert [o["metadata"]["name"] for o in objects] == ["a", "b"]
    # timestamps stay strings, as Kubernetes reads them
    assert objects[0]["data"]["when"] == "2024-01-01"


def test_decode_reports_oversized_and_invalid_documents() -> None:
    big = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: big}\ndata: {x: " + "y" * 2_000_000
    manifest = (
        f"---\n{big}\n---\n[1, 2\n---\n- just a list\n---\nkind: Ok\nmetadata: {{name: ok}}\n"
    )
    objects, findings = decode_manifest(manifest)
    assert [f.rule for f in findings] == ["object-too-large", "invalid-yaml", "invalid-object"]
    assert [o["kind"] for o in objects] == ["Ok"]
