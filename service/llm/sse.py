"""Server-sent events from a worker: relayed as they arrive, byte for byte, and watched on
the side for what the gateway needs — the first token (time to first token), the `usage`
the worker reports (token accounting), and for `/v1/responses` the terminal Responses object
(a caller that did not ask to stream gets that object, as NVCF does).

The decoder follows the WHATWG event-stream rules (lines end with CRLF, LF or CR; `data:`
lines join with a newline; a blank line dispatches; a leading space after the colon is
dropped). Watching never holds the relay back and never buffers more than MAX_EVENT bytes:
a larger event is skipped (the relay still carries it), so usage may then stay unknown and
the estimate stands.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from service.core.http import NotJson, RefusedJson, load_json
from service.functions.llm_config import RESPONSES

#: the largest event the watcher decodes (a Responses terminal object holds the whole answer)
MAX_EVENT = 4 * 1024 * 1024
DONE = "[DONE]"
#: the Responses events that end a response and carry it whole
TERMINAL_EVENTS = ("response.completed", "response.failed", "response.incomplete")


@dataclass(frozen=True, slots=True)
class Event:
    event: str
    data: str


_LINE_END = re.compile(rb"\r\n|\r|\n")


class SseDecoder:
    """Bytes in, whole events out, incrementally."""

    def __init__(self, max_event: int = MAX_EVENT) -> None:
        self._max = max_event
        self._pending = b""
        #: the last chunk ended with CR: a LF starting the next one ends no other line
        self._cr = False
        self._event = ""
        self._data: list[str] = []
        self._size = 0
        self._skipping = False

    def feed(self, chunk: bytes) -> list[Event]:
        out: list[Event] = []
        if self._cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._cr = chunk.endswith(b"\r")
        data = self._pending + chunk if self._pending else chunk
        lines = _LINE_END.split(data)
        rest = lines.pop()
        for line in lines:
            self._line(line, out)
        if len(rest) + self._size > self._max:
            self._skipping = True
            self._data, self._size = [], 0
            rest = b""
        self._pending = rest
        return out

    def _line(self, raw: bytes, out: list[Event]) -> None:
        if not raw:
            if self._data and not self._skipping:
                out.append(Event(self._event or "message", "\n".join(self._data)))
            self._event, self._data, self._size, self._skipping = "", [], 0, False
            return
        if self._skipping:
            return
        self._size += len(raw)
        if self._size > self._max:
            self._skipping = True
            self._data = []
            return
        line = raw.decode("utf-8", "replace")
        name, colon, value = line.partition(":")
        if not colon:
            name, value = line, ""
        elif value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a worker reports: chat completions and embeddings say prompt/completion,
    responses say input/output."""

    input_tokens: int
    output_tokens: int

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


#: the most tokens one figure of a worker's `usage` counts for: every counter fed from it
#: (models' and accounts' token limits, metering, metrics) stays in a 64-bit integer (Redis's)
MAX_USAGE_TOKENS = 2**31


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return min(value, MAX_USAGE_TOKENS)
    return None


def usage_of(answer: Any) -> Usage | None:
    """The `usage` of an OpenAI object (a completion, a chunk, a Responses object, an
    embeddings list), or None."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return None
    given = _count(usage.get("input_tokens"))
    if given is None:
        given = _count(usage.get("prompt_tokens"))
    produced = _count(usage.get("output_tokens"))
    if produced is None:
        produced = _count(usage.get("completion_tokens"))
    if given is None and produced is None:
        total = _count(usage.get("total_tokens"))
        return None if total is None else Usage(total, 0)
    return Usage(given or 0, produced or 0)


def _has_token(payload: Any, event: str) -> bool:
    if event.endswith(".delta"):
        return True
    if not isinstance(payload, dict):
        return False
    for choice in payload.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls")):
            return True
        if choice.get("text"):
            return True
    return False


@dataclass
class StreamWatch:
    """What a streamed answer showed: fed every chunk the relay passes on."""

    path: str
    started: float = field(default_factory=time.monotonic)
    clock: Callable[[], float] = time.monotonic
    first_token: float | None = None
    usage: Usage | None = None
    #: the terminal Responses object (`/v1/responses`)
    terminal: dict[str, Any] | None = None
    done: bool = False
    _decoder: SseDecoder = field(default_factory=SseDecoder)

    def feed(self, chunk: bytes) -> None:
        for event in self._decoder.feed(chunk):
            self._see(event)

    def _see(self, event: Event) -> None:
        if event.data == DONE:
            self.done = True
            return
        if not self._worth_parsing(event):
            return
        try:
            payload = load_json(event.data)
        except (NotJson, RefusedJson):
            return  # not counted: the estimate stands; the relay carries the event on
        kind = event.event
        if isinstance(payload, dict) and isinstance(payload.get("type"), str):
            kind = payload["type"]  # Responses events name themselves in the data too
        if self.first_token is None and _has_token(payload, kind):
            self.first_token = self.clock()
        if self.path == RESPONSES and kind in TERMINAL_EVENTS and isinstance(payload, dict):
            response = payload.get("response")
            if isinstance(response, dict):
                self.terminal = response
                self.usage = usage_of(response) or self.usage
                return
        found = usage_of(payload)
        if found is not None:
            self.usage = found

    def _worth_parsing(self, event: Event) -> bool:
        """Whether the event may say something not known yet (most chunks of a long answer
        do not: the first token is known and they carry no usage)."""
        if self.first_token is None or "usage" in event.data:
            return True
        return self.path == RESPONSES and (
            event.event in TERMINAL_EVENTS or any(t in event.data for t in TERMINAL_EVENTS)
        )

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started


async def relay(chunks: AsyncIterator[bytes], watch: StreamWatch) -> AsyncIterator[bytes]:
    """The worker's chunks, each passed on as soon as it arrives, watched on the way."""
    async for chunk in chunks:
        watch.feed(chunk)
        yield chunk


async def collect_terminal(
    chunks: AsyncIterator[bytes], watch: StreamWatch, limit: int
) -> dict[str, Any] | None:
    """Read a Responses stream to its end (at most `limit` bytes) for its terminal object;
    None when the stream ended without one."""
    seen = 0
    async for chunk in chunks:
        seen += len(chunk)
        if seen > limit:
            break
        watch.feed(chunk)
        if watch.terminal is not None:
            break
    return watch.terminal
