"""The Helm engine path: every speed-up of chart rendering over `helm template`, in one place.

The reference is Helm's install action in client dry-run, which is what `helm template` runs
(`install`: `Config(storage_driver="memory")` + install with `dry_run="client"`). Everything
here gives the same objects and findings faster, and falls back to that reference whenever
it cannot be sure.

What it speeds up
  * **Engine path** (`engine_render`). The install action renders the templates with the Helm
    engine, then re-parses every rendered document in Go to sort the manifest by kind and set
    the hooks apart, which costs more than the rendering itself. For a chart that
    `engine_eligible` accepts, the render worker calls the engine alone and returns its output
    in template order, hooks included (`RenderOutput.sorted_by_kind` false). The parent has
    to decode those documents anyway; it then sorts them and sets the hooks apart as Helm
    does (`decode.helm_entries`, `decode.INSTALL_ORDER`).
  * **Separator port** (`helm_split`, `split_manifests`, `engine_manifest`). Helm's document
    separator and `SplitManifests`, written out in Python so that the engine's files become
    the manifest the install action would write (same documents, `# Source:` lines), and
    fast: Python's regex engine would try Helm's pattern at every position.
  * **Split decode** (`split_offset`, `decode_tail`, `split_decode`). A render from
    `DEFAULT_SPLIT_DECODE_MIN_BYTES` on (either path) is cut where a document starts near
    its middle; the worker that rendered it decodes the second half while the parent decodes
    the first, on two cores. The halves concatenate (`decode.Decoded.extend`) to the decoding
    of the whole; if either half fails, nothing is handed over and the check decodes it all.
  * **Private `helm_python` calls** (`install`, `engine_render`). `Config.install()` does not
    expose kube_version/api_versions, and `Chart.render` has no capabilities either, so both
    call the library's native shim (`_native.call_string`, `Config._raw`, `Chart._raw`)
    directly. These are the only uses of private `helm_python` APIs in the service; the
    pinned library version (pyproject.toml) and tests/charts/test_engine_render.py hold
    them to the behaviour relied on.

Why it is equivalent to the install action
  The engine call processes dependencies (conditions, tags, aliases, import-values) exactly as
  the install action does, since the install action calls the same engine. What the install
  action adds is (a) two refusals, a dependency declared in Chart.yaml but missing from
  charts/ and a `kubeVersion` constraint the cluster does not meet, which `engine_eligible`
  checks first (asking Helm itself for the constraint); (b) the sort by kind and the hook
  split, which the decoder reproduces from Helm's own reading of each document's head
  (`SimpleHead`: apiVersion, kind, metadata.name, metadata.annotations); and (c) dropping
  NOTES and partials and splitting documents, which `engine_manifest` ports.
  tests/charts/test_engine_render.py compares both paths on the whole corpus, and
  tests/charts/test_helm_engine.py the setting below on and off.

When it falls back to the install action
  * the caller did not allow it (`engine=False`), or the setting `NVCF_HELM_ENGINE_PATH` is
    false (`Settings.helm_engine_path`, passed to `ChartRenderer(helm_engine_path=...)`,
    which then never asks the worker for the engine): every chart takes the install action;
  * `engine_eligible` says no (missing dependency, unmet or unreadable `kubeVersion`);
  * the engine call fails (the install action then reports the error in Helm's words);
  * the decoder cannot vouch for Helm's reading of a document (a non-plain head, several YAML
    documents in one, a document that does not decode): it raises
    `decode.HelmOrderUncertain` and `render.render_checked` renders again with the install action.

Which path answered
  `RenderOutput.helm_path` is `"engine"` or `"install"`, and `render.render_checked` (every chart
  validation: function creation, dry-run, deployments) logs one INFO record per answer on
  the logger `service.charts.helm_engine`, "chart render answered by helm_path=engine" (or
  `install`, with "after fallback" when the engine's output was refused), carrying the
  record attributes `helm_path` and `helm_fallback` for log processors.

The render worker imports this module at start-up, so it imports nothing heavy at module
level: `helm_python`, `asyncio` and the decoder are imported where they are used.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from service.charts.decode import Decoded

log = logging.getLogger(__name__)


#: The release name every render uses (Helm's `.Release.Name`).
RELEASE_NAME = "mini-service"

HelmPath = Literal["engine", "install"]
#: The engine's output in template order, sorted like Helm by the decoder.
ENGINE: Final = "engine"
#: Helm's install action (`helm template`'s code path).
INSTALL: Final = "install"

#: Renders from this size on are decoded half in the parent, half in the worker that made them.
DEFAULT_SPLIT_DECODE_MIN_BYTES = 48 * 1024


# --- the separator port --------------------------------------------------------------------

#: Go's `unicode.IsSpace` (Helm trims and tests documents with it; Python's `str.strip`
#: also strips \x1c-\x1f, which Go keeps).
GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000"
)
#: RE2's `\s` (ASCII), as in Helm's document separator.
_RE2_SPACE = "\t\n\f\r "
_RE2_SPACES = re.compile(r"[\t\n\f\r ]*")
NOTES_SUFFIX = "NOTES.txt"


def helm_split(text: str) -> list[str]:
    """`regexp.MustCompile("(?:^|\\s*\\n)---\\s*").Split(text, -1)` as Go computes it.

    Written out because Python's regex engine tries the pattern at every position (7 ms for
    a 100 KB template): every match but one at the start holds "\\n---", so the leftmost one
    is the next such text, widened back over the whitespace before it (never past the last
    match, whose greedy tail ends at non-whitespace) and forward over the whitespace after.
    """
    pieces: list[str] = []
    begin = 0
    if text.startswith("---"):
        pieces.append("")
        begin = _RE2_SPACES.match(text, 3).end()  # type: ignore[union-attr]
    while (found := text.find("\n---", begin)) >= 0:
        start = found
        while start > begin and text[start - 1] in _RE2_SPACE:
            start -= 1
        pieces.append(text[begin:start])
        begin = _RE2_SPACES.match(text, found + 4).end()  # type: ignore[union-attr]
    pieces.append(text[begin:])
    return pieces


def split_manifests(text: str) -> list[str]:
    """Helm's `SplitManifests`: the non-blank documents of one template, left-trimmed."""
    docs = helm_split(text.lstrip(GO_SPACE))
    return [doc.lstrip(GO_SPACE) for doc in docs if doc.strip(GO_SPACE)]


def engine_manifest(files: dict[str, str]) -> str:
    """The manifest Helm's install action writes for `files` (the engine's output), but in
    template order rather than sorted by kind: NOTES and partials dropped, each document as
    `---\\n# Source: <template>\\n<document>\\n`. Hooks are still in it."""
    parts: list[str] = []
    for path in sorted(files):
        content = files[path]
        if path.endswith(NOTES_SUFFIX) or posixpath.basename(path).startswith("_"):
            continue
        if not content.strip(GO_SPACE):
            continue
        parts.extend(f"---\n# Source: {path}\n{doc}\n" for doc in split_manifests(content))
    return "".join(parts)


# --- the private helm_python calls (in the render worker) ----------------------------------


def install(
    chart: Any, values: str, namespace: str, kube_version: str, api_versions: list[str]
) -> dict[str, Any]:
    """Helm's install action in client dry-run: what `helm template` runs. Raises HelmError."""
    import helm_python as helm
    from helm_python import _native

    options = {
        "namespace": namespace,
        "dry_run": "client",
        "disable_hooks": True,
        "kube_version": kube_version,
        "api_versions": api_versions,
    }
    with helm.Config(storage_driver="memory", namespace=namespace) as config:
        # Config.install() does not expose kube_version/api_versions, which the library's
        # install options accept, so the shim is called directly.
        release: dict[str, Any] = json.loads(
            _native.call_string(
                "helm_install",
                config._raw(),
                _native.HANDLE(0),
                chart._raw(),
                None,
                RELEASE_NAME,
                values,
                json.dumps(options),
            )
        )
    return release


def engine_render(
    chart: Any,
    metadata: dict[str, Any],
    values: str,
    *,
    namespace: str,
    kube_version: str,
    api_versions: list[str],
) -> str | None:
    """The engine path's render of a loaded chart (`values` as JSON): the template-order
    manifest (`engine_manifest`), or None when the install action must answer instead (the
    chart is not `engine_eligible`, or the engine failed: the install action then reports it
    in its own words)."""
    if not engine_eligible(chart, metadata, kube_version):
        return None
    import helm_python as helm
    from helm_python import _native

    options = {
        "name": RELEASE_NAME,
        "namespace": namespace,
        "is_install": True,
        "kube_version": kube_version,
        "api_versions": api_versions,
    }
    try:
        # Chart.render() takes no capabilities (kube version, API versions): the shim does.
        files = json.loads(
            _native.call_string("helm_render", chart._raw(), values, json.dumps(options))
        )
    except helm.HelmError:
        return None
    return engine_manifest(files)


# --- whether a chart can take the engine path ----------------------------------------------

#: (kubeVersion constraint, kube version) -> whether the install action accepts it
_KUBE_VERSION_CHECKS: dict[tuple[str, str], bool] = {}
_KUBE_VERSION_CHECKS_MAX = 256


def kube_version_accepted(constraint: str, kube_version: str) -> bool:
    """Whether Helm's install action accepts a chart's `kubeVersion` constraint for
    `kube_version`, asked of Helm itself with a chart holding nothing but that constraint
    (no template to render, so about a millisecond). Any failure answers False."""
    import helm_python as helm

    key = (constraint, kube_version)
    known = _KUBE_VERSION_CHECKS.get(key)
    if known is not None:
        return known
    with tempfile.TemporaryDirectory(prefix="nvcf-kube-version-") as directory:
        # JSON is YAML: the constraint goes through unchanged, whatever its characters.
        meta = {"apiVersion": "v2", "name": "kube-version-check", "version": "0.0.0"}
        Path(directory, "Chart.yaml").write_text(json.dumps({**meta, "kubeVersion": constraint}))
        try:
            with helm.Chart.load(directory) as probe:
                install(probe, "{}", "default", kube_version, [])
            accepted = True
        except helm.HelmError:
            accepted = False
    if len(_KUBE_VERSION_CHECKS) >= _KUBE_VERSION_CHECKS_MAX:
        _KUBE_VERSION_CHECKS.clear()
    _KUBE_VERSION_CHECKS[key] = accepted
    return accepted


def engine_eligible(chart: Any, metadata: dict[str, Any], kube_version: str) -> bool:
    """Whether the engine alone renders what the install action would. The engine call
    processes dependencies (conditions, tags, aliases, import-values) as the install action
    does; what it skips is the install action's refusals: a dependency declared in Chart.yaml
    but missing from charts/, and a `kubeVersion` constraint the cluster does not meet."""
    declared = {dep.get("name") for dep in metadata.get("dependencies") or []}
    if not declared <= {sub.get("name") for sub in chart.dependencies}:
        return False
    constraint = metadata.get("kubeVersion")
    return not constraint or kube_version_accepted(str(constraint), kube_version)


# --- split decode ---------------------------------------------------------------------------


def split_offset(manifest: str, min_bytes: int | None) -> int | None:
    """Where the second half of a manifest of at least `min_bytes` starts: the start of a
    `---` line near the middle, so that decoding both parts gives what decoding the whole
    does (`decode` works document by document). None: no split."""
    if min_bytes is None or len(manifest) < min_bytes:
        return None
    middle = len(manifest) // 2
    found = manifest.find("\n---\n", middle)
    if found < 0:
        found = manifest.rfind("\n---\n", 0, middle)
    return found + 1 if found >= 0 else None


def decode_tail(text: str, *, helm_order: bool) -> dict[str, Any]:
    """The worker's part of a split decode (`decode.Decoded.of`), as JSON."""
    from service.charts.decode import Decoded

    try:
        return {"ok": True, **Decoded.of(text, helm_order=helm_order).as_json()}
    except Exception as exc:  # HelmOrderUncertain, MemoryError: the parent decodes it all
        return {"ok": False, "message": str(exc) or repr(exc)}


def decode_head(text: str, helm_order: bool) -> Decoded | None:
    """The parent's part of a split decode; None when it fails (the check decodes it all)."""
    from service.charts.decode import Decoded

    try:
        return Decoded.of(text, helm_order=helm_order)
    except Exception:  # HelmOrderUncertain, MemoryError: check_rendered decodes it all
        return None


async def split_decode(
    manifest: str,
    offset: int,
    helm_order: bool,
    read_tail: Callable[[], Awaitable[dict[str, Any] | None]],
) -> tuple[bool, Decoded | None]:
    """Decode `manifest[:offset]` in a thread while the worker's decode of the rest arrives
    (`read_tail`: its frame, or None when the worker timed out or died); returns (whether
    the worker can be kept, the decoding of the whole, or None when either part failed,
    which leaves the decoding to `check_rendered`)."""
    import asyncio

    from service.charts.decode import Decoded

    local = asyncio.ensure_future(asyncio.to_thread(decode_head, manifest[:offset], helm_order))
    remote = await read_tail()
    keep = remote is not None
    decoded = await local
    if decoded is None or remote is None or not remote.get("ok"):
        return keep, None
    try:
        decoded.extend(Decoded.from_json(remote))
    except (KeyError, TypeError, ValueError):
        return False, None
    return keep, decoded
