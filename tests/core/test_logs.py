"""The text log format: its date and time, worked out once a second, read exactly as the
logging module's own formatter writes them; and the handler that writes the lines of one
event-loop iteration in one write."""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from service.core.logs import (
    TEXT_FORMAT,
    LoopBatchedHandler,
    RequestIdFilter,
    _TextLine,
    printable,
)
from service.core.middleware import access_line
from tests.support.wire import get, raw_exchange, running_server


def test_text_lines_are_the_logging_modules_own() -> None:
    ours, reference = _TextLine(), logging.Formatter(TEXT_FORMAT)
    # within one second, across a second, a minute and a day, and back in time
    for created in (1796164455.001, 1796164455.874, 1796164456.9999, 1796169599.5, 1.5, 0.25):
        record = logging.LogRecord("nvcf.access", logging.INFO, "p", 1, "GET %s", ("/x",), None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert ours.format(record) == reference.format(record)


class _Writes(io.StringIO):
    """A stream that remembers each write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def _handler(stream: _Writes) -> tuple[logging.Logger, LoopBatchedHandler]:
    handler = LoopBatchedHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("nvcf.test-batched")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, handler


async def test_lines_of_one_loop_iteration_are_written_in_one_write_at_its_end() -> None:
    stream = _Writes()
    logger, handler = _handler(stream)
    for n in range(3):
        logger.info("line %d", n)
    assert stream.writes == []  # not yet: the iteration is not over
    await asyncio.sleep(0)
    assert stream.writes == ["line 0\nline 1\nline 2\n"]
    logger.info("line 3")
    await asyncio.sleep(0)
    assert stream.writes[1:] == ["line 3\n"]
    # a thread with no running loop writes at once
    await asyncio.to_thread(logger.info, "from a thread")
    assert stream.writes[2:] == ["from a thread\n"]
    # lines still waiting when the handler is closed are written then
    logger.info("last")
    handler.close()
    assert stream.getvalue().endswith("last\n")


def test_without_a_running_loop_every_line_is_written_at_once() -> None:
    stream = _Writes()
    logger, _ = _handler(stream)
    logger.info("a")
    logger.info("b")
    assert stream.writes == ["a\n", "b\n"]


async def test_the_access_line_in_the_text_format(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _Writes()
    handler = LoopBatchedHandler(stream)
    handler.setFormatter(_TextLine())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(time, "time", lambda: 1796164455.0419)
    previous = root.level
    root.setLevel(logging.INFO)
    try:
        access_line(
            "POST", "/v2/nvcf/pexec/functions/f", 200, 0.0012345, "rid", None, json_logs=False
        )
        await asyncio.sleep(0)
    finally:
        root.setLevel(previous)
    assert stream.getvalue().splitlines() == [
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1796164455))
        + ",041 INFO nvcf.access POST /v2/nvcf/pexec/functions/f 200 1.23ms"
        " account=None requestId=rid"
    ]


def test_lines_a_stopped_loop_left_are_written_before_later_ones() -> None:
    stream = _Writes()
    logger, _ = _handler(stream)

    loop = asyncio.new_event_loop()

    def log_and_stop() -> None:
        logger.info("in the loop")
        loop.stop()  # before the iteration that would write the line

    try:
        loop.call_soon(log_and_stop)
        loop.run_forever()
    finally:
        loop.close()
    logger.info("after it")
    assert stream.getvalue() == "in the loop\nafter it\n"


#: a path whose decoded form would end the access line and write one of the attacker's
FORGED = "%0aFORGED%20INFO%20nvcf.access%20GET%20/v2/nvcf/functions%20200%201.00ms%20account=victim"


@pytest.mark.parametrize(
    "separator", ["%0a", "%0d", "%0d%0a", "%00", "%1b", "%c2%85", "%e2%80%a8", "%e2%80%ae"]
)
def test_printable_escapes_what_could_end_or_disguise_a_line(separator: str) -> None:
    decoded = unquote("/v2/nvcf/x" + FORGED.replace("%0a", separator, 1))
    escaped = printable(decoded)
    assert escaped.isprintable()
    assert len(escaped.splitlines()) == 1
    assert escaped.startswith("/v2/nvcf/x\\") and "FORGED INFO nvcf.access" in escaped
    assert printable("/plain/é/日本 text") == "/plain/é/日本 text"  # printable: as it is
    # a backslash is escaped too: a client cannot write what looks like an escape
    assert printable("/a\\nb") == "/a\\\\nb"


def test_the_server_log_escapes_control_characters_in_paths(tmp_path: Path) -> None:
    """Unauthenticated, on the wire, every kind of route: the API (404), a status poll (400),
    a pexec POST (the invocation front door's access line) and the docs."""
    paths = [
        f"/v2/nvcf/nothing/x{FORGED}",
        f"/v2/nvcf/pexec/status/x{FORGED}",
        f"/v2/orgs/acme/nvcf/functions/x{FORGED}",
        f"/docs/x{FORGED}",
    ]
    pexec = (
        f"POST /v2/nvcf/pexec/functions/x{FORGED} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Length: 2\r\n\r\n{}"
    ).encode()
    with running_server(tmp_path) as port:
        answers = raw_exchange(port, *(get(p) for p in paths), pexec)
        assert all(400 <= status < 500 for status, _, _ in answers), answers
    lines = (tmp_path / "server.log").read_text().splitlines()
    assert not [line for line in lines if line.startswith("FORGED")]
    access = [line for line in lines if " nvcf.access " in line and "FORGED" in line]
    assert len(access) == len(paths) + 1, access
    # escaped; an org alias's path is logged as the client encoded it
    escaped = [line for line in access if "/x\\nFORGED INFO nvcf.access GET" in line]
    assert len(escaped) == 4, access  # three GETs and the POST
    assert "/x%0aFORGED%20INFO" in access[2]


def test_a_traceback_keeps_its_lines_and_escapes_the_rest() -> None:
    try:
        raise ValueError("bad id '\nFORGED line'")
    except ValueError:
        record = logging.LogRecord(
            "nvcf.errors", logging.ERROR, "p", 1, "failed on %s", ("/x\r\nFORGED",), True
        )
        record.exc_info = sys.exc_info()
    lines = _TextLine().format(record).splitlines()
    assert lines[0].endswith("ERROR nvcf.errors failed on /x\\r\\nFORGED")
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: bad id '\\nFORGED line'"
    assert not [line for line in lines if line.startswith("FORGED")]
