"""`--wait`: poll a deployment until it is ACTIVE (or gone, for undeploy) with a live view of
every instance; on ERROR the reason, the event timeline and exit code 3; past `--timeout`,
exit code 4."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import typer
from rich.live import Live

from service.client_cli.api import ApiError, V
from service.client_cli.common import Run, poll_interval
from service.client_cli.output import Code
from service.client_cli.views import LiveDeployment, events_table, last_lines

#: the shell's code for a command ended by Ctrl-C (128 + SIGINT)
INTERRUPTED = 130


def _live(run: Run, view: LiveDeployment, *, transient: bool) -> AbstractContextManager[Any]:
    """A live view on a terminal (refreshed four times a second); nothing elsewhere."""
    if run.ui.json or not run.ui.out.is_terminal:
        return nullcontext()
    return Live(view, console=run.ui.out, refresh_per_second=4, transient=transient)


def deployment_path(function_id: str, version_id: str) -> str:
    return f"{V}/deployments/functions/{function_id}/versions/{version_id}"


def events_of(run: Run, deployment_id: str) -> list[dict[str, Any]]:
    body = run.api.call("GET", f"{V}/deployments/{deployment_id}/events")
    return list(body.get("events") or [])


def failure_reasons(dep: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """Why the deployment is in ERROR, most specific first: the health errors of its failed
    instances, else the reasons of its instances, else the last status event."""
    reasons = [str(h["error"]) for h in dep.get("healthInfo") or [] if h.get("error")]
    if not reasons:
        reasons = [
            f"{i['reason']}: {i.get('message') or ''}".rstrip(": ")
            for i in dep.get("instances") or []
            if i.get("reason")
        ]
    if not reasons:
        reasons = [str(e.get("message")) for e in events if e.get("kind") == "status"][-1:]
    return list(dict.fromkeys(reasons)) or ["the function version is in ERROR"]


def settled_active(dep: dict[str, Any]) -> bool:
    """ACTIVE, every instance Running and at least minInstances of them (a scale's end)."""
    instances = dep.get("instances") or []
    wanted = sum(int(s.get("minInstances") or 0) for s in dep.get("deploymentSpecifications") or [])
    return (
        dep.get("functionStatus") == "ACTIVE"
        and all(i.get("phase") == "Running" for i in instances)
        and len(instances) >= wanted
    )


def is_active(dep: dict[str, Any]) -> bool:
    return dep.get("functionStatus") == "ACTIVE"


def wait_active(
    run: Run,
    function_id: str,
    version_id: str,
    timeout: float,
    *,
    done: Callable[[dict[str, Any]], bool] = is_active,
) -> dict[str, Any]:
    """The deployment once `done`; on ERROR or timeout, prints why and exits (3 or 4)."""
    path = deployment_path(function_id, version_id)
    view = LiveDeployment("ACTIVE")
    deadline = time.monotonic() + timeout
    with _live(run, view, transient=False):
        try:
            while True:
                dep: dict[str, Any] = run.api.call("GET", path)["deployment"]
                view.dep = dep
                if done(dep) or dep.get("functionStatus") == "ERROR":
                    break
                if time.monotonic() >= deadline:
                    break
                time.sleep(min(poll_interval(), max(deadline - time.monotonic(), 0.0)))
        except KeyboardInterrupt:
            run.ui.note("stopped waiting; the deployment goes on")
            raise typer.Exit(INTERRUPTED) from None
        status = dep.get("functionStatus")
        view.finish(str(status) if done(dep) or status == "ERROR" else f"still {status}")
    if not run.ui.out.is_terminal:
        run.ui.show(view)  # a pipe or a file gets the last frame only
    if done(dep):
        if run.ui.json:
            run.ui.emit({"deployment": dep})
        else:
            run.ui.note(f"function version {version_id} is {status}")
        return dep
    if status == "ERROR":
        events = events_of(run, str(dep["deploymentId"]))
        reasons = failure_reasons(dep, events)
        run.ui.error(f"deployment failed: {'; '.join(reasons)}")
        if run.ui.json:
            run.ui.emit({"deployment": dep, "events": events, "reasons": reasons})
        else:
            run.ui.show(events_table(events))
            for line in last_lines(dep):
                run.ui.show(line)
        raise typer.Exit(int(Code.FAILED))
    run.ui.error(f"timed out after {timeout:g}s waiting for ACTIVE (status {status})")
    if run.ui.json:
        run.ui.emit({"deployment": dep})
    raise typer.Exit(int(Code.TIMEOUT))


def wait_removed(run: Run, function_id: str, version_id: str, timeout: float) -> None:
    """Until the deployment is torn down and gone (404); exits 4 past the timeout."""
    path = deployment_path(function_id, version_id)
    view = LiveDeployment("the instances to be torn down")
    deadline = time.monotonic() + timeout
    with _live(run, view, transient=True):
        while True:
            try:
                view.dep = run.api.call("GET", path)["deployment"]
            except ApiError as exc:
                if exc.status == 404:
                    return
                raise
            if time.monotonic() >= deadline:
                break
            time.sleep(min(poll_interval(), max(deadline - time.monotonic(), 0.0)))
    run.ui.error(f"timed out after {timeout:g}s waiting for the deployment to be removed")
    raise typer.Exit(int(Code.TIMEOUT))
