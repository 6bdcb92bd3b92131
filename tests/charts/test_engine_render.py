"""The engine render path: a simple chart skips Helm's install action, and the result is the
same as through the install action (objects, their order, every finding)."""

from __future__ import annotations

import asyncio
import io
import random
import re
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.charts.decode import (
    MAX_DOCUMENT_BYTES,
    Decoded,
    HelmOrderUncertain,
    decode_manifest,
)
from service.charts.findings import Finding, PipelineResult
from service.charts.helm_engine import GO_SPACE, engine_manifest, helm_split, split_manifests
from service.charts.render import (
    DEFAULT_KUBE_VERSION,
    ChartRenderer,
    ChartRenderError,
    RenderOutput,
    _Worker,
    _WorkerDied,
    check_rendered,
)
from tests.support.charts import BASE, CORPUS, HOOK, build_chart, flat_chart, validate_chart

#: `(engine requested, sorted_by_kind)` per render; None when the render raised.
Calls = list[tuple[bool, bool | None]]


class RecordingRenderer(ChartRenderer):
    """A renderer noting each render's `(engine requested, sorted_by_kind)`."""

    def __init__(self, split_decode_min_bytes: int | None = None) -> None:
        super().__init__(workers=1, timeout=30, split_decode_min_bytes=split_decode_min_bytes)
        self.calls: Calls = []

    async def render(self, archive: Path, **kw: Any) -> RenderOutput:
        try:
            output = await super().render(archive, **kw)
        except ChartRenderError:
            self.calls.append((kw.get("engine", False), None))
            raise
        self.calls.append((kw.get("engine", False), output.sorted_by_kind))
        return output


@pytest.fixture(params=[None, 0], ids=["decode-here", "decode-split"])
async def renderer(request: pytest.FixtureRequest) -> AsyncIterator[RecordingRenderer]:
    """Every test runs with the decoding of engine renders done in this process, and split
    with the worker for every render of two documents or more."""
    async with RecordingRenderer(split_decode_min_bytes=request.param) as r:
        yield r


#: Engine output accepted as is / refused by the decoder, then rendered by the install action /
#: the worker went straight to the install action (hooks, dependencies, kubeVersion).
ENGINE: Calls = [(True, False)]
FELL_BACK: Calls = [(True, False), (False, True)]
INSTALL: Calls = [(True, True)]
#: ... and the install action refused the chart (Helm's message is the reference)
HELM_REFUSED: Calls = [(True, False), (False, None)]


async def through_install(
    renderer: ChartRenderer,
    archive: Path,
    values: dict[str, Any] | None = None,
    kube_version: str = DEFAULT_KUBE_VERSION,
) -> PipelineResult:
    """The reference: Helm's install action, then the same checks."""
    try:
        output = await renderer.render(
            archive, values=values, namespace="ns", kube_version=kube_version, engine=False
        )
    except ChartRenderError as exc:
        result = PipelineResult()
        result.add(Finding(exc.rule, "error", None, None, exc.detail))
        return result
    assert output.sorted_by_kind
    return check_rendered(output, service_name="entrypoint", inference_port=8000)


async def compare(
    renderer: RecordingRenderer,
    archive: Path,
    values: dict[str, Any] | None = None,
    kube_version: str = DEFAULT_KUBE_VERSION,
) -> tuple[PipelineResult, Calls]:
    """validate_chart's result (engine allowed) equals the install action's; returns it with
    the render calls validate_chart made."""
    renderer.calls.clear()
    fast = await validate_chart(
        renderer,
        archive,
        values=values,
        namespace="ns",
        service_name="entrypoint",
        inference_port=8000,
        kube_version=kube_version,
    )
    calls = list(renderer.calls)
    exact = await through_install(renderer, archive, values, kube_version)
    assert fast.as_dict() == exact.as_dict()
    return fast, calls


def documents(manifest: str) -> list[str]:
    return sorted(doc.rstrip(GO_SPACE) for doc in split_manifests(manifest))


ODD_ORDER = {
    "templates/deployment.yaml": (CORPUS / BASE / "templates" / "deployment.yaml").read_text(),
    "templates/0-widgets.yaml": (
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\n"
        "---   \n  ---\n"  # Helm's separator eats the blank document and the next marker
        "apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g1}\n"
        "---\n# only a comment\n"
        "---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w2}\n"
    ),
    "templates/1-config.yaml": (
        "\n\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c1}\n"
        "---\napiVersion: v1\nkind: Secret\nmetadata: {name: s1}\n"
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c2, annotations: {a: b}}\n"
    ),
    "templates/2-empty.yaml": "{{- /* nothing */ -}}\n   \n",
    "templates/NOTES.txt": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n",
    "templates/_partial.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: partial}\n",
    "templates/z-sa.yaml": "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: sa}\n",
}


async def test_simple_chart_takes_the_engine_path_and_is_sorted_like_helm(
    renderer: RecordingRenderer, tmp_path: Path
) -> None:
    archive = flat_chart(tmp_path, None, dict(ODD_ORDER))
    result, calls = await compare(renderer, archive)
    assert calls == ENGINE
    kinds = [(o["kind"], o["metadata"]["name"]) for o in result.objects]
    assert kinds == [
        ("ServiceAccount", "sa"),
        ("Secret", "s1"),
        ("ConfigMap", "c1"),
        ("ConfigMap", "c2"),
        ("Service", "entrypoint"),
        ("Deployment", "mini-service-inference"),
        ("Gadget", "g1"),
        ("Widget", "w1"),
        ("Widget", "w2"),
    ]


async def test_engine_and_install_manifests_hold_the_same_documents(
    renderer: RecordingRenderer, tmp_path: Path
) -> None:
    archive = flat_chart(tmp_path, None, dict(ODD_ORDER))
    engine = await renderer.render(archive, namespace="ns", engine=True)
    install = await renderer.render(archive, namespace="ns", engine=False)
    assert (engine.sorted_by_kind, install.sorted_by_kind) == (False, True)
    # the same documents, in another order (trailing blanks depend on the position)
    assert documents(engine.manifest) == documents(install.manifest)
    engine_objects = Decoded.of(engine.manifest, helm_order=True).objects()
    assert (engine_objects, []) == decode_manifest(install.manifest)


def test_engine_manifest_drops_notes_partials_and_blank_templates() -> None:
    manifest = engine_manifest(
        {
            "c/templates/b.yaml": "kind: B\n---\n\n---\nkind: C",
            "c/templates/NOTES.txt": "kind: Notes",
            "c/templates/_x.tpl": "kind: Partial",
            "c/templates/a.yaml": " \n\t\n",
            "c/templates/0.yaml": "\n\nkind: A\n",
        }
    )
    assert manifest == (
        "---\n# Source: c/templates/0.yaml\nkind: A\n\n"
        "---\n# Source: c/templates/b.yaml\nkind: B\n"
        # Helm's separator pattern swallows the blank document and stops before the marker
        "---\n# Source: c/templates/b.yaml\n---\nkind: C\n"
    )


@pytest.mark.parametrize(
    ("files", "skipped"),
    [
        # known events: Helm keeps the hook apart; an unknown one: Helm drops the document
        (
            {
                "templates/tests/test-connection.yaml": HOOK.format(name="t", events="test"),
                "templates/migrate.yaml": HOOK.format(name="m", events="pre-install,pre-upgrade")
                + "---\n"
                + HOOK.format(name="odd", events="after-lunch"),
            },
            ["batch/v1/Job/m", "batch/v1/Job/odd", "batch/v1/Job/t"],
        ),
        # the annotation only mentioned in a comment: no hook at all
        ({"templates/note.yaml": "# helm.sh/hook\n"}, []),
    ],
)
async def test_hooks_take_the_engine_path_and_are_reported_alike(
    renderer: RecordingRenderer,
    tmp_path: Path,
    files: dict[str, str | None],
    skipped: list[str],
) -> None:
    result, calls = await compare(renderer, flat_chart(tmp_path, None, files))
    assert calls == ENGINE
    assert result.hooks_skipped == skipped
    assert [f.rule for f in result.warnings] == ["hook-skipped"] * len(skipped)
    assert not any(o["kind"] == "Job" for o in result.objects)


async def test_a_hook_made_at_render_time_is_found_too(
    renderer: RecordingRenderer, tmp_path: Path
) -> None:
    """The install path looks for hook templates by their text, so it misses this one's
    warning (the object is left out either way); the engine path finds it."""
    archive = flat_chart(tmp_path, None, {"templates/dyn.yaml": DYNAMIC_HOOK})
    fast = await validate_chart(
        renderer, archive, namespace="ns", service_name="entrypoint", inference_port=8000
    )
    exact = await through_install(renderer, archive)
    assert fast.objects == exact.objects and fast.errors == exact.errors == []
    assert fast.hooks_skipped == ["v1/ConfigMap/dyn"] and exact.hooks_skipped == []
    assert [f.rule for f in fast.warnings] == ["hook-skipped"]


@pytest.mark.parametrize(
    ("constraint", "kube_version", "expected"),
    [
        (">=1.20.0-0", "1.30.0", ENGINE),
        (">= 1.19.0 < 1.31.0-0", "1.30.4", ENGINE),
        ("<1.20.0", "1.30.0", [(True, None)]),
        (">=1.31.0", "1.30.0", [(True, None)]),
    ],
)
async def test_kube_version_constraint_is_checked_by_helm(
    renderer: RecordingRenderer,
    tmp_path: Path,
    constraint: str,
    kube_version: str,
    expected: Calls,
) -> None:
    meta = {"apiVersion": "v2", "name": "c", "version": "1.0.0", "kubeVersion": constraint}
    archive = flat_chart(tmp_path, None, {"Chart.yaml": yaml.safe_dump(meta)})
    result, calls = await compare(renderer, archive, kube_version=kube_version)
    assert calls == expected
    if expected != ENGINE:
        assert [f.rule for f in result.errors] == ["render-error"]
        assert result.errors[0].message == (
            f"chart requires kubeVersion: {constraint} which is incompatible with "
            f"Kubernetes v{kube_version}"
        )


def dependency_chart(workdir: Path, *, drop: str | None = None) -> Path:
    """A chart using every dependency feature the install action processes: a condition,
    tags, an alias, import-values (both forms), globals, a nested subchart and a library."""
    files = {
        "Chart.yaml": (
            "apiVersion: v2\nname: p\nversion: 0.1.0\ndependencies:\n"
            "  - {name: a, version: 0.1.0, condition: a.enabled,"
            " import-values: [{child: exported, parent: fromA}, data]}\n"
            "  - {name: b, version: 0.1.0, alias: bee, tags: [btag]}\n"
            "  - {name: lib, version: 0.1.0}\n"
        ),
        "values.yaml": (
            "a: {enabled: true, msg: parent-override}\nbee: {msg: aliased}\n"
            "tags: {btag: true}\nglobal: {g: 1}\n"
        ),
        "templates/cm.yaml": (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: parent}\ndata:\n"
            "  fromA: {{ toJson .Values.fromA | quote }}\n"
            "  imported: {{ toJson .Values.importedData | quote }}\n"
            '  lib: {{ include "lib.hello" . | quote }}\n'
        ),
        "charts/a/Chart.yaml": (
            "apiVersion: v2\nname: a\nversion: 0.1.0\n"
            "dependencies: [{name: nested, version: 0.1.0}]\n"
        ),
        "charts/a/values.yaml": (
            "msg: a-default\nexported: {x: 1}\nexports: {data: {importedData: {k: 2}}}\n"
        ),
        "charts/a/templates/cm.yaml": (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n"
            "data: {msg: {{ .Values.msg | quote }}, g: {{ .Values.global.g | quote }}}\n"
        ),
        "charts/a/charts/nested/Chart.yaml": "apiVersion: v2\nname: nested\nversion: 0.1.0\n",
        "charts/a/charts/nested/templates/s.yaml": (
            "apiVersion: v1\nkind: Secret\nmetadata: {name: nested}\n"
        ),
        "charts/b/Chart.yaml": "apiVersion: v2\nname: b\nversion: 0.1.0\n",
        "charts/b/values.yaml": "msg: b-default\n",
        "charts/b/templates/cm.yaml": (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: {{ .Chart.Name }}-b}\n"
            "data: {msg: {{ .Values.msg | quote }}}\n"
        ),
        "charts/lib/Chart.yaml": "apiVersion: v2\nname: lib\nversion: 0.1.0\ntype: library\n",
        "charts/lib/templates/_h.tpl": '{{- define "lib.hello" -}}hello from lib{{- end -}}\n',
    }
    workdir.mkdir(parents=True, exist_ok=True)
    archive = workdir / "p-0.1.0.tgz"
    # written directly: `helm package` refuses a chart whose dependency is missing
    with tarfile.open(archive, "w:gz") as tar:
        for relative, text in files.items():
            if drop is not None and relative.startswith(f"charts/{drop}/"):
                continue
            data = text.encode()
            member = tarfile.TarInfo(f"p/{relative}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return archive


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {},
            {
                "Secret/nested": None,
                "ConfigMap/a": {"msg": "parent-override", "g": "1"},
                "ConfigMap/bee-b": {"msg": "aliased"},
                "ConfigMap/parent": {
                    "fromA": '{"x":1}',
                    "imported": '{"k":2}',
                    "lib": "hello from lib",
                },
            },
        ),
        (
            {"a": {"enabled": False}, "tags": {"btag": False}},
            {
                "ConfigMap/parent": {"fromA": "null", "imported": "null", "lib": "hello from lib"},
            },
        ),
        (
            {"a": {"msg": "v"}, "global": {"g": 5}},
            {
                "Secret/nested": None,
                "ConfigMap/a": {"msg": "v", "g": "5"},
                "ConfigMap/bee-b": {"msg": "aliased"},
                "ConfigMap/parent": {
                    "fromA": '{"x":1}',
                    "imported": '{"k":2}',
                    "lib": "hello from lib",
                },
            },
        ),
    ],
)
async def test_dependencies_are_processed_alike_on_the_engine_path(
    renderer: RecordingRenderer,
    tmp_path: Path,
    values: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    """The engine call handles conditions, tags, aliases and import-values as the install
    action does (pinned here: a library update that stopped doing so fails this test)."""
    renderer.calls.clear()
    output = await renderer.render(
        dependency_chart(tmp_path), values=values, namespace="ns", engine=True
    )
    assert not output.sorted_by_kind
    objects = Decoded.of(output.manifest, helm_order=True).objects()
    assert {f"{o['kind']}/{o['metadata']['name']}": o.get("data") for o in objects} == expected
    _, calls = await compare(renderer, dependency_chart(tmp_path / "again"), values)
    assert calls == ENGINE


async def test_missing_dependency_is_refused_in_helms_words(
    renderer: RecordingRenderer, tmp_path: Path
) -> None:
    result, calls = await compare(renderer, dependency_chart(tmp_path, drop="b"))
    assert calls == [(True, None)]
    assert [f.rule for f in result.errors] == ["render-error"]
    assert "found in Chart.yaml, but missing in charts/ directory: b" in result.errors[0].message


DYNAMIC_HOOK = (
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dyn\n  annotations:\n"
    '    {{ printf "helm.sh/%s" "hook" }}: pre-install\n'
)


@pytest.mark.parametrize(
    ("name", "template"),
    [
        # Helm reads a number kind by its text, which is gone after decoding
        ("number-kind", "apiVersion: v1\nkind: 7\nmetadata: {name: k}\n"),
        # Go's encoding/json takes `Kind` for `kind` (names match ignoring case)
        ("capitalised-kind", "apiVersion: v1\nKind: Secret\nmetadata: {name: k}\n"),
        ("capitalised-name", "apiVersion: v1\nkind: Secret\nmetadata: {Name: k}\n"),
        # two YAML documents in one Helm document: Helm sorts by the first
        (
            "document-end",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\n...\n"
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n",
        ),
        # and where Helm's own parse fails, its message is the answer
        ("map-annotation", "apiVersion: v1\nkind: Secret\nmetadata: {annotations: {a: {b: c}}}\n"),
        ("not-a-mapping", "- apiVersion: v1\n  kind: ConfigMap\n"),
        ("invalid-yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: [}\n"),
    ],
)
async def test_uncertain_documents_fall_back_to_the_install_action(
    renderer: RecordingRenderer, tmp_path: Path, name: str, template: str
) -> None:
    archive = flat_chart(tmp_path, None, {"templates/odd.yaml": template})
    engine = await renderer.render(archive, namespace="ns", engine=True)
    assert not engine.sorted_by_kind
    with pytest.raises(HelmOrderUncertain):
        Decoded.of(engine.manifest, helm_order=True)
    result, calls = await compare(renderer, archive)
    refused = name in {"map-annotation", "not-a-mapping", "invalid-yaml"}
    assert calls == (HELM_REFUSED if refused else FELL_BACK), name
    if refused:
        assert [f.rule for f in result.errors] == ["render-error"]
        assert "YAML parse error on inference-test/templates/odd.yaml" in result.errors[0].message


@pytest.mark.parametrize(
    "template",
    [
        # Helm reads scalars as their text and null as "": nothing changes the order
        "apiVersion: v1\nkind: Secret\nmetadata: {name: n, annotations: {a: 1, b: true, c: }}\n",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: n\n  annotations:\n",
        "apiVersion: v1\nkind: Secret\nmetadata:\n",
        "apiVersion: v1\nkind:\nmetadata: {name: nameless-kind}\n",
    ],
)
async def test_null_and_scalar_head_fields_stay_on_the_engine_path(
    renderer: RecordingRenderer, tmp_path: Path, template: str
) -> None:
    archive = flat_chart(tmp_path, None, {"templates/odd.yaml": template})
    _, calls = await compare(renderer, archive)
    assert calls == ENGINE


@pytest.mark.parametrize(
    "overlay",
    sorted(
        p.name
        for p in CORPUS.iterdir()
        if p.is_dir()
        and not (p / "Chart.yaml").exists()
        and p.name not in {"endless", "memory-hog"}  # limits: covered in test_render
    ),
)
@pytest.mark.parametrize("subchart", [False, True], ids=["flat", "with-subchart"])
async def test_every_corpus_case_gives_the_same_result_either_way(
    renderer: RecordingRenderer, tmp_path: Path, overlay: str, subchart: bool
) -> None:
    archive = build_chart(overlay, tmp_path) if subchart else flat_chart(tmp_path, overlay, {})
    _, calls = await compare(renderer, archive)
    expected = {
        "alias-bomb": HELM_REFUSED,
        "too-large": FELL_BACK,
        # the engine's error is dropped in the worker and the install action reports it
        "bad-template": [(True, None)],
    }
    assert calls == expected.get(overlay, ENGINE)


@pytest.mark.parametrize(
    "values",
    [
        {"boom": True},
        {"needFoo": True},
        {"replicaCount": "three"},
        {"replicaCount": 3, "image": {"tag": "2.0"}},
    ],
)
async def test_render_errors_and_overrides_are_the_same_either_way(
    renderer: RecordingRenderer, tmp_path: Path, values: dict[str, Any]
) -> None:
    await compare(renderer, flat_chart(tmp_path, None, {}), values)


async def test_capabilities_reach_the_engine(renderer: RecordingRenderer, tmp_path: Path) -> None:
    template = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: caps}\ndata:\n"
        '  has: {{ .Capabilities.APIVersions.Has "example.com/v1/Widget" | quote }}\n'
        "  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
        "  install: {{ .Release.IsInstall | quote }}\n"
        '  release: {{ printf "%s/%s" .Release.Name .Release.Namespace | quote }}\n'
    )
    archive = flat_chart(tmp_path, None, {"templates/caps.yaml": template})
    for engine in (True, False):
        output = await renderer.render(
            archive,
            namespace="sr-1",
            kube_version="1.29.4",
            api_versions=["example.com/v1/Widget"],
            engine=engine,
        )
        assert output.sorted_by_kind is not engine
        objects = {o["metadata"]["name"]: o for o in decode_manifest(output.manifest)[0]}
        assert objects["caps"]["data"] == {
            "has": "true",
            "kube": "v1.29.4",
            "install": "true",
            "release": "mini-service/sr-1",
        }


#: Helm's separator, translated literally (`\s` is ASCII in RE2): the reference for
#: `helm_split`, which is written out for speed.
HELM_SEPARATOR = re.compile(r"(?:^|[\t\n\f\r ]*\n)---[\t\n\f\r ]*")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "---",
        "---\n---\n",
        "a: 1\n---\nb: 2\n",
        "a: 1\n  \n\t---   \n  ---\nb: 2",
        "a\n---x\n---\n\n---\n",
        "key: |\n  line\n  ---\n  more\n---\nnext: 1",
        "\v---\n\x85---\n",
    ],
)
def test_helm_split_matches_helms_pattern(text: str) -> None:
    assert helm_split(text) == HELM_SEPARATOR.split(text)


def test_helm_split_matches_helms_pattern_on_random_text() -> None:
    rnd = random.Random(20261129)
    pieces = ["-", "-", "---", "\n---", " ", "\n", "\t", "\r", "\f", "\v", "a", " \n", "#"]
    for _ in range(20_000):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 40)))
        assert helm_split(text) == HELM_SEPARATOR.split(text), repr(text)


async def test_split_decode_hands_over_the_objects_of_both_halves(tmp_path: Path) -> None:
    """An engine render: both halves ranked, then sorted together like Helm."""
    archive = flat_chart(tmp_path, None, dict(ODD_ORDER))
    async with RecordingRenderer(split_decode_min_bytes=0) as split:
        output = await split.render(archive, namespace="ns", engine=True)
        assert output.decoded is not None
        assert output.decoded == Decoded.of(output.manifest, helm_order=True)
        kinds = [o["kind"] for o in output.decoded.objects()]
        assert kinds[:3] == ["ServiceAccount", "Secret", "ConfigMap"] and len(kinds) == 9
        # the worker answered both frames and serves the next render
        await split.render(archive, namespace="ns", engine=True)
        assert split.started == 1
    big = len(output.manifest) + 1
    for threshold in (None, big):
        async with RecordingRenderer(split_decode_min_bytes=threshold) as whole:
            assert (await whole.render(archive, namespace="ns", engine=True)).decoded is None


@pytest.mark.parametrize("path", ["templates/0-odd.yaml", "templates/z-odd.yaml"])
async def test_an_uncertain_half_leaves_the_decoding_to_the_check(
    tmp_path: Path, path: str
) -> None:
    """Whichever half holds the document Helm could read differently, nothing is handed over
    and the check falls back to the install action."""
    template = "apiVersion: v1\nkind: 7\nmetadata: {name: k}\n"
    archive = flat_chart(tmp_path, None, {**ODD_ORDER, path: template})
    async with RecordingRenderer(split_decode_min_bytes=0) as split:
        output = await split.render(archive, namespace="ns", engine=True)
        assert output.decoded is None and not output.sorted_by_kind
        _, calls = await compare(split, archive)
        assert calls == FELL_BACK


async def test_worker_dying_between_the_frames_costs_only_the_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = flat_chart(tmp_path, None, dict(ODD_ORDER))
    original = _Worker.read_frame
    answered: list[bool] = []

    async def die_after_a_split(self: _Worker, max_output: int) -> dict[str, Any]:
        if answered and answered[-1]:
            answered.append(False)
            self.proc.kill()
            raise _WorkerDied("killed between the frames")
        frame = await original(self, max_output)
        answered.append("split" in frame)
        return frame

    monkeypatch.setattr(_Worker, "read_frame", die_after_a_split)
    async with RecordingRenderer(split_decode_min_bytes=0) as split:
        output = await split.render(archive, namespace="ns", engine=True)
        assert output.decoded is None and not output.sorted_by_kind
        result, calls = await compare(split, archive)
        assert calls == ENGINE
        assert [o["metadata"]["name"] for o in result.objects][:3] == ["sa", "s1", "c1"]
        assert split.started >= 2  # the dead worker was replaced


async def test_split_decode_of_an_install_render_keeps_every_finding_in_order(
    tmp_path: Path,
) -> None:
    """An install-action render with findings in both halves."""
    big = "x" * (MAX_DOCUMENT_BYTES + 10)
    # Helm's order puts the Secret first and the Widget last: one in each half
    template = "apiVersion: v1\nkind: %s\nmetadata: {name: %s}\ndata: {v: %s}\n"
    archive = build_chart(
        BASE,
        tmp_path,
        {
            "templates/a-big.yaml": template % ("Secret", "a-big", big),
            "templates/m-plain.yaml": "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n",
            "templates/z-big.yaml": template % ("Widget", "z-big", big),
        },
    )
    async with RecordingRenderer(split_decode_min_bytes=0) as split:
        output = await split.render(archive, namespace="ns", engine=False)
        assert output.sorted_by_kind and output.decoded is not None
        objects, findings = output.decoded.objects(), output.decoded.findings
        assert (objects, findings) == decode_manifest(output.manifest)
        assert len(output.decoded.entries) == 2  # one per half
        offset = output.manifest.find("\n---\n", len(output.manifest) // 2) + 1
        assert [f.message.split(" is ")[0] for f in findings] == [
            "a document in inference-test/templates/a-big.yaml",
            "a document in inference-test/templates/z-big.yaml",
        ]
        assert "a-big.yaml" in output.manifest[:offset]
        assert "z-big.yaml" in output.manifest[offset:]
        assert "Secret" in [o["kind"] for o in objects]


async def test_cancelled_between_the_frames_the_worker_is_not_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request cancelled while the worker's second frame is pending (a client gone): that
    frame must never be read as the answer to the next render."""
    archive = flat_chart(tmp_path, None, dict(ODD_ORDER))
    original = _Worker.read_frame
    waiting = asyncio.Event()
    hold: list[bool] = [True]
    split_seen: set[_Worker] = set()  # the workers whose last frame was a split's first

    async def slow_second_frame(self: _Worker, max_output: int) -> dict[str, Any]:
        if waiting.is_set() is False and hold and self in split_seen:
            waiting.set()
            await asyncio.sleep(3600)
        frame = await original(self, max_output)
        if "split" in frame:
            split_seen.add(self)
        else:
            split_seen.discard(self)
        return frame

    monkeypatch.setattr(_Worker, "read_frame", slow_second_frame)
    async with RecordingRenderer(split_decode_min_bytes=0) as split:
        task = asyncio.create_task(split.render(archive, namespace="ns", engine=True))
        await asyncio.wait_for(waiting.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        hold.clear()
        output = await split.render(archive, namespace="ns", engine=True)
        assert output.decoded is not None and not output.sorted_by_kind
        assert output.decoded == Decoded.of(output.manifest, helm_order=True)
        assert split.started == 2  # the worker with the pending frame was replaced
