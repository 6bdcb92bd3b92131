"""The text log format: its date and time, worked out once a second, read exactly as the
logging module's own formatter writes them."""

from __future__ import annotations

import logging

from service.core.logs import TEXT_FORMAT, _TextLine


def test_text_lines_are_the_logging_modules_own() -> None:
    ours, reference = _TextLine(), logging.Formatter(TEXT_FORMAT)
    # within one second, across a second, a minute and a day, and back in time
    for created in (1796164455.001, 1796164455.874, 1796164456.9999, 1796169599.5, 1.5, 0.25):
        record = logging.LogRecord("nvcf.access", logging.INFO, "p", 1, "GET %s", ("/x",), None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert ours.format(record) == reference.format(record)
