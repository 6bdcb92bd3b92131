"""Render worker process: renders charts with the Helm engine under an address-space limit.

Run as `python -m service.charts.render_worker --memory-limit BYTES`. It imports the Helm
engine once, caps its own address space at (address space after import + BYTES), reports
ready, then serves requests until stdin closes. Frames on stdin/stdout are a 4-byte big-endian
length followed by a UTF-8 JSON object: one response per request, and a second one after a
response carrying `split`: a manifest of at least the request's `split_min_bytes` is decoded
from that offset on by this worker (`decode_tail`) while the parent decodes the first part.
The parent (`render.ChartRenderer`) enforces the wall-clock bound by killing the process.
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import os
import posixpath
import re
import resource
import signal
import struct
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

from service.core.kube import HOOK_ANNOTATION

RELEASE_NAME = "mini-service"
_HOOK_BYTES = HOOK_ANNOTATION.encode()
_HEADER = struct.Struct(">I")
#: Bytes of (nested) archive content `may_have_hooks` reads before it gives up and says yes.
_SCAN_BUDGET = 64 * 1024 * 1024
_SCAN_CHUNK = 256 * 1024
_NESTED_ARCHIVE_DEPTH = 3


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (length,) = _HEADER.unpack(header)
    payload = stream.read(length)
    if len(payload) < length:
        return None
    decoded: dict[str, Any] = json.loads(payload)
    return decoded


def write_frame(stream: BinaryIO, message: dict[str, Any]) -> None:
    payload = json.dumps(message).encode()
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _vm_size() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class _ScanBudgetExceeded(Exception):
    pass


def _scan_tar(fileobj: IO[bytes], depth: int, budget: list[int], *, gz: bool = True) -> bool:
    """Whether any file in the tar stream, or in a chart archive nested in it, contains the
    hook annotation; raises `_ScanBudgetExceeded` when the content is too large to scan.

    Decompresses with GzipFile: tarfile's own gzip reader mishandles the header extra field
    that Helm writes.
    """
    stream: IO[bytes] = (
        cast(IO[bytes], gzip.GzipFile(fileobj=fileobj, mode="rb")) if gz else fileobj
    )
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if not member.isreg():
                continue
            content = tar.extractfile(member)
            if content is None:
                continue
            name = member.name.lower()
            nested_gz = name.endswith((".tgz", ".tar.gz"))
            if nested_gz or name.endswith(".tar"):
                # A packaged subchart: Helm loads it, so its templates count too.
                if depth >= _NESTED_ARCHIVE_DEPTH:
                    raise _ScanBudgetExceeded
                if _scan_tar(content, depth + 1, budget, gz=nested_gz):
                    return True
                continue
            tail = b""
            while chunk := content.read(_SCAN_CHUNK):
                budget[0] -= len(chunk)
                if budget[0] < 0:
                    raise _ScanBudgetExceeded
                if _HOOK_BYTES in tail + chunk:
                    return True
                tail = chunk[-len(_HOOK_BYTES) :]
    return False


def may_have_hooks(archive: str, values: Any) -> bool:
    """Cheap, conservative test for hook templates before paying for a second render.

    Helm only treats a rendered object as a hook when it carries the `helm.sh/hook`
    annotation, which a chart writes into a template (its own or a subchart's, maybe through a
    helper), a values file or a chart file. When neither the archive's files (nested subchart
    archives included) nor the request's values contain that text, no template can be a hook
    and the install manifest is the whole story. Anything unreadable or too large to scan
    answers True.
    """
    if _HOOK_BYTES in json.dumps(values).encode():
        return True
    try:
        with open(archive, "rb") as raw:
            return _scan_tar(raw, 0, [_SCAN_BUDGET])
    except (_ScanBudgetExceeded, OSError, tarfile.TarError, EOFError, ValueError, zlib.error):
        return True


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
    """This worker's part of a split decode (`decode.Decoded.of`), as JSON."""
    from service.charts.decode import Decoded

    try:
        return {"ok": True, **Decoded.of(text, helm_order=helm_order).as_json()}
    except Exception as exc:  # HelmOrderUncertain, MemoryError: the parent decodes it all
        return {"ok": False, "message": str(exc) or repr(exc)}


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


def render(request: dict[str, Any], max_output_bytes: int) -> dict[str, Any]:
    """Render one chart like `helm template`; never raises for chart problems.

    The install action (`helm template`'s code path) re-parses every rendered document in Go
    to sort the manifest by kind and split out hooks, which costs more than the rendering
    itself. When the request allows it (`engine`) and `engine_eligible` says the engine is
    enough, the engine's output is returned instead, in template order and hooks included,
    with `"sorted": false`: the parent decodes those documents anyway, then sorts them and
    sets the hooks apart the way Helm does or, when a document is not plain enough to be
    sure of Helm's reading, asks again with `engine` false.
    """
    import helm_python as helm
    from helm_python import _native

    try:
        chart = helm.Chart.load(request["archive"])
    except helm.HelmError as exc:
        return {"ok": False, "error": "chart-invalid", "message": str(exc)}
    with chart:
        metadata = chart.metadata
        if metadata.get("type") == "library":
            return {
                "ok": False,
                "error": "library-chart",
                "message": f"chart {chart.name!r} is a library chart, which cannot be installed",
            }
        values = json.dumps(request["values"])
        if request.get("engine", False) and engine_eligible(
            chart, metadata, request["kube_version"]
        ):
            options = {
                "name": RELEASE_NAME,
                "namespace": request["namespace"],
                "is_install": True,
                "kube_version": request["kube_version"],
                "api_versions": request["api_versions"],
            }
            try:
                files = json.loads(
                    _native.call_string("helm_render", chart._raw(), values, json.dumps(options))
                )
            except helm.HelmError:
                pass  # the install action below reports it in its own words
            else:
                return _rendered(
                    chart, engine_manifest(files), {}, max_output_bytes, sorted_by_kind=False
                )
        hooks_possible = may_have_hooks(request["archive"], request["values"])
        try:
            release = install(
                chart,
                values,
                request["namespace"],
                request["kube_version"],
                request["api_versions"],
            )
            manifest = release.get("manifest") or ""
            if len(manifest) > max_output_bytes:
                return _too_large(max_output_bytes)
            # install() leaves hooks out of the manifest; render() has every template, so
            # it tells which templates were hooks (only those are sent back). Skipped when no
            # file of the chart and no value can produce a hook annotation.
            everything: dict[str, str] = {}
            if hooks_possible:
                everything = chart.render(
                    request["values"],
                    name=RELEASE_NAME,
                    namespace=request["namespace"],
                    is_install=True,
                )
        except helm.HelmError as exc:
            return {"ok": False, "error": "render-error", "message": str(exc)}
        hooks = {path: text for path, text in everything.items() if HOOK_ANNOTATION in text}
        return _rendered(chart, manifest, hooks, max_output_bytes, sorted_by_kind=True)


def _rendered(
    chart: Any,
    manifest: str,
    hooks: dict[str, str],
    max_output_bytes: int,
    *,
    sorted_by_kind: bool,
) -> dict[str, Any]:
    """The answer for a render, or `_too_large` when all it carries is over the limit."""
    crds = chart.crds
    size = len(manifest) + sum(map(len, hooks.values())) + sum(len(c["data"]) for c in crds)
    if size > max_output_bytes:
        return _too_large(max_output_bytes)
    return {
        "ok": True,
        "manifest": manifest,
        "hooks": hooks,
        "crds": crds,
        "sorted": sorted_by_kind,
    }


def _too_large(limit: int) -> dict[str, Any]:
    return {
        "ok": False,
        "error": "render-output",
        "message": f"the rendered chart exceeds the {limit // (1024 * 1024)} MiB output limit",
    }


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when the server dies, even mid-render."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="render_worker")
    parser.add_argument("--memory-limit", type=int, required=True)
    parser.add_argument("--max-output", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent()

    # The protocol owns the real stdout; anything the Go engine prints goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer

    import helm_python  # noqa: F401  (load the Go runtime before measuring the baseline)

    baseline = _vm_size()
    if args.memory_limit > 0:
        # The Go runtime reserves a large virtual arena at load time, so the cap is relative
        # to what the process already maps after importing the engine.
        limit = baseline + args.memory_limit
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    write_frame(out, {"ready": True, "pid": os.getpid(), "baseline": baseline})

    while (request := read_frame(inp)) is not None:
        offset: int | None = None
        try:
            response = render(request, args.max_output)
            if response.get("ok"):
                offset = split_offset(response["manifest"], request.get("split_min_bytes"))
                if offset is not None:
                    response["split"] = offset
        except MemoryError:
            response = {"ok": False, "error": "render-memory", "message": "out of memory"}
        except Exception as exc:
            response = {"ok": False, "error": "internal", "message": repr(exc)}
        try:
            write_frame(out, response)
        except MemoryError:
            write_frame(out, {"ok": False, "error": "render-memory", "message": "out of memory"})
            continue
        if offset is not None:
            # The parent decodes manifest[:offset] meanwhile: two cores instead of one.
            tail = decode_tail(response["manifest"][offset:], helm_order=not response["sorted"])
            try:
                write_frame(out, tail)
            except MemoryError:
                write_frame(out, {"ok": False, "message": "out of memory"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
