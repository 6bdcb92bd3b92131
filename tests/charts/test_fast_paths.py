"""The fast paths of the chart pipeline give the same results as the general ones."""

from __future__ import annotations

import copy
import io
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.charts import decode
from service.charts.decode import decode_manifest, load_documents
from service.charts.modify import apply_modifications
from service.charts.render import ChartRenderer
from service.charts.render_worker import may_have_hooks
from tests.support.charts import BASE, ArchiveFactory, build_chart, validate


def general_load(text: str) -> list[Any]:
    """What `load_documents` gave before its fast path: PyYAML's constructor + JSON."""
    loader = decode._Loader(text)
    out: list[Any] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                data = loader.construct_document(node)
                out.append(json.loads(json.dumps(data, default=str)))
    finally:
        loader.dispose()
    return out


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\nb: 1.5\nc: true\nd: null\ne: ~\nf: '1'\ng: yes\nh: 0x1f\ni: 1_000\nj: .inf\n",
        "k: -.Inf\nl: .nan\nm: 0o17\nn: 017\no: 1:30\np: 2024-01-01\nq: 2024-01-01T10:00:00Z\n",
        "1: int key\ntrue: bool key\n~: null key\n1.5: float key\n",
        "base: {x: 1}\n<<: {y: 2}\nz: [1, {a: b}]\n",
        "= : value key\nother: 1\n",
        "bin: !!binary aGVsbG8=\nset: !!set {a, b}\nts: !!timestamp 2024-01-01\n",
        "s: !!str 12\nf: !!float 1\ni: !!int '7'\nomap: !!omap [a: 1, b: 2]\n",
        "dup: 1\ndup: 2\nlist: [a, 'b', \"c\", 1e3, -0.0, +1]\n",
        "---\na: 1\n---\n- x\n- y\n---\nplain scalar\n---\n",
        "deep: " + "[" * 50 + "]" * 50 + "\n",
        "url: http://x/?a=1&b=2\nref: &r {v: 1}\nuse: *r\n",
    ],
)
def test_plain_documents_decode_like_the_general_path(text: str) -> None:
    expected = general_load(text)
    got = load_documents(text)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert [type(d) for d in got] == [type(d) for d in expected]


def test_alias_bomb_still_caught_when_anchors_present() -> None:
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n"
        for p, n in zip("abcdefgh", "bcdefghi", strict=True)
    )
    _, findings = decode_manifest(bomb)
    assert [f.rule for f in findings] == ["yaml-alias-bomb"]


def test_undefined_alias_without_anchor_is_invalid_yaml() -> None:
    _, findings = decode_manifest("a: *nothing\n")
    assert [f.rule for f in findings] == ["invalid-yaml"]


def test_comment_only_and_blank_documents_are_skipped() -> None:
    manifest = "---\n# only a comment\n   \n---\n  # indented comment\n---\nkind: A\n"
    objects, findings = decode_manifest(manifest)
    assert (objects, findings) == ([{"kind": "A"}], [])


def test_modifications_copy_only_pod_holders_and_never_mutate_input() -> None:
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "securityContext": {}}]},
        },
    ]
    original = copy.deepcopy(objects)
    out, findings = apply_modifications(objects)
    assert objects == original
    assert out[0] == original[0]
    assert "nodeName" not in out[1]["spec"]
    assert out[1]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert len(findings) == 3


def _tgz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_may_have_hooks(tmp_path: Path) -> None:
    plain = {"c/Chart.yaml": b"name: c\n", "c/templates/a.yaml": b"kind: ConfigMap\n"}
    hook = b"metadata:\n  annotations:\n    helm.sh/hook: pre-install\n"
    cases = {
        "plain": (_tgz(plain), False),
        "template": (_tgz({**plain, "c/templates/h.yaml": hook}), True),
        "values": (_tgz({**plain, "c/values.yaml": b"a: {helm.sh/hook: x}\n"}), True),
        "nested": (_tgz({**plain, "c/charts/sub-1.0.0.tgz": _tgz({"sub/t.yaml": hook})}), True),
        "nested-plain": (_tgz({**plain, "c/charts/sub-1.0.0.tgz": _tgz(plain)}), False),
        "not-gzip": (b"garbage", True),
    }
    for name, (data, expected) in cases.items():
        path = tmp_path / f"{name}.tgz"
        path.write_bytes(data)
        assert may_have_hooks(str(path), {}) is expected, name
    assert may_have_hooks(str(tmp_path / "plain.tgz"), {"x": {"helm.sh/hook": "y"}}) is True


@pytest.fixture
async def renderer() -> AsyncIterator[ChartRenderer]:
    async with ChartRenderer(workers=1) as r:
        yield r


async def test_hook_in_a_subchart_is_still_reported(
    renderer: ChartRenderer, tmp_path: Path
) -> None:
    hook = yaml.safe_dump(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "sub-hook", "annotations": {"helm.sh/hook": "post-install"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": []}}},
        }
    )
    archive = build_chart(BASE, tmp_path, {"charts/extras/templates/hook.yaml": hook})
    result = await validate(renderer, archive)
    assert result.hooks_skipped == ["batch/v1/Job/sub-hook"]
    assert [f.rule for f in result.warnings] == ["hook-skipped"]


async def test_hook_from_values_is_still_reported(
    renderer: ChartRenderer, corpus_archive: ArchiveFactory, tmp_path: Path
) -> None:
    template = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-values\n"
        "  annotations: {{ toJson .Values.hookAnnotations }}\n"
    )
    archive = build_chart(BASE, tmp_path, {"templates/cm.yaml": template})
    result = await validate(renderer, archive, {"hookAnnotations": {"helm.sh/hook": "pre-install"}})
    assert result.hooks_skipped == ["v1/ConfigMap/from-values"]
