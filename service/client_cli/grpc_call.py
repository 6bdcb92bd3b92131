"""`nvcf invoke --grpc`: call a gRPC function (inferenceUrl /gRPC) on the server's gRPC
listener, end to end — its standard health service (grpc.health.v1 Check, the default) or any
raw method with bytes in and out (docs/invocation.md, gRPC)."""

from __future__ import annotations

import base64
from urllib.parse import urlsplit

import grpc
from grpc_health.v1 import health_pb2

from service.client_cli.common import fail
from service.client_cli.config import Profile
from service.client_cli.output import Code, Ui

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
#: the server's gRPC port unless `--grpc-address` says otherwise (NVCF_GRPC_PORT's default)
DEFAULT_PORT = 10081


def address_of(profile: Profile, given: str | None) -> tuple[str, bool]:
    """(host:port, TLS): `--grpc-address`, else the API URL's host on the default port; TLS
    when the API URL is https."""
    parts = urlsplit(profile.url)
    tls = parts.scheme == "https"
    if given:
        return given, tls
    host = parts.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{DEFAULT_PORT}", tls


def call(
    ui: Ui,
    profile: Profile,
    *,
    function_id: str,
    version: str | None,
    address: str | None,
    method: str | None,
    body: bytes,
    timeout: float | None,
) -> None:
    """One call; prints the answer (health: the serving status; raw: the bytes as text, or
    base64 when they are not UTF-8) and exits FAILED on a non-OK status."""
    target, tls = address_of(profile, address)
    metadata: tuple[tuple[str, str | bytes], ...] = (
        ("authorization", f"Bearer {profile.api_key}"),
        ("function-id", function_id),
    )
    if version:
        metadata += (("function-version-id", version),)
    health = method is None
    request = health_pb2.HealthCheckRequest().SerializeToString() if health else body
    if tls:
        roots = None
        if profile.ca_cert:
            with open(profile.ca_cert, "rb") as fh:
                roots = fh.read()
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(roots))
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        stub: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            method or HEALTH_CHECK
        )
        try:
            answer, rpc = stub.with_call(request, metadata=metadata, timeout=timeout or 60.0)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            if ui.json:
                ui.emit({"address": target, "code": code.name, "details": details})
            raise fail(ui, f"{target}: {code.name}: {details}", Code.FAILED) from None
    request_id = next((str(v) for k, v in rpc.initial_metadata() or () if k == "nvcf-reqid"), None)
    if health:
        status = health_pb2.HealthCheckResponse.FromString(answer).status
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
        if ui.json:
            ui.emit({"address": target, "requestId": request_id, "code": "OK", "status": name})
        else:
            ui.show(f"{name} ({target}, request {request_id})")
        if name != "SERVING":
            raise fail(ui, f"the function's health service answered {name}", Code.FAILED)
        return
    try:
        text, encoding = answer.decode(), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(answer).decode(), "base64"
    if ui.json:
        ui.emit(
            {
                "address": target,
                "requestId": request_id,
                "code": "OK",
                "body": text,
                "encoding": encoding,
            }
        )
    else:
        ui.show(text)
