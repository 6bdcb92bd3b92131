"""Render worker process: renders charts with the Helm engine under an address-space limit.

Run as `python -m service.charts.render_worker --memory-limit BYTES`. It imports the Helm
engine once, caps its own address space at (address space after import + BYTES), reports
ready, then serves requests until stdin closes. Frames on stdin/stdout are a 4-byte big-endian
length followed by a UTF-8 JSON object: one response per request, and a second one after a
response carrying `split`: a manifest of at least the request's `split_min_bytes` is decoded
from that offset on by this worker (`decode_tail`) while the parent decodes the first part.
The parent (`render.ChartRenderer`) enforces the wall-clock bound by killing the process.

The engine path, the split decode and the calls into private `helm_python` APIs live in
`helm_engine`; this module is the process around them (framing, limits, hook scan).
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import os
import resource
import signal
import struct
import sys
import tarfile
import zlib
from typing import IO, Any, BinaryIO, cast

from service.charts.helm_engine import (
    RELEASE_NAME,
    decode_tail,
    engine_render,
    install,
    split_offset,
)
from service.core.kube import HOOK_ANNOTATION

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


def render(request: dict[str, Any], max_output_bytes: int) -> dict[str, Any]:
    """Render one chart like `helm template`; never raises for chart problems.

    When the request allows it (`engine`), the Helm engine path is tried first
    (`helm_engine.engine_render`): its output comes back in template order, hooks included,
    with `"sorted": false`. Otherwise, or when that path declines, Helm's install action
    answers (`helm_engine.install`), sorted by kind and without the hooks.
    """
    import helm_python as helm

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
        if request.get("engine", False):
            in_template_order = engine_render(
                chart,
                metadata,
                values,
                namespace=request["namespace"],
                kube_version=request["kube_version"],
                api_versions=request["api_versions"],
            )
            if in_template_order is not None:
                return _rendered(
                    chart, in_template_order, {}, max_output_bytes, sorted_by_kind=False
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
