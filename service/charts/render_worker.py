"""Render worker process: renders charts with the Helm engine under an address-space limit.

Run as `python -m service.charts.render_worker --memory-limit BYTES`. It imports the Helm
engine once, caps its own address space at (address space after import + BYTES), reports
ready, then serves requests until stdin closes. Frames on stdin/stdout are a 4-byte big-endian
length followed by a UTF-8 JSON object. The parent (`render.ChartRenderer`) enforces the
wall-clock bound by killing the process.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import signal
import struct
import sys
from typing import Any, BinaryIO

RELEASE_NAME = "mini-service"
HOOK_ANNOTATION = "helm.sh/hook"
_HEADER = struct.Struct(">I")


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


def render(request: dict[str, Any], max_output_bytes: int) -> dict[str, Any]:
    """Render one chart like `helm template`; never raises for chart problems."""
    import helm_python as helm
    from helm_python import _native

    try:
        chart = helm.Chart.load(request["archive"])
    except helm.HelmError as exc:
        return {"ok": False, "error": "chart-invalid", "message": str(exc)}
    with chart:
        if chart.metadata.get("type") == "library":
            return {
                "ok": False,
                "error": "library-chart",
                "message": f"chart {chart.name!r} is a library chart, which cannot be installed",
            }
        options = {
            "namespace": request["namespace"],
            "dry_run": "client",
            "disable_hooks": True,
            "kube_version": request["kube_version"],
            "api_versions": request["api_versions"],
        }
        values = json.dumps(request["values"])
        try:
            with helm.Config(storage_driver="memory", namespace=request["namespace"]) as config:
                # Config.install() does not expose kube_version/api_versions, which the
                # library's install options accept, so the shim is called directly.
                release = json.loads(
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
            manifest = release.get("manifest") or ""
            if len(manifest) > max_output_bytes:
                return _too_large(max_output_bytes)
            # install() leaves hooks out of the manifest; render() has every template, so
            # it tells which templates were hooks (only those are sent back).
            everything = chart.render(
                request["values"],
                name=RELEASE_NAME,
                namespace=request["namespace"],
                is_install=True,
            )
        except helm.HelmError as exc:
            return {"ok": False, "error": "render-error", "message": str(exc)}
        hooks = {path: text for path, text in everything.items() if HOOK_ANNOTATION in text}
        crds = chart.crds
        size = len(manifest) + sum(map(len, hooks.values())) + sum(len(c["data"]) for c in crds)
        if size > max_output_bytes:
            return _too_large(max_output_bytes)
        return {
            "ok": True,
            "manifest": manifest,
            "hooks": hooks,
            "crds": crds,
            "chart": {"name": chart.name, "version": chart.version},
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
        try:
            response = render(request, args.max_output)
        except MemoryError:
            response = {"ok": False, "error": "render-memory", "message": "out of memory"}
        except Exception as exc:
            response = {"ok": False, "error": "internal", "message": repr(exc)}
        try:
            write_frame(out, response)
        except MemoryError:
            write_frame(out, {"ok": False, "error": "render-memory", "message": "out of memory"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
