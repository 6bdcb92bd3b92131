"""What every command shares: its options, and `connect`, which resolves the profile, opens
the client and turns API and connection errors into their exit codes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from service.client_cli import config
from service.client_cli.api import Api, ApiError, Unreachable
from service.client_cli.output import Code, Output, Ui

OutputOpt = Annotated[
    Output,
    typer.Option(
        "--output",
        "-o",
        help="table (for people) or json (the API's response body alone on stdout, for scripts)",
        case_sensitive=False,
    ),
]
FunctionId = Annotated[str, typer.Argument(help="The function's id.", show_default=False)]
VersionId = Annotated[str, typer.Argument(help="The function version's id.", show_default=False)]
TimeoutOpt = Annotated[
    float,
    typer.Option("--timeout", min=0.0, help="Seconds to wait at most (then exit code 4)."),
]

#: seconds between two polls of `--wait` and `events --follow` (NVCF_POLL_INTERVAL overrides)
DEFAULT_POLL_INTERVAL = 1.0


def poll_interval() -> float:
    try:
        value = float(os.environ.get("NVCF_POLL_INTERVAL", DEFAULT_POLL_INTERVAL))
    except ValueError:
        return DEFAULT_POLL_INTERVAL
    return min(max(value, 0.05), 60.0)


@dataclass
class Run:
    """One command's client and consoles."""

    api: Api
    ui: Ui


def fail(ui: Ui, message: str, code: Code) -> typer.Exit:
    """Print `message` as an error; the caller raises the returned exit."""
    ui.error(message)
    return typer.Exit(int(code))


@contextmanager
def connect(output: Output, profile: config.Profile | None = None) -> Iterator[Run]:
    ui = Ui(output)
    try:
        resolved = profile or config.resolve()
    except config.NotConfigured as exc:
        raise fail(ui, str(exc), Code.USAGE) from None
    try:
        with Api(resolved) as api:
            yield Run(api, ui)
    except ApiError as exc:
        ui.problem(exc)
        raise typer.Exit(int(Code.API_ERROR)) from None
    except Unreachable as exc:
        raise fail(ui, str(exc), Code.API_ERROR) from None


def read_values(ui: Ui, path: Path | None) -> dict[str, Any] | None:
    """A Helm values file (YAML, JSON being YAML): a mapping, or a usage error."""
    if path is None:
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise fail(ui, f"cannot read values file {path}: {exc}", Code.USAGE) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise fail(ui, f"values file {path} is not a mapping of values", Code.USAGE)
    return data
