"""What the invocation plane and the deployments' side hand to the export (export.py): an
answered invocation with its phases and trace ids, an LLM invocation's tokens, an instance's
log lines, a version's load and its instances by phase."""

from __future__ import annotations

import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from service.observability import logs
from service.observability.models import Kind
from service.observability.references import FIELDS

_IDS = RandomIdGenerator()


@dataclass(frozen=True)
class TraceIds:
    """The ids an invocation's trace is exported under, chosen when it is admitted so that
    the worker gets its span's id in `traceparent` and its own spans become that span's
    children."""

    trace_id: int
    worker_span_id: int

    @classmethod
    def new(cls) -> TraceIds:
        return cls(_IDS.generate_trace_id(), _IDS.generate_span_id())

    @property
    def traceparent(self) -> str:
        """W3C Trace Context's header naming the worker span as the parent (sampled)."""
        return f"00-{self.trace_id:032x}-{self.worker_span_id:016x}-01"


def traced(telemetries: Mapping[str, str] | None) -> bool:
    """Whether a version's telemetries (None: it names none) name one receiving its traces."""
    return any(FIELDS.get(name) is Kind.TRACES and v for name, v in (telemetries or {}).items())


@dataclass(frozen=True)
class Invocation:
    """An answered invocation of a version naming telemetries (`telemetries` as stored)."""

    account: str
    function_id: str
    version_id: str
    telemetries: Mapping[str, str]
    fulfilled: bool
    start_ns: int
    end_ns: int
    #: why the platform refused it before a worker answered (`rate_limited`, `queue_full`)
    refusal: str | None = None
    #: when admission ended (it waited for an instance from then), when an instance took it
    #: (None: none did), and the ids its worker was told
    queued_ns: int | None = None
    dispatched_ns: int | None = None
    trace: TraceIds | None = None


@dataclass(frozen=True)
class Tokens:
    """The tokens an LLM worker reported for one invocation of a version naming telemetries."""

    account: str
    function_id: str
    version_id: str
    telemetries: Mapping[str, str]
    model: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Logged:
    """Lines an instance of a version naming a LOGS telemetry printed (masked, cut)."""

    account: str
    function_id: str
    version_id: str
    telemetries: Mapping[str, str]
    lines: tuple[logs.Line, ...]


class Load(typing.Protocol):
    """A version's load on this replica (invocation/load.py's VersionLoad), read as it is."""

    in_flight: int
    waiting: int


@dataclass(frozen=True)
class Watched:
    """A version naming telemetries, and its load record."""

    account: str
    function_id: str
    version_id: str
    telemetries: Mapping[str, str]
    load: Load

    def attributes(self) -> dict[str, str]:
        return {
            "nvcf.account": self.account,
            "nvcf.function.id": self.function_id,
            "nvcf.function.version.id": self.version_id,
        }

    def names(self, telemetry_id: uuid.UUID, kind: Kind) -> bool:
        field = next(f for f, k in FIELDS.items() if k is kind)
        return str(self.telemetries.get(field, "")).lower() == str(telemetry_id)


@dataclass(frozen=True)
class Phased:
    """A version naming a metrics telemetry, and how many of its wanted instances are in each
    phase (every phase named, 0 included)."""

    account: str
    function_id: str
    version_id: str
    telemetries: Mapping[str, str]
    counts: Mapping[str, int]


#: the versions naming telemetries whose loads a pipeline's gauges read (snapshots)
LoadSource = Callable[[], Sequence[Watched]]
#: the versions naming a metrics telemetry and their instances by phase (the last snapshot)
PhaseSource = Callable[[], Sequence[Phased]]


@dataclass(frozen=True)
class TaskSeen:
    """A task naming telemetries, as the task exports' last pass read it (the METRICS
    telemetry's gauges read the last snapshot)."""

    account: str
    task_id: str
    name: str
    telemetries: Mapping[str, str]
    status: str
    percent: int | None
    gpus: int

    def attributes(self) -> dict[str, str]:
        return {
            "nvcf.account": self.account,
            "nvcf.task.id": self.task_id,
            "nvcf.task.name": self.name,
        }


@dataclass(frozen=True)
class TaskLogged:
    """Lines a task naming a LOGS telemetry printed (masked, cut), labelled as the task's."""

    account: str
    task_id: str
    telemetries: Mapping[str, str]
    lines: tuple[logs.Line, ...]


@dataclass(frozen=True)
class TaskEnded:
    """A task naming a TRACES telemetry that ended: its lifetime's phases, in nanoseconds
    since the epoch (None: the task never reached that phase)."""

    task: TaskSeen
    created_ns: int
    launched_ns: int | None
    running_ns: int | None
    finished_ns: int

    @property
    def account(self) -> str:
        return self.task.account

    @property
    def telemetries(self) -> Mapping[str, str]:
        return self.task.telemetries


#: the tasks naming a METRICS telemetry (the last snapshot)
TaskSource = Callable[[], Sequence[TaskSeen]]


#: what the export queue carries
Event = Invocation | Tokens | Logged | TaskLogged | TaskEnded
