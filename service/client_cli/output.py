"""What `nvcf` prints: tables (rich) for people, the API's JSON for scripts (`-o json`: one
JSON document on stdout and nothing else), messages and errors on stderr, plain text when
`NO_COLOR` is set."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from service.client_cli.api import ApiError

#: width of tables written to a pipe or a file (a terminal's own width otherwise)
PIPE_WIDTH = 200


class Code(IntEnum):
    """Exit codes, the same for every command."""

    OK = 0
    API_ERROR = 1
    USAGE = 2
    FAILED = 3
    TIMEOUT = 4


EXIT_CODES = (
    "Exit codes: 0 ok; 1 API or connection error; 2 usage (bad option, not logged in); "
    "3 deployment failed (ERROR), task ended other than COMPLETED, or chart not valid; "
    "4 timed out."
)


class Output(StrEnum):
    table = "table"
    json = "json"


def _console(*, stderr: bool) -> Console:
    plain = os.environ.get("NO_COLOR", "") != ""
    console = Console(
        stderr=stderr,
        color_system=None if plain else "auto",
        no_color=plain,
        highlight=False,
        emoji=False,
    )
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


class Ui:
    """The consoles of one command run."""

    def __init__(self, output: Output = Output.table) -> None:
        self.json = output is Output.json
        self.out = _console(stderr=False)
        self.err = _console(stderr=True)

    def emit(self, data: Any, *, lines: bool = False) -> None:
        """`data` as JSON on stdout (one line with `lines`, for streams of documents)."""
        text = json.dumps(data) if lines else json.dumps(data, indent=2)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def show(self, renderable: RenderableType) -> None:
        """A table or text on stdout, for people (nothing in JSON mode)."""
        if not self.json:
            self.out.print(renderable)

    def note(self, message: str) -> None:
        """A message on stderr (never on stdout, so JSON mode stays machine-readable)."""
        self.err.print(Text(message))

    def error(self, message: str) -> None:
        self.err.print(Text.assemble(("error: ", "bold red"), message))

    def problem(self, exc: ApiError) -> None:
        """An API error with every violation it lists and its request id."""
        if exc.errors:
            count = len(exc.errors) + exc.errors_omitted
            plural = "s" if count != 1 else ""
            self.error(f"{exc.status} {exc.title} ({count} violation{plural})")
        else:
            self.error(str(exc))
        for field_name, message in exc.errors:
            self.err.print(Text.assemble("  - ", (field_name or "(body)", "bold"), f": {message}"))
        if exc.errors_omitted:
            self.err.print(Text(f"  … and {exc.errors_omitted} more"))
        if exc.request_id:
            self.err.print(Text(f"  request id: {exc.request_id}", style="dim"))


def table(*columns: str, title: str | None = None) -> Table:
    out = Table(title=title, title_justify="left", header_style="bold", expand=False)
    for column in columns:
        out.add_column(column, overflow="fold")
    return out


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


STATUS_STYLES = {
    "ACTIVE": "green",
    "Running": "green",
    "DEPLOYING": "yellow",
    "ERROR": "red",
    "Failed": "red",
    "INACTIVE": "dim",
}


def status_text(status: str | None) -> Text:
    return Text(status or "", style=STATUS_STYLES.get(status or "", ""))


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def elapsed(since: str | None, now: datetime | None = None) -> str:
    """`1h02m`, `3m04s` or `12s` from `since` (an API timestamp) to now."""
    start = parse_time(since)
    if start is None:
        return ""
    seconds = max(0, int(((now or datetime.now(UTC)) - start).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
