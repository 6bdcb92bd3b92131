"""Process logging: every record carries the request id of the request it was logged in, and
with `NVCF_LOG_FORMAT=json` every line is one JSON object (python-json-logger).

The request id is a context variable set by `RequestContextMiddleware` for the whole request
(routes, dependencies, domain code, threads started with `asyncio.to_thread`, which copy the
context); records logged outside a request (the reconciler, start-up) carry `null`.

A JSON line has `timestamp` (ISO 8601, UTC), `level`, `logger`, `message` and `requestId`,
plus any `extra` fields of the call (the access line's method, path, status, durationMs,
account) and `exc_info` (the traceback as one string) for exceptions. Nothing here redacts:
callers never log keys, passwords or request bodies (see docs/telemetry.md).

Every line is written at once by the logging module's own `StreamHandler`: writing the lines of
one event-loop iteration together saved under 1% of a request's CPU (`bench/access_log.py`,
docs/architecture.md), so it is not done.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from pythonjsonlogger.json import JsonFormatter

#: the id of the request being served (None outside a request)
request_id_var: ContextVar[str | None] = ContextVar("nvcf_request_id", default=None)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
#: the fields of every JSON line, by their LogRecord attribute, and their names in the line
JSON_FIELDS = {"levelname": "level", "name": "logger", "message": "message"}
#: loggers of the HTTP server, which configures its own handlers unless told not to
_SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class RequestIdFilter(logging.Filter):
    """Puts the current request id on every record as `requestId` (None outside requests)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.requestId = request_id_var.get()
        return True


def printable(text: str) -> str:
    """`text` with every character Python deems not printable (control characters, line and
    paragraph separators, format characters such as bidi overrides, lone surrogates) and the
    backslash escaped as in a Python literal (`\\n`, `\\x00`, `\\u2028`, `\\\\`): a client's
    text (a decoded path) can neither end a text log line and forge the next nor pass for an
    escape. Printable text comes back as it is."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else repr(c)[1:-1] for c in text)


class _TextLine(logging.Formatter):
    """`TEXT_FORMAT`, its date and time worked out once a second (every request writes an
    access line): the same text as `logging.Formatter`'s. The fields of the line are
    `printable`; a traceback below it keeps its line breaks (its other characters are
    escaped)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self.timestamp(record.created, record.msecs)

    def timestamp(self, created: float, msecs: float) -> str:
        second = int(created)
        cached = self._second
        if cached[0] != second:
            cached = (second, time.strftime(self.default_time_format, self.converter(second)))
            self._second = cached  # one assignment: threads see one second's text or another's
        return f"{cached[1]},{int(msecs):03d}"  # logging.Formatter.default_msec_format

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        # The frames' lines (code's own text) keep their breaks; any other part (an
        # exception's message may quote a client's text) is one escaped line.
        parts = []
        for part in traceback.format_exception(*ei):
            if part.startswith("  File "):
                parts.append("\n".join(printable(line) for line in part.split("\n")))
            else:
                text = part.strip("\n")
                start = part.index(text) if text else len(part)
                parts.append(part[:start] + printable(text) + part[start + len(text) :])
        return "".join(parts).removesuffix("\n")

    def formatStack(self, stack_info: str) -> str:
        return "\n".join(printable(line) for line in stack_info.split("\n"))


class _JsonLine(JsonFormatter):
    """python-json-logger's formatter, the timestamp (UTC, ISO 8601) as the first field."""

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["timestamp"] = datetime.fromtimestamp(record.created, tz=UTC).isoformat()
        super().add_fields(log_data, record, message_dict)


def json_formatter() -> logging.Formatter:
    """One JSON object per record: timestamp, level, logger, message, requestId, extras."""
    return _JsonLine(
        [*JSON_FIELDS, "requestId"],
        rename_fields={k: v for k, v in JSON_FIELDS.items() if k != v},
        defaults={"requestId": None},
    )


def configure_logging(
    log_format: Literal["text", "json"],
    *,
    level: int = logging.INFO,
    stream: TextIO | None = None,
) -> None:
    """One handler on the root logger for the whole process, the HTTP server's loggers and
    Python warnings included (they propagate to it), so no line escapes the format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(json_formatter() if log_format == "json" else _TextLine())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Neither format shows where a record was logged from, nor its thread or process: the
    # logging module is told not to look them up for every record (the access line is
    # written for every request). See "Optimization" in the logging HOWTO.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    for name in _SERVER_LOGGERS:
        server_log = logging.getLogger(name)
        server_log.handlers.clear()
        server_log.propagate = True
    logging.getLogger("uvicorn").setLevel(logging.WARNING)
    logging.captureWarnings(True)


__all__ = [
    "RequestIdFilter",
    "configure_logging",
    "json_formatter",
    "printable",
    "request_id_var",
]
