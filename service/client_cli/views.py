"""Tables of the API's objects: functions, deployments and their instances, events, chart
findings. Each takes the JSON the API returned and nothing else."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from service.client_cli.output import cell, elapsed, parse_time, status_text, table


def short(value: Any) -> str:
    """The first block of a UUID (enough to tell a deployment's instances apart)."""
    return str(value or "").split("-", 1)[0]


def functions_table(functions: list[dict[str, Any]]) -> Table:
    out = table("function id", "version id", "name", "status", "image / chart", "created")
    for fn in functions:
        out.add_row(
            cell(fn.get("id")),
            cell(fn.get("versionId")),
            cell(fn.get("name")),
            status_text(fn.get("status")),
            cell(fn.get("containerImage") or fn.get("helmChart")),
            cell(fn.get("createdAt")),
        )
    return out


FUNCTION_FIELDS = (
    ("id", "function id"),
    ("versionId", "version id"),
    ("name", "name"),
    ("status", "status"),
    ("ncaId", "account"),
    ("functionType", "type"),
    ("inferenceUrl", "inference URL"),
    ("inferencePort", "inference port"),
    ("healthUri", "health URI"),
    ("containerImage", "container image"),
    ("containerArgs", "container args"),
    ("helmChart", "helm chart"),
    ("helmChartServiceName", "helm chart service"),
    ("helmChartDigest", "helm chart digest"),
    ("description", "description"),
    ("tags", "tags"),
    ("createdAt", "created"),
)


def function_detail(fn: dict[str, Any]) -> RenderableType:
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column(overflow="fold")
    for key, label in FUNCTION_FIELDS:
        value = fn.get(key)
        if value in (None, "", []):
            continue
        fields.add_row(label, status_text(value) if key == "status" else Text(cell(value)))
    parts: list[RenderableType] = [fields]
    models = [m for m in fn.get("models") or [] if isinstance(m, dict)]
    if models:
        parts.append(models_table(fn, models))
    findings = fn.get("findings") or []
    if findings:
        parts.append(findings_table(findings, title="chart findings"))
    return parts[0] if len(parts) == 1 else Group(*parts)


def models_table(fn: dict[str, Any], models: list[dict[str, Any]]) -> Table:
    """A function's models; an LLM function's with the `model` its callers give."""
    if fn.get("functionType") != "LLM":
        out = table("model", "version", "uri")
        for m in models:
            out.add_row(cell(m.get("name")), cell(m.get("version")), cell(m.get("uri")))
        return out
    out = table("model (OpenAI `model`)", "paths", "routing", "token limit")
    for m in models:
        raw = m.get("llmConfig")
        config: dict[str, Any] = raw if isinstance(raw, dict) else {}
        out.add_row(
            f"{cell(fn.get('id'))}/{cell(m.get('name'))}",
            cell(config.get("uris")),
            cell(config.get("routingMethod")),
            cell(config.get("tokenRateLimit")),
        )
    return out


def specs_table(dep: dict[str, Any]) -> Table:
    out = table("spec id", "gpu", "instance type", "backend", "min", "max", "clusters")
    for spec in dep.get("deploymentSpecifications") or []:
        out.add_row(
            cell(spec.get("gpuSpecificationId")),
            cell(spec.get("gpu")),
            cell(spec.get("instanceType")),
            cell(spec.get("backend")),
            cell(spec.get("minInstances")),
            cell(spec.get("maxInstances")),
            cell(spec.get("clusters")),
        )
    return out


def instances_table(dep: dict[str, Any], now: datetime | None = None) -> Table:
    now = now or datetime.now(UTC)
    out = table("instance", "phase", "reason", "elapsed", "cluster", "message")
    for inst in dep.get("instances") or []:
        out.add_row(
            short(inst.get("instanceId")),
            status_text(inst.get("phase")),
            cell(inst.get("reason")),
            elapsed(inst.get("since"), now),
            cell(inst.get("cluster")),
            cell(inst.get("message")),
        )
    return out


def deployment_header(dep: dict[str, Any]) -> Text:
    return Text.assemble(
        (cell(dep.get("functionName")), "bold"),
        f" {cell(dep.get('functionId'))}/{cell(dep.get('functionVersionId'))}: ",
        status_text(dep.get("functionStatus")),
        f"   deployment {cell(dep.get('deploymentId'))}",
    )


def health_lines(dep: dict[str, Any]) -> list[str]:
    return [
        f"{h.get('gpu')} {h.get('instanceType')} ({h.get('backend')}): {h.get('error')}"
        for h in dep.get("healthInfo") or []
    ]


def deployment_detail(dep: dict[str, Any]) -> RenderableType:
    parts: list[RenderableType] = [deployment_header(dep), specs_table(dep)]
    if dep.get("instances"):
        parts.append(instances_table(dep))
    else:
        parts.append(Text("no instances", style="dim"))
    parts += [Text(f"health: {line}", style="red") for line in health_lines(dep)]
    parts += last_lines(dep)
    return Group(*parts)


def last_lines(dep: dict[str, Any]) -> list[RenderableType]:
    """The last lines each failed instance's containers printed (kept at its failure), and
    those of each instance's containers before their latest restart."""
    out: list[RenderableType] = []
    for inst in dep.get("instances") or []:
        kept = inst.get("lastLogs") or []
        if kept:
            title = f"last lines before a restart (instance {inst.get('instanceId')}):"
            out.append(Text(title, style="bold"))
            out += [Text(f"  {line}") for line in kept]
    for h in dep.get("healthInfo") or []:
        kept = h.get("lastLogs") or []
        if kept:
            out.append(Text(f"last lines of the failed instance ({h.get('gpu')}):", style="bold"))
            out += [Text(f"  {line}") for line in kept]
    return out


class LiveDeployment:
    """What `--wait` shows: the deployment's status and every instance, the elapsed times
    computed at each refresh (so they tick between two polls)."""

    def __init__(self, waiting_for: str) -> None:
        self.waiting_for = waiting_for
        self.started = datetime.now(UTC)
        self.dep: dict[str, Any] | None = None
        self.outcome: str | None = None
        self.waited = ""

    def finish(self, outcome: str) -> None:
        """Stop the clock: the last frame says how it ended."""
        self.waited = elapsed(self.started.isoformat())
        self.outcome = outcome

    def __rich__(self) -> RenderableType:
        now = datetime.now(UTC)
        if self.outcome is not None:
            footer = Text(f"{self.outcome} after {self.waited}", style="dim")
        else:
            waited = elapsed(self.started.isoformat(), now)
            footer = Text(f"waiting for {self.waiting_for} … {waited}", style="dim")
        if self.dep is None:
            return footer
        return Group(deployment_header(self.dep), instances_table(self.dep, now), footer)


def events_table(events: list[dict[str, Any]]) -> Table:
    out = table("at", "kind", "instance", "phase", "reason", "message")
    for event in events:
        at = parse_time(event.get("at"))
        out.add_row(
            at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if at else cell(event.get("at")),
            cell(event.get("kind")),
            short(event.get("instanceId")),
            status_text(event.get("phase")),
            cell(event.get("reason")),
            cell(event.get("message")),
        )
    return out


SEVERITY_STYLES = {"error": "red", "warning": "yellow", "info": "dim"}


def findings_table(findings: list[dict[str, Any]], *, title: str | None = None) -> Table:
    out = table("severity", "rule", "object", "field", "message", title=title)
    for finding in findings:
        severity = cell(finding.get("severity"))
        out.add_row(
            Text(severity, style=SEVERITY_STYLES.get(severity, "")),
            cell(finding.get("rule")),
            cell(finding.get("object")),
            cell(finding.get("field")),
            cell(finding.get("message")),
        )
    return out
