"""Every field rule of api.md §2.1–2.2, checked in one pass so that ALL violations are reported.

Bodies are validated here rather than by pydantic models because cross-field rules (exactly one
of containerImage/helmChart/models, helmChartServiceName only with helmChart, …) must be
reported together with the per-field ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from service.charts.url import ChartUrlError, parse_chart_url
from service.core.durations import DurationError, parse_duration
from service.core.errors import FieldError, ValidationFailed
from service.core.http import json_kind, require_json_object

NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9\-_]*$")
DNS1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
TAG_RE = re.compile(r"^[a-zA-Z0-9\-_:=]+$")
SECRET_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
RATE_RE = re.compile(r"^[1-9]\d*-[SMHD](,\s*[1-9]\d*-[SMHD])*$")
URI_PATH_RE = re.compile(r"^[A-Za-z0-9\-._~!$&'()*+,;=:@/%]+$")

API_BODY_FORMATS = ("CUSTOM", "PREDICT_V2")
FUNCTION_TYPES = ("DEFAULT", "STREAMING", "LLM")
HEALTH_PROTOCOLS = ("HTTP", "gRPC")
MAX_TAGS = 64
MAX_SECRET_VALUE = 32768


@dataclass
class FunctionSpec:
    """A validated, normalised create request."""

    name: str
    inference_url: str
    inference_port: int | None
    container_image: str | None
    container_args: str | None
    container_environment: list[dict[str, str]] | None
    helm_chart: str | None
    helm_chart_service_name: str | None
    models: list[dict[str, str]] | None
    resources: list[dict[str, str]] | None
    api_body_format: str
    function_type: str
    health: dict[str, Any]
    health_uri: str | None
    description: str
    tags: list[str]
    secrets: list[tuple[str, str]] = field(default_factory=list)
    rate_limit: dict[str, Any] | None = None


@dataclass
class MetadataUpdate:
    tags: list[str] | None
    description: str | None
    rate_limit: dict[str, Any] | None


class _Checker:
    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def err(self, fld: str, message: str) -> None:
        self.errors.append(FieldError(fld, message))

    def _fetch(self, body: dict[str, Any], key: str, fld: str, required: bool) -> Any:
        value = body.get(key)
        if value is None and required:
            self.err(fld, "is required")
        return value

    def string(
        self,
        body: dict[str, Any],
        key: str,
        *,
        required: bool = False,
        max_len: int | None = None,
        min_len: int = 0,
        where: str | None = None,
    ) -> str | None:
        fld = where or key
        value = self._fetch(body, key, fld, required)
        if value is None:
            return None
        if not isinstance(value, str):
            self.err(fld, f"must be a string, got {json_kind(value)}")
            return None
        if len(value) < min_len or (required and min_len == 0 and value == ""):
            self.err(
                fld,
                "must not be empty" if min_len <= 1 else f"must be at least {min_len} characters",
            )
            return None
        if max_len is not None and len(value) > max_len:
            self.err(fld, f"must be at most {max_len} characters, got {len(value)}")
            return None
        return value

    def integer(
        self,
        body: dict[str, Any],
        key: str,
        lo: int,
        hi: int,
        where: str | None = None,
        required: bool = False,
    ) -> int | None:
        fld = where or key
        value = self._fetch(body, key, fld, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(fld, f"must be an integer, got {json_kind(value)}")
            return None
        if not lo <= value <= hi:
            self.err(fld, f"must be between {lo} and {hi}, got {value}")
            return None
        return value

    def enum(
        self,
        body: dict[str, Any],
        key: str,
        allowed: tuple[str, ...],
        default: str | None,
        where: str | None = None,
        required: bool = False,
    ) -> str | None:
        fld = where or key
        value = self._fetch(body, key, fld, required)
        if value is None:
            return default
        if not isinstance(value, str):
            self.err(fld, f"must be one of {', '.join(allowed)}, got {json_kind(value)}")
            return default
        for a in allowed:
            if a.lower() == value.lower():
                return a
        self.err(fld, f"must be one of {', '.join(allowed)}, got '{value}'")
        return default

    def uri_path(self, value: str, fld: str) -> None:
        if "://" in value:
            self.err(fld, f"must be a URI path such as '/echo', not an absolute URL ('{value}')")
        elif not URI_PATH_RE.match(value):
            self.err(fld, f"'{value}' is not a valid URI path (no spaces, '?' or '#')")
        elif len(value) > 2048:
            self.err(fld, "must be at most 2048 characters")


def _tags(c: _Checker, value: Any, fld: str = "tags") -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        c.err(fld, f"must be a list of strings, got {json_kind(value)}")
        return []
    if len(value) > MAX_TAGS:
        c.err(fld, f"must have at most {MAX_TAGS} items, got {len(value)}")
    out: list[str] = []
    for i, tag in enumerate(value):
        f = f"{fld}[{i}]"
        if not isinstance(tag, str):
            c.err(f, f"must be a string, got {json_kind(tag)}")
        elif not tag:
            c.err(f, "must not be empty")
        elif len(tag) > 128:
            c.err(f, f"must be at most 128 characters, got {len(tag)}")
        elif not TAG_RE.match(tag):
            c.err(f, f"'{tag}' may contain only letters, digits and '-', '_', ':', '='")
        elif tag not in out:
            out.append(tag)
    return out


def _description(c: _Checker, body: dict[str, Any]) -> str | None:
    return c.string(body, "description", max_len=256)


def _rate_limit(c: _Checker, value: Any, fld: str = "rateLimit") -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        c.err(fld, f'must be an object like {{"rateLimit": "100-S"}}, got {json_kind(value)}')
        return None
    out: dict[str, Any] = {}
    rate = value.get("rateLimit")
    if rate is None:
        c.err(f"{fld}.rateLimit", "is required")
    elif not isinstance(rate, str):
        c.err(f"{fld}.rateLimit", f"must be a string such as '100-S', got {json_kind(rate)}")
    elif not RATE_RE.match(rate):
        c.err(
            f"{fld}.rateLimit",
            f"'{rate}' must be '<count>-<unit>' items separated by commas, unit S, M, H or D "
            "(e.g. '100-S,5000-H')",
        )
    else:
        units = [part.strip().split("-")[1] for part in rate.split(",")]
        dup = sorted({u for u in units if units.count(u) > 1})
        if dup:
            c.err(f"{fld}.rateLimit", f"'{rate}' names the unit {', '.join(dup)} more than once")
        else:
            out["rateLimit"] = rate
    exempt = value.get("exemptedNcaIds")
    if exempt is not None:
        if not isinstance(exempt, list) or not all(isinstance(x, str) for x in exempt):
            c.err(f"{fld}.exemptedNcaIds", "must be a list of strings")
        else:
            out["exemptedNcaIds"] = exempt
    sync = value.get("syncCheck")
    if sync is not None:
        if not isinstance(sync, bool):
            c.err(f"{fld}.syncCheck", f"must be a boolean, got {json_kind(sync)}")
        else:
            out["syncCheck"] = sync
    return out


def _artifacts(c: _Checker, value: Any, fld: str) -> list[dict[str, str]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        c.err(fld, f"must be a list of {{name, version, uri}}, got {json_kind(value)}")
        return None
    out: list[dict[str, str]] = []
    for i, item in enumerate(value):
        f = f"{fld}[{i}]"
        if not isinstance(item, dict):
            c.err(f, f"must be an object with name, version and uri, got {json_kind(item)}")
            continue
        entry = {}
        for k in ("name", "version", "uri"):
            v = c.string(item, k, required=True, where=f"{f}.{k}", max_len=1024)
            if v is not None:
                entry[k] = v
        out.append(entry)
    return out


def _environment(c: _Checker, value: Any) -> list[dict[str, str]] | None:
    fld = "containerEnvironment"
    if value is None:
        return None
    if not isinstance(value, list):
        c.err(fld, f"must be a list of {{key, value}}, got {json_kind(value)}")
        return None
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        f = f"{fld}[{i}]"
        if not isinstance(item, dict):
            c.err(f, f"must be an object with key and value, got {json_kind(item)}")
            continue
        key = c.string(item, "key", required=True, where=f"{f}.key", max_len=256)
        val = item.get("value")
        if val is None:
            c.err(f"{f}.value", "is required")
        elif not isinstance(val, str):
            c.err(f"{f}.value", f"must be a string, got {json_kind(val)}")
        if key is None:
            continue
        if key.upper().startswith("NVCF_"):
            c.err(f"{f}.key", f"'{key}': keys starting with NVCF_ are reserved for the platform")
        elif key in seen:
            c.err(f"{f}.key", f"'{key}' appears more than once; keys must be unique")
        seen.add(key)
        if isinstance(val, str):
            out.append({"key": key, "value": val})
    return out


def _secrets(c: _Checker, value: Any) -> list[tuple[str, str]]:
    fld = "secrets"
    if value is None:
        return []
    if not isinstance(value, list):
        c.err(fld, f"must be a list of {{name, value}}, got {json_kind(value)}")
        return []
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        f = f"{fld}[{i}]"
        if not isinstance(item, dict):
            c.err(f, f"must be an object with name and value, got {json_kind(item)}")
            continue
        name = c.string(item, "name", required=True, where=f"{f}.name")
        if name is not None:
            if len(name) > 48:
                c.err(f"{f}.name", f"must be at most 48 characters, got {len(name)}")
                name = None
            elif not SECRET_NAME_RE.match(name):
                c.err(
                    f"{f}.name",
                    f"'{name}' must start with a letter or digit and contain only letters, "
                    "digits, '_', '.' and '-'",
                )
                name = None
            elif name in seen:
                c.err(f"{f}.name", f"'{name}' appears more than once; names must be unique")
                name = None
            else:
                seen.add(name)
        raw = item.get("value")
        text: str | None = None
        if raw is None:
            c.err(f"{f}.value", "is required")
        elif isinstance(raw, str):
            text = raw
        elif isinstance(raw, dict):
            text = json.dumps(raw, separators=(",", ":"), sort_keys=True)
        else:
            c.err(f"{f}.value", f"must be a string or an object, got {json_kind(raw)}")
        if text is not None and not 1 <= len(text) <= MAX_SECRET_VALUE:
            # Never quote the value: it is a secret.
            c.err(f"{f}.value", f"must be 1 to {MAX_SECRET_VALUE} characters, got {len(text)}")
            text = None
        if name is not None and text is not None:
            out.append((name, text))
    return out


def _is_duration(text: str) -> bool:
    try:
        parse_duration(text)
    except DurationError:
        return False
    return True


def _health(c: _Checker, value: Any) -> dict[str, Any] | None:
    fld = "health"
    if value is None:
        return None
    if not isinstance(value, dict):
        c.err(fld, f"must be an object, got {json_kind(value)}")
        return None
    protocol = c.enum(
        value, "protocol", HEALTH_PROTOCOLS, None, where=f"{fld}.protocol", required=True
    )
    uri = c.string(value, "uri", required=True, where=f"{fld}.uri")
    if uri is not None:
        c.uri_path(uri, f"{fld}.uri")
    port = c.integer(value, "port", 1, 65535, where=f"{fld}.port", required=True)
    timeout = c.string(value, "timeout", required=True, where=f"{fld}.timeout")
    if timeout is not None and not _is_duration(timeout):
        c.err(f"{fld}.timeout", f"'{timeout}' is not an ISO-8601 duration such as 'PT10S'")
    code = c.integer(
        value, "expectedStatusCode", 100, 599, where=f"{fld}.expectedStatusCode", required=True
    )
    return {
        "protocol": protocol,
        "uri": uri,
        "port": port,
        "timeout": timeout,
        "expectedStatusCode": code,
    }


def validate_create(raw: Any) -> FunctionSpec:
    """Validate a create-function / create-version body, or raise with every violation."""
    body = require_json_object(raw)
    c = _Checker()
    name = c.string(body, "name", required=True, max_len=128)
    if name is not None and not NAME_RE.match(name):
        c.err(
            "name",
            f"'{name}' must start with a letter or digit and contain only letters, "
            "digits, '-' and '_'",
        )
    inference_url = c.string(body, "inferenceUrl", required=True)
    if inference_url is not None:
        c.uri_path(inference_url, "inferenceUrl")
    port = c.integer(body, "inferencePort", 1, 65535)
    image = c.string(body, "containerImage", min_len=1, max_len=1024)
    chart = c.string(body, "helmChart", min_len=1, max_len=2048)
    service_name = c.string(body, "helmChartServiceName")
    args = c.string(body, "containerArgs", max_len=4096)
    env = _environment(c, body.get("containerEnvironment"))
    models = _artifacts(c, body.get("models"), "models")
    resources = _artifacts(c, body.get("resources"), "resources")
    fmt = c.enum(body, "apiBodyFormat", API_BODY_FORMATS, "CUSTOM")
    ftype = c.enum(body, "functionType", FUNCTION_TYPES, "DEFAULT")
    health = _health(c, body.get("health"))
    health_uri = c.string(body, "healthUri", min_len=1)
    if health_uri is not None:
        c.uri_path(health_uri, "healthUri")
    description = _description(c, body)
    tags = _tags(c, body.get("tags"))
    secrets = _secrets(c, body.get("secrets"))
    rate_limit = _rate_limit(c, body.get("rateLimit"))

    has = {k: body.get(k) is not None for k in ("containerImage", "helmChart", "models")}
    if not any(has.values()):
        c.err("containerImage", "one of containerImage, helmChart or models is required")
    if has["helmChart"]:
        for other in ("containerImage", "containerArgs", "containerEnvironment"):
            if body.get(other) is not None:
                c.err(other, f"{other} cannot be used together with helmChart")
        if service_name is None and "helmChartServiceName" not in body:
            c.err("helmChartServiceName", "is required with helmChart")
        elif service_name is not None and (
            len(service_name) > 63 or not DNS1035_RE.match(service_name)
        ):
            c.err(
                "helmChartServiceName",
                f"'{service_name}' must be a DNS-1035 label: at most 63 lower-case letters, "
                "digits and '-', starting with a letter and ending with a letter or digit",
            )
        if chart is not None:
            try:
                parse_chart_url(chart)
            except ChartUrlError as exc:
                for message in exc.messages:
                    c.err("helmChart", message)
    elif body.get("helmChartServiceName") is not None:
        c.err("helmChartServiceName", "is only allowed together with helmChart")

    if c.errors:
        raise ValidationFailed.of(c.errors)
    assert name is not None and inference_url is not None and fmt is not None and ftype is not None
    if health is None:
        grpc = inference_url.strip("/").lower() == "grpc"
        health = {
            "protocol": "gRPC" if grpc else "HTTP",
            "uri": health_uri or "/v2/health/ready",
            "port": port or 8000,
            "timeout": "PT10S",
            "expectedStatusCode": 200,
        }
    return FunctionSpec(
        name=name,
        inference_url=inference_url,
        inference_port=port,
        container_image=image,
        container_args=args,
        container_environment=env,
        helm_chart=chart,
        helm_chart_service_name=service_name if chart else None,
        models=models,
        resources=resources,
        api_body_format=fmt,
        function_type=ftype,
        health=health,
        health_uri=health_uri,
        description=description if description is not None else name,
        tags=tags,
        secrets=secrets,
        rate_limit=rate_limit,
    )


def validate_metadata_update(raw: Any) -> MetadataUpdate:
    body = require_json_object(raw)
    c = _Checker()
    present = [k for k in ("tags", "description", "rateLimit") if body.get(k) is not None]
    if not present:
        c.err("body", "at least one of tags, description or rateLimit is required")
    tags = _tags(c, body["tags"]) if body.get("tags") is not None else None
    description = _description(c, body)
    rate_limit = _rate_limit(c, body.get("rateLimit"))
    if c.errors:
        raise ValidationFailed.of(c.errors)
    return MetadataUpdate(tags=tags, description=description, rate_limit=rate_limit)
