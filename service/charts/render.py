"""Render chart archives like `helm template`, isolated in a pool of worker processes.

A call into the Go engine cannot be interrupted from Python, so every render runs in a
reusable worker process (`render_worker`) with an address-space cap; the parent enforces the
wall-clock bound by killing the worker, which is replaced on the next render.

The speed-ups over `helm template` (the Helm engine path, the split decode of large renders,
the separator port, the private `helm_python` calls) are in `helm_engine`, which says what
each does, why it gives what Helm's install action gives and when it falls back;
`ChartRenderer(helm_engine_path=False)` (setting `NVCF_HELM_ENGINE_PATH`) forces the install
action for every chart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

from service.charts.decode import (
    Decoded,
    HelmOrderUncertain,
    crd_names,
    hook_findings,
    skipped_hooks,
)
from service.charts.findings import Finding, PipelineResult
from service.charts.helm_engine import (
    DEFAULT_SPLIT_DECODE_MIN_BYTES,
    ENGINE,
    INSTALL,
    HelmPath,
    split_decode,
)
from service.charts.helm_engine import (
    log as engine_log,  # the helm_path line keeps the engine's logger, as operators filter it
)
from service.charts.kube_schema import validate_objects
from service.charts.modify import apply_modifications
from service.charts.policy import ValidationPolicy, restrict
from service.charts.workload import extract_workload_config
from service.core.errors import BadRequest, FieldError
from service.core.settings import Settings

T = TypeVar("T")

_DEFAULTS = Settings.model_construct()  # each default is written once, in Settings
DEFAULT_TIMEOUT = _DEFAULTS.render_timeout
DEFAULT_MEMORY_LIMIT = _DEFAULTS.render_memory_limit_bytes
DEFAULT_MAX_OUTPUT = 64 * 1024 * 1024
DEFAULT_KUBE_VERSION = _DEFAULTS.default_kube_version
#: Namespace used when rendering at function creation, before any instance exists.
PLACEHOLDER_NAMESPACE = "nvcf-validation"
WORKER_START_TIMEOUT = 60.0

_HEADER = struct.Struct(">I")
_OOM_MARKERS = (
    b"out of memory",
    b"cannot allocate memory",
    b"MemoryError",
    b"pthread_create failed",
)


class ChartRenderError(BadRequest):
    """Helm could not render the chart, or the render broke a limit; `rule` says which."""

    @classmethod
    def of(cls, rule: str, message: str) -> ChartRenderError:
        return cls(
            detail=message, errors=[FieldError(field="helmChart", message=message, rule=rule)]
        )

    @property
    def rule(self) -> str:
        return self.errors[0].rule or "render-error" if self.errors else "render-error"


@dataclass(frozen=True)
class RenderOutput:
    """What Helm produced: the manifest (hooks and CRDs left out) and what was left out."""

    manifest: str
    #: template path -> rendered text, for templates that carry a `helm.sh/hook` annotation
    hook_templates: dict[str, str] = field(default_factory=dict)
    #: `[{"name", "filename", "data"}]` from the chart's and subcharts' `crds/`
    crds: list[dict[str, str]] = field(default_factory=list)
    #: False for an engine render in template order (see `helm_engine`): the
    #: decoder sorts it like Helm, or says it cannot (`HelmOrderUncertain`).
    sorted_by_kind: bool = True
    #: `Decoded.of(manifest, helm_order=not sorted_by_kind)` when the worker and this
    #: process decoded a large render together; None otherwise (then `check_rendered`
    #: decodes the manifest). Handed to one check only: the objects are not copied.
    decoded: Decoded | None = None

    @property
    def helm_path(self) -> HelmPath:
        """Which path rendered this: `"engine"` (the Helm engine alone, in template order) or
        `"install"` (Helm's install action)."""
        return INSTALL if self.sorted_by_kind else ENGINE


class _WorkerDied(Exception):
    pass


class _Worker:
    """One render worker process and its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.stderr_tail = b""
        self.out_of_memory = False
        self._drain = asyncio.ensure_future(self._drain_stderr())

    @classmethod
    async def start(cls, memory_limit: int, max_output: int) -> _Worker:
        env = dict(os.environ)
        if memory_limit > 0:
            # A soft Go heap target below the hard cap makes the GC work before the cap hits.
            env.setdefault("GOMEMLIMIT", str(memory_limit * 3 // 4))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service.charts.render_worker",
            "--memory-limit",
            str(memory_limit),
            "--max-output",
            str(max_output),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        worker = cls(proc)
        try:
            async with asyncio.timeout(WORKER_START_TIMEOUT):
                ready = await worker.read_frame(max_output)
        except BaseException:
            await worker.kill()
            raise
        if not ready.get("ready"):
            await worker.kill()
            raise RuntimeError(f"render worker did not start: {ready!r}")
        return worker

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            window = self.stderr_tail[-64:] + chunk
            if any(marker in window for marker in _OOM_MARKERS):
                self.out_of_memory = True
            self.stderr_tail = (self.stderr_tail + chunk)[-4096:]

    async def read_frame(self, max_output: int) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            header = await self.proc.stdout.readexactly(_HEADER.size)
            (length,) = _HEADER.unpack(header)
            if length > 2 * max_output + 65536:
                raise _WorkerDied(f"oversized response ({length} bytes)")
            payload = await self.proc.stdout.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise _WorkerDied(str(exc)) from exc
        decoded: dict[str, Any] = json.loads(payload)
        return decoded

    async def call(self, request: dict[str, Any], max_output: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        payload = json.dumps(request).encode()
        try:
            self.proc.stdin.write(_HEADER.pack(len(payload)) + payload)
            await self.proc.stdin.drain()
        except ConnectionError as exc:
            raise _WorkerDied(str(exc)) from exc
        return await self.read_frame(max_output)

    async def exited(self) -> None:
        """Wait briefly for a dying worker so its exit status and stderr are known."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.shield(self.proc.wait())
        # asyncio.wait, not the task itself: its own end (a cancel included) is not ours
        await asyncio.wait([self._drain], timeout=1)

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await asyncio.shield(self.proc.wait())
        self._drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._drain


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


class ChartRenderer:
    """A bounded pool of render worker processes with per-render time and memory limits."""

    def __init__(
        self,
        workers: int = _DEFAULTS.render_workers,
        timeout: float = DEFAULT_TIMEOUT,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT,
        split_decode_min_bytes: int | None = DEFAULT_SPLIT_DECODE_MIN_BYTES,
        helm_engine_path: bool = _DEFAULTS.helm_engine_path,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.workers = workers
        self.timeout = timeout
        self.memory_limit_bytes = memory_limit_bytes
        self.max_output_bytes = max_output_bytes
        #: None: never split the decoding of a render with the worker
        self.split_decode_min_bytes = split_decode_min_bytes
        #: False: never take the Helm engine path, whatever `render(engine=...)` says
        self.helm_engine_path = helm_engine_path
        self._slots = asyncio.Semaphore(workers)
        self._idle: list[_Worker] = []
        self._closed = False
        #: workers started so far (replacements included); useful to observe replacement
        self.started = 0

    async def _start(self) -> _Worker:
        self.started += 1
        return await _Worker.start(self.memory_limit_bytes, self.max_output_bytes)

    async def render(
        self,
        archive: Path,
        *,
        values: dict[str, Any] | None = None,
        namespace: str,
        kube_version: str = DEFAULT_KUBE_VERSION,
        api_versions: list[str] | None = None,
        engine: bool = False,
    ) -> RenderOutput:
        """Render `archive` with `values` coalesced over the chart's defaults.

        `engine` allows the worker to skip Helm's install action when it adds nothing but
        its re-parse, and return the engine's output in template order (`sorted_by_kind`
        false; see `helm_engine`), unless this renderer was made with
        `helm_engine_path=False`.

        Raises:
            ChartRenderError: Helm refused the chart or values (message with file and line
                when Helm gives them), or the render exceeded a limit.
        """
        if self._closed:
            raise RuntimeError("renderer is closed")
        request = {
            "archive": os.fspath(archive),
            "values": values or {},
            "namespace": namespace,
            "kube_version": kube_version,
            "api_versions": list(api_versions or []),
            "engine": engine and self.helm_engine_path,
            "split_min_bytes": self.split_decode_min_bytes,
        }
        async with self._slots:
            while self._idle and self._idle[-1].proc.returncode is not None:
                await self._idle.pop().kill()  # died while idle
            worker = self._idle.pop() if self._idle else await self._start()
            keep = False
            decoded: Decoded | None = None
            try:
                async with asyncio.timeout(self.timeout):
                    response = await worker.call(request, self.max_output_bytes)
                # a worker that hit MemoryError in Python is not trusted with another render
                keep = response.get("error") != "render-memory"
                offset = response.get("split")
                if response.get("ok") and isinstance(offset, int):
                    # a second frame is on its way: until it is read (if this task is
                    # cancelled meanwhile) the worker cannot serve anyone else
                    keep = False
                    keep, decoded = await self._split_decode(
                        worker, response["manifest"], offset, not response.get("sorted", True)
                    )
            except TimeoutError:
                raise ChartRenderError.of(
                    "render-timeout",
                    f"rendering exceeded the {self.timeout:g} s time limit",
                ) from None
            except _WorkerDied:
                await worker.exited()
                if worker.out_of_memory:
                    raise ChartRenderError.of(
                        "render-memory",
                        f"rendering exceeded the {_mib(self.memory_limit_bytes)} memory limit",
                    ) from None
                tail = worker.stderr_tail.decode(errors="replace").strip()[-500:]
                raise ChartRenderError.of(
                    "render-error",
                    f"the render worker crashed (exit status {worker.proc.returncode}): {tail}",
                ) from None
            finally:
                if keep and not self._closed:
                    self._idle.append(worker)
                else:
                    await worker.kill()
        return self._output(response, decoded)

    async def _split_decode(
        self, worker: _Worker, manifest: str, offset: int, helm_order: bool
    ) -> tuple[bool, Decoded | None]:
        """`helm_engine.split_decode` with `worker`'s second frame."""

        async def read_tail() -> dict[str, Any] | None:
            try:
                async with asyncio.timeout(self.timeout):
                    return await worker.read_frame(self.max_output_bytes)
            except (TimeoutError, _WorkerDied):
                return None

        return await split_decode(manifest, offset, helm_order, read_tail)

    def _output(self, response: dict[str, Any], decoded: Decoded | None = None) -> RenderOutput:
        if not response.get("ok"):
            rule = str(response.get("error") or "render-error")
            message = str(response.get("message") or "rendering failed")
            if rule == "render-memory":
                message = f"rendering exceeded the {_mib(self.memory_limit_bytes)} memory limit"
            if rule == "internal":
                rule, message = "render-error", f"rendering failed: {message}"
            raise ChartRenderError.of(rule, message)
        return RenderOutput(
            manifest=response["manifest"],
            hook_templates=dict(response.get("hooks") or {}),
            crds=list(response.get("crds") or []),
            sorted_by_kind=bool(response.get("sorted", True)),
            decoded=decoded,
        )

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(w.kill() for w in idle))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def check_rendered(
    output: RenderOutput,
    *,
    service_name: str | None,
    inference_port: int,
    policy: ValidationPolicy | None = None,
    enforce_security: bool = False,
    instance_type_nodes: int | None = None,
    gpus_per_node: int | None = None,
    nvlink: bool = False,
    schema_kube_version: str | None = None,
    declared_api_versions: Sequence[str] = (),
) -> PipelineResult:
    """Decode, extract the workload config, restrict and modify a render (pure); with
    `schema_kube_version`, validate the resulting objects against that Kubernetes version's
    schema (`kube_schema.validate_objects`, the cluster's `declared_api_versions` served)."""
    result = PipelineResult()
    decoded = output.decoded or Decoded.of(output.manifest, helm_order=not output.sorted_by_kind)
    # an install-action render brings its hook templates; an engine render's decoding finds
    # the hooks in its manifest
    from_templates = hook_findings(output.hook_templates)
    from_manifest = skipped_hooks(decoded.hooks)
    result.hooks_skipped = from_templates[0] + from_manifest[0]
    result.add(*from_templates[1], *from_manifest[1])
    for ref in crd_names(output.crds):
        result.crds_skipped.append(ref)
        result.add(
            Finding(
                "crd-skipped",
                "warning",
                ref,
                None,
                "CustomResourceDefinitions from crds/ are dropped and never installed",
            )
        )
    result.add(*decoded.findings)
    objects, result.workload_config, workload_findings = extract_workload_config(decoded.objects())
    result.add(*workload_findings)
    objects, policy_findings, crds = restrict(
        objects,
        service_name=service_name,
        inference_port=inference_port,
        policy=policy,
        enforce_security=enforce_security,
        instance_type_nodes=instance_type_nodes,
        gpus_per_node=gpus_per_node,
        nvlink=nvlink,
    )
    result.crds_skipped.extend(crds)
    result.add(*policy_findings)
    result.objects, modifications = apply_modifications(objects)
    result.add(*modifications)
    if schema_kube_version is not None:
        result.add(
            *validate_objects(
                result.objects,
                schema_kube_version,
                declared_api_versions=declared_api_versions,
            )
        )
    return result


# --- the answer and its fallback (in the server process) ----------------------------------


async def render_checked(
    render: Callable[[bool], Awaitable[RenderOutput]], check: Callable[[RenderOutput], T]
) -> T:
    """`check(await render(engine=True))` in a thread (decoding is CPU work), falling back to
    Helm's install action when the engine's template-order output cannot be sorted like
    Helm with certainty; logs which path answered (`helm_path`). Raises `ChartRenderError`
    from either render."""
    output = await render(True)
    fallback = False
    try:
        result = await asyncio.to_thread(check, output)
    except HelmOrderUncertain:
        fallback = True
        output = await render(False)
        result = await asyncio.to_thread(check, output)
    engine_log.info(
        "chart render answered by helm_path=%s%s",
        output.helm_path,
        " after fallback" if fallback else "",
        extra={"helm_path": output.helm_path, "helm_fallback": fallback},
    )
    return result
