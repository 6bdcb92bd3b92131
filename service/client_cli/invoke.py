"""`nvcf invoke`: call a deployed function through pexec and follow its 202 answers until the
worker's answer arrives (docs/invocation.md)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from service.client_cli import config, grpc_call
from service.client_cli.api import ApiError, raw_request, signed_transfer
from service.client_cli.assets import upload_file
from service.client_cli.common import (
    FunctionId,
    OutputOpt,
    Run,
    connect,
    fail,
    poll_interval,
)
from service.client_cli.output import EXIT_CODES, Code, Output

V = "/v2/nvcf"
MAX_POLL_SECONDS = 3600


def _body(data: str) -> bytes:
    """`--data`: a JSON document, or `@file` for a file's bytes (`@-`: standard input)."""
    if data.startswith("@"):
        name = data[1:]
        return sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    return data.encode()


def invoke(
    function_id: FunctionId,
    version: Annotated[
        str | None,
        typer.Option("--version", "-v", help="The version's id (default: the server picks)."),
    ] = None,
    data: Annotated[
        str, typer.Option("--data", "-d", help="The request body: JSON, or @file (@- stdin).")
    ] = "{}",
    header: Annotated[
        list[str] | None,
        typer.Option("--header", "-H", help="An extra request header, 'Name: value' (repeat)."),
    ] = None,
    poll_seconds: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_POLL_SECONDS,
            help="NVCF-POLL-SECONDS: how long the server holds each call before a 202.",
        ),
    ] = 60,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0.0, help="Seconds to follow 202s at most (then exit 4)."),
    ] = None,
    asset: Annotated[
        list[Path] | None,
        typer.Option(
            "--asset",
            exists=True,
            dir_okay=False,
            readable=True,
            help="A file to upload as an input asset and reference (repeat for several).",
        ),
    ] = None,
    save: Annotated[
        Path | None,
        typer.Option(
            "--output-file",
            "--save",
            help="Save a large result (the 302's zip) here; without it its URL is printed.",
        ),
    ] = None,
    output: OutputOpt = Output.table,
    grpc: Annotated[
        bool,
        typer.Option(
            "--grpc",
            help="A gRPC function: call its health service (or --method) on the gRPC listener.",
        ),
    ] = False,
    grpc_address: Annotated[
        str | None,
        typer.Option(help="--grpc: the listener's HOST:PORT (default: the API's host, 10081)."),
    ] = None,
    method: Annotated[
        str | None,
        typer.Option(
            help="--grpc: a raw method '/package.Service/Method' called with --data as bytes "
            "(default: grpc.health.v1.Health/Check)."
        ),
    ] = None,
) -> None:
    """Invoke a function (pexec) and print the worker's answer, following 202s until done
    (showing the worker's progress).

    With -o json: {"requestId", "status", "body"} (the body parsed when it is JSON); a large
    result: {"requestId", "status": 302, "location", "saved"?}. With --grpc: the gRPC
    function's health status, or the raw method's answer."""
    if grpc:
        _grpc(function_id, version, data, grpc_address, method, timeout, output)
        return
    with connect(output) as run:
        try:
            body = _body(data)
        except OSError as exc:
            raise fail(run.ui, f"--data: {exc}", Code.USAGE) from None
        headers = {"Content-Type": "application/json"}
        for line in header or []:
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                raise fail(run.ui, f"--header {line!r}: use 'Name: value'", Code.USAGE)
            headers[name.strip()] = value.strip()
        headers["NVCF-POLL-SECONDS"] = str(poll_seconds)
        ids = []
        for file in asset or []:
            made = upload_file(run.api, file)
            run.ui.note(f"uploaded {file} as asset {made['assetId']}")
            ids.append(made["assetId"])
        if ids:
            headers["NVCF-INPUT-ASSET-REFERENCES"] = ",".join(ids)
        path = f"{V}/pexec/functions/{function_id}" + (f"/versions/{version}" if version else "")
        deadline = None if timeout is None else time.monotonic() + timeout
        resp = raw_request(run.api, "POST", path, content=body, headers=headers)
        request_id = resp.headers.get("nvcf-reqid")
        while resp.status_code == 202 and request_id:
            percent = resp.headers.get("nvcf-percent-complete")
            state = resp.headers.get("nvcf-status", "pending")
            run.ui.note(f"request {request_id}: {state}" + (f", {percent}%" if percent else ""))
            if deadline is not None and time.monotonic() >= deadline:
                raise fail(
                    run.ui,
                    f"no answer within {timeout:g}s; poll it: GET {V}/pexec/status/{request_id}",
                    Code.TIMEOUT,
                )
            time.sleep(min(poll_interval(), 1.0))
            status_path = f"{V}/pexec/status/{request_id}"
            resp = raw_request(run.api, "GET", status_path, content=b"", headers=headers)
        if resp.headers.get("content-type", "").startswith("application/problem+json"):
            raise ApiError.of(resp)  # the server's refusal (404, 400, 429...), not the worker's
        if resp.status_code == 302 and "location" in resp.headers:
            _large_result(run, request_id, resp.headers["location"], save)
            return
        parsed: Any
        try:
            parsed = resp.json()
        except ValueError:
            parsed = resp.text
        if run.ui.json:
            run.ui.emit({"requestId": request_id, "status": resp.status_code, "body": parsed})
        elif isinstance(parsed, str):
            run.ui.show(parsed)
        else:
            run.ui.show(json.dumps(parsed, indent=2))
        if resp.status_code >= 400:
            raise fail(
                run.ui, f"the function answered {resp.status_code} ({request_id})", Code.FAILED
            )


def _large_result(run: Run, request_id: str | None, location: str, save: Path | None) -> None:
    """A large result: saved with --output-file (a zip: `<requestId>.response` and the
    files the worker wrote), else its URL printed."""
    report: dict[str, Any] = {"requestId": request_id, "status": 302, "location": location}
    if save is not None:
        size = signed_transfer(run.api, "GET", location, save)
        report["saved"] = str(save)
        run.ui.note(f"large result: saved {size} bytes to {save}")
    if run.ui.json:
        run.ui.emit(report)
    elif save is None:
        run.ui.note("large result (save it with --output-file FILE):")
        run.ui.show(location)


def _grpc(
    function_id: str,
    version: str | None,
    data: str,
    address: str | None,
    method: str | None,
    timeout: float | None,
    output: Output,
) -> None:
    with connect(output) as run:
        try:
            body = _body(data) if method is not None else b""
        except OSError as exc:
            raise fail(run.ui, f"--data: {exc}", Code.USAGE) from None
        grpc_call.call(
            run.ui,
            config.resolve(),
            function_id=str(function_id),
            version=version,
            address=address,
            method=method,
            body=body,
            timeout=timeout,
        )


def register(app: typer.Typer) -> None:
    app.command(epilog=EXIT_CODES)(invoke)
