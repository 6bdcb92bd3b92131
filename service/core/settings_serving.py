"""The serving settings (a part of `Settings`, service/core/settings.py): invocation over HTTP
and gRPC, the HTTP server, telemetry."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr

from service.core.token_rates import TokenRateText


class ServingSettings(BaseModel):
    # -- invocation (service/invocation/)
    invoke_enabled: bool = Field(
        default=True,
        description="Serve the invocation routes (pexec, exec, status, queues, transparent "
        "mode) in this process; `nvcf-server invoke` runs them alone.",
    )
    invoke_host_suffix: str | None = Field(
        default=None,
        max_length=253,
        description="Transparent mode: a request whose Host is `<functionId>[.<versionId>]."
        "<suffix>` is forwarded to the function (e.g. `invocation.localhost`); unset: any "
        "suffix, as long as the first label is a UUID.",
    )
    invoke_max_body_bytes: int = Field(
        default=5 * 1024 * 1024, gt=0, description="Largest invocation request body, in bytes."
    )
    llm_model_allowlist: bool = Field(
        default=False,
        description="LLM gateway: refuse a request whose model the function does not declare "
        "(404) or whose path the model's `llmConfig.uris` do not list (400). Off (NVCF's "
        "default, its MODEL_URI_ALLOWLIST_ENABLED): such requests reach the worker and are "
        "logged.",
    )
    llm_account_input_token_rate_limit: TokenRateText = Field(
        default="",
        description="LLM gateway: input (prompt) tokens per account, every model together, as "
        "'<count>-<unit>' items (unit S, M, H, D, W or MO, e.g. '100000-M,50000000-MO'); an "
        "account's own `accountInputTokenRateLimit` replaces it. Empty: no limit.",
    )
    llm_account_output_token_rate_limit: TokenRateText = Field(
        default="",
        description="LLM gateway: output (completion) tokens per account, as "
        "`NVCF_LLM_ACCOUNT_INPUT_TOKEN_RATE_LIMIT`; an account's own "
        "`accountOutputTokenRateLimit` replaces it. Empty: no limit.",
    )
    invoke_result_max_bytes: int = Field(
        default=5 * 1024 * 1024,
        gt=0,
        description="Largest worker response kept for polling (and wrapped by exec), in bytes; "
        "a larger one ends the request errored.",
    )
    invoke_result_ttl_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds a polled request's state and result are kept after it started.",
    )
    invoke_progress_period_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Seconds between reads of a detached request's progress report (docs/"
        "assets.md) by the replica running it, which stores it when it changed so that polls "
        "reaching another replica show it (0: never; polls on that replica still do).",
    )
    invoke_queue_max: int = Field(
        default=1000,
        ge=0,
        le=1_000_000,
        description="Requests waiting per function version for a free instance; more are "
        "refused 429.",
    )
    invoke_queue_timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        description="Seconds a request may wait in its queue before it ends errored.",
    )
    invoke_worker_timeout_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds a worker may take to answer a request completely.",
    )
    invoke_route_cache_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Seconds a function version's invocable instances are reused between "
        "database reads (0: read for every request).",
    )
    invoke_worker_max_head_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Bytes of a worker answer's head (status line, headers, interim answers), "
        "and of the framing between its body bytes (a chunk-size line with its extensions, the "
        "trailer section); more end the request errored (502, or the caller's connection closed "
        "once the head went out) and the worker connection is closed.",
    )
    invoke_worker_max_headers: int = Field(
        default=100,
        ge=10,
        description="Header lines of a worker answer, and trailer lines of a chunked one; more "
        "end the request errored (502, or the caller's connection closed once the head went "
        "out).",
    )
    invoke_processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="`nvcf-server invoke`: processes serving the invocation plane on its one "
        "port (`--processes` overrides), each its own replica; more than one needs "
        "`NVCF_REDIS_URL` (replicas share queues and counters only through Redis).",
    )
    invoke_replica_lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A replica that has not renewed its heartbeat for this long is gone: its "
        "pending requests end errored.",
    )
    invoke_token_seconds: int = Field(
        default=600,
        ge=1,
        le=86_400,
        description="Lifetime in seconds of the invocation tokens `POST /v2/nvcf/tokens/"
        "functions...` issues (NVCF: 600), or less: never past the expiry of the API key that "
        "asks for one; an expired token is refused 401. Tokens are not revoked one by one.",
    )
    # -- gRPC invocation (service/invocation/grpc/)
    grpc_enabled: bool = Field(
        default=True,
        description="Serve gRPC functions (inferenceUrl `/gRPC`) on their own port wherever the "
        "invocation routes are served (`NVCF_INVOKE_ENABLED`, `nvcf-server invoke`).",
    )
    grpc_host: str | None = Field(
        default=None,
        max_length=253,
        description="Address the gRPC listener binds; unset: the HTTP server's `--host` "
        "(127.0.0.1 for an application started otherwise).",
    )
    grpc_port: int = Field(
        default=10081,
        ge=0,
        le=65535,
        description="Port of the gRPC listener (NVCF's local gateway port); 0: any free port.",
    )
    grpc_tls_cert: Path | None = Field(
        default=None,
        description="PEM certificate of the gRPC listener; unset: the HTTP server's (`--tls-cert` "
        "or `--tls-self-signed`), and plaintext (h2c) when that serves plain HTTP.",
    )
    grpc_tls_key: Path | None = Field(
        default=None, description="The private key of `NVCF_GRPC_TLS_CERT` (PEM)."
    )
    grpc_max_message_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        le=2**31 - 1,
        description="Largest gRPC message, in bytes, either way (caller to worker, worker to "
        "caller); a larger one ends the call RESOURCE_EXHAUSTED.",
    )
    grpc_worker_channels: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Worker addresses the gRPC listener keeps an open channel (HTTP/2 "
        "connection) to; the least recently used idle one is closed for another.",
    )
    grpc_channel_idle_seconds: float = Field(
        default=300.0,
        gt=0,
        description="A channel to a worker that carried no call for this long is closed.",
    )
    grpc_session_idle_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="A gRPC session (its first call's `nvcf-reqid`) can be resumed on its "
        "instance while one of its calls is open and for this many seconds after the last one "
        "ended (a client reconnecting; NVCF keeps idle gRPC connections 30 s); 0: it ends with "
        "its last call. Shared by every replica through `NVCF_REDIS_URL`.",
    )
    # -- HTTP (service/core/server.py)
    gc_freeze: bool = Field(
        default=True,
        description="`serve` and `invoke`: once the application is built, move the objects "
        "alive at start-up out of the cyclic garbage collector's reach (`gc.freeze`), so its "
        "full collections walk only what requests created instead of pausing every request.",
    )
    max_body_bytes: int = Field(
        default=1024 * 1024, gt=0, description="Largest request body, in bytes."
    )
    http_header_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Seconds for a request head to arrive from its first byte (or from the "
        "connection opening).",
    )
    http_body_timeout: float = Field(
        default=60.0, gt=0, description="Seconds for a request body to arrive after its head."
    )
    http_keepalive_timeout: float = Field(
        default=5.0, gt=0, description="Seconds an idle kept-alive connection stays open."
    )
    http_send_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds sending an answer may make no progress (the caller reads nothing "
        "of it); then the answer is abandoned and its connection closed (an invocation's "
        "worker request ended, its instance slot freed).",
    )
    http_max_head_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Bytes of a request head (request line and headers); a larger one is "
        "answered 431 and its connection closed.",
    )
    http_max_headers: int = Field(
        default=100,
        ge=10,
        description="Header lines of a request; more are answered 431 and the connection closed.",
    )
    http_max_connections: int = Field(
        default=1000,
        ge=1,
        description="Connections open at once (fewer when the file-descriptor limit is "
        "lower); each one beyond is answered 503 and closed.",
    )
    idempotency_ttl_seconds: int = Field(
        default=24 * 3600, gt=0, description="Seconds an Idempotency-Key answer is replayed."
    )
    # -- telemetry (docs/telemetry.md)
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="`json`: every log line is one JSON object (timestamp, level, logger, "
        "message, requestId).",
    )
    metrics_fleet_cache_seconds: float = Field(
        default=15.0,
        ge=0,
        description="Seconds the fleet gauges of `/metrics` (versions by status, instances by "
        "phase and cluster) are reused before the database is counted again (0: every scrape).",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        min_length=32,
        description="A bearer token a Prometheus scraper presents on `/metrics` to read the "
        "series that name tenants' objects (per function version); an operator key "
        "(`admin:accounts`) reads them too. Without either, `/metrics` serves the others only. "
        "At least 32 characters.",
    )
    otel_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="OTLP/HTTP collector (`http://collector:4318`; spans go to "
        "`<endpoint>/v1/traces`); unset: tracing is off and costs nothing.",
    )
    otel_service_name: str = Field(
        default="nvcf-server",
        min_length=1,
        description="`service.name` of the spans this process exports.",
    )
