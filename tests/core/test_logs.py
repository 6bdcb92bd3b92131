"""The text log format: its date and time, worked out once a second, read exactly as the
logging module's own formatter writes them; the access line; escaping what a client sends."""

from __future__ import annotations

import io
import logging
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from service.core.logs import (
    TEXT_FORMAT,
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


def test_the_access_line_in_the_text_format(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
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
    finally:
        root.setLevel(previous)
    assert stream.getvalue().splitlines() == [
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1796164455))
        + ",041 INFO nvcf.access POST /v2/nvcf/pexec/functions/f 200 1.23ms"
        " account=None requestId=rid"
    ]


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
            "nvcf.errors", logging.ERROR, "p", 1, "failed on %s", ("/x\r\nFORGED",), sys.exc_info()
        )
    lines = _TextLine().format(record).splitlines()
    assert lines[0].endswith("ERROR nvcf.errors failed on /x\\r\\nFORGED")
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: bad id '\\nFORGED line'"
    assert not [line for line in lines if line.startswith("FORGED")]
