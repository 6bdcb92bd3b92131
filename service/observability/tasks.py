"""A task's signals on its telemetries' pipelines (the in-process export; on Kubernetes the
task Job's collector sends them): its lines on the LOGS telemetry, its progress, status and
GPUs as gauges on the METRICS telemetry, and a trace of its lifetime on the TRACES telemetry.

The trace of a task is made when it ends, with ids derived from the task's id: its trace id
is the task's UUID, so a trace is found by the task's id, and a trace sent twice (a restart
within the window the task exports look back on) is the same spans, which trace stores keep
once. Its root span, `task`, runs from the creation to the end, its status ERROR unless the
task COMPLETED; its children are the phases it went through: `queue wait` (created to
launched), `launch` (launched to its container running) and `run` (running to the end).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from service.observability.endpoints import Backlog, Drops, EndpointStatus
from service.observability.events import TaskEnded, TaskLogged, TaskSeen, TaskSource
from service.observability.logs import Line, LogBatcher
from service.observability.models import Kind
from service.observability.references import FIELDS


class Recorder(Protocol):
    """What of a telemetry's pipeline (pipeline.py) a task's signals are recorded on."""

    status: EndpointStatus
    drops: Drops
    spans: BatchSpanProcessor | None
    backlog: Backlog
    resource: Resource
    logs: LogBatcher | None


SCOPE = InstrumentationScope("nvcf.task")
#: NVCT's TaskStatusEnum: the values of the status gauge's `status` attribute
STATUSES = (
    "QUEUED",
    "LAUNCHED",
    "RUNNING",
    "COMPLETED",
    "CANCELED",
    "ERRORED",
    "EXCEEDED_MAX_RUNTIME_DURATION",
    "EXCEEDED_MAX_QUEUED_DURATION",
)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


@dataclass(frozen=True)
class TaskLine(Line):
    """One line a task's container printed (`instance_id` is the task's id)."""

    task_name: str = ""

    def attributes(self) -> dict[str, str]:
        return {
            "nvcf.account": self.account,
            "nvcf.task.id": self.instance_id,
            "nvcf.task.name": self.task_name,
            "k8s.pod.name": self.pod,
            "k8s.container.name": self.container,
        }


def _span_id(task_id: str, name: str) -> int:
    digest = hashlib.sha256(f"{task_id}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def task_spans(event: TaskEnded, resource: Resource) -> list[ReadableSpan]:
    """The task's lifetime as finished spans: `task` and the phases it went through."""
    task = event.task
    trace_id = uuid.UUID(task.task_id).int
    root = SpanContext(trace_id, _span_id(task.task_id, "task"), False, _SAMPLED)
    attributes: dict[str, str | int] = {
        **task.attributes(),
        "nvcf.task.status": task.status,
        "nvcf.task.gpus": task.gpus,
    }
    failed = task.status != "COMPLETED"
    spans = [
        ReadableSpan(
            "task",
            root,
            None,
            resource,
            attributes,
            kind=SpanKind.INTERNAL,
            status=Status(StatusCode.ERROR, task.status) if failed else Status(StatusCode.OK),
            start_time=event.created_ns,
            end_time=event.finished_ns,
            instrumentation_scope=SCOPE,
        )
    ]
    marks = [event.created_ns, event.launched_ns, event.running_ns, event.finished_ns]
    for i, name in enumerate(("queue wait", "launch", "run")):
        start = marks[i]
        if start is None:
            break
        end = next((m for m in marks[i + 1 :] if m is not None), event.finished_ns)
        context = SpanContext(trace_id, _span_id(task.task_id, name), False, _SAMPLED)
        # the phase the task ended in carries its failure
        last = all(m is None for m in marks[i + 1 : 3])
        spans.append(
            ReadableSpan(
                name,
                context,
                root,
                resource,
                attributes,
                kind=SpanKind.INTERNAL,
                status=Status(StatusCode.ERROR, task.status) if failed and last else Status(),
                start_time=start,
                end_time=max(start, end),
                instrumentation_scope=SCOPE,
            )
        )
    return spans


def record_task(pipeline: Recorder, kinds: Collection[Kind], event: TaskLogged | TaskEnded) -> None:
    """A task's lines or its ended lifetime on the pipeline (never blocks)."""
    if isinstance(event, TaskLogged):
        if Kind.LOGS in kinds and pipeline.logs is not None:
            pipeline.logs.add(event.lines)
        return
    if Kind.TRACES not in kinds or pipeline.spans is None:
        return
    spans = task_spans(event, pipeline.resource)
    if pipeline.backlog.take(len(spans)):
        for span in spans:
            pipeline.spans.on_end(span)
    else:  # the processor's queue is full (a slow or dead endpoint)
        pipeline.drops.add("queue_full", len(spans))
        pipeline.status.lost(len(spans))


def names_metrics(telemetries: Mapping[str, str], telemetry_id: uuid.UUID) -> bool:
    field = next(f for f, k in FIELDS.items() if k is Kind.METRICS)
    return str(telemetries.get(field, "")).lower() == str(telemetry_id)


def task_gauges(meter: Meter, account: str, telemetry_id: uuid.UUID, tasks: TaskSource) -> None:
    """The gauges of the account's tasks naming the telemetry for METRICS: progress (percent),
    status (1 for the task's status, 0 for the others, as kube-state-metrics' phases) and
    GPUs, read from the task exports' last snapshot."""

    def observe(
        read: Callable[[TaskSeen], list[tuple[int, dict[str, str]]]],
    ) -> Callable[[CallbackOptions], list[Observation]]:
        def callback(options: CallbackOptions) -> list[Observation]:
            return [
                Observation(value, {**t.attributes(), **extra})
                for t in tasks()
                if t.account == account and names_metrics(t.telemetries, telemetry_id)
                for value, extra in read(t)
            ]

        return callback

    meter.create_observable_gauge(
        "nvcf.task.progress",
        [observe(lambda t: [(t.percent, {})] if t.percent is not None else [])],
        unit="%",
        description="The task's progress, as its progress file last said (percent)",
    )
    meter.create_observable_gauge(
        "nvcf.task.status",
        [observe(lambda t: [(int(s == t.status), {"status": s}) for s in STATUSES])],
        unit="1",
        description="1 for the task's status, 0 for the others",
    )
    meter.create_observable_gauge(
        "nvcf.task.gpus",
        [observe(lambda t: [(t.gpus, {})])],
        unit="{gpu}",
        description="The GPUs the task's instance type asks for",
    )
