"""The progress file's rules as a container author reads them (docs/tasks.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from service.tasks.clocks import Progress, parse_progress

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def raw(**fields: object) -> bytes:
    return json.dumps({"lastUpdatedAt": "2026-01-01T00:00:00.123456789Z", **fields}).encode()


def test_a_progress_file_as_nvct_documents_it() -> None:
    got = parse_progress(raw(percentComplete=42, name="ckpt-1", metadata={"step": 1}), "t")
    assert isinstance(got, Progress)
    assert (got.percent, got.name, got.metadata) == (42, "ckpt-1", {"step": 1})


def test_each_broken_rule_is_named() -> None:
    why = parse_progress(raw(percentComplete=0, name="../x", metadata=[], taskId="other"), "t")
    assert isinstance(why, str)
    for part in ("percentComplete", "name", "metadata", "taskId"):
        assert part in why
    assert "lastUpdatedAt" in str(parse_progress(b'{"percentComplete": 5}', "t"))
    assert parse_progress(b"[1]", "t") == "the progress file must hold a JSON object"
    assert parse_progress(b"\xff", "t") == "the progress file is not JSON"
