"""The LLM gateway's entry: OpenAI's routes over the invocation engine (engine.py).

The invocation plane's single HTTP entry (invocation/http.py) hands the gateway the requests
`Gateway.claims` says are its — `routing.gateway_path`: the LLM host, or the `/v2/nvcf/llm`
prefix — inside the request-context middleware (request ids, metrics, the access log), and
`Gateway.answer` answers every one of them, errors in OpenAI's shape.

A POST runs as any invocation does: authenticated (an API key or invocation token with
`invoke_function`), the body checked (schemas.py), then `Engine.invoke` with the body's `model`
rewritten. The engine resolves the function once and hands the version to the gateway's check
(`_Admission`): an LLM function (routing.check_target; a model or path it does not declare
passes and is logged unless NVCF_LLM_MODEL_ALLOWLIST refuses it), the model's token rate limit
charged (tokens.py), the path `<inferenceUrl><path>`, and the instance the request prefers (its
session's, or its model's routing method's: routing.preference) for the engine's dispatcher.
Shared functions, the function's rate limit, the queue, concurrency, metrics and the
autoscaler signal are the engine's. The answer:

- `stream: true`: the worker's events relayed as they arrive (`[DONE]` included), watched for
  the first token and `usage`;
- `/v1/responses` is always asked of the worker as a stream (as NVCF does); a caller that did
  not ask to stream gets the terminal Responses object;
- otherwise the worker's whole answer (at most NVCF_INVOKE_RESULT_MAX_BYTES), its `usage`
  read;
- a worker's error status is passed on, its body in OpenAI's shape.

The caller hanging up at any point after its body (queued, waiting for the worker, while the
answer is read or streamed) ends the worker request and frees the slot at once
(`answers.Attended`).

Every answer carries `x-multi-turn-session-id` when the request has a session (routing.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from service.auth import scopes
from service.auth.limits import token_rates
from service.auth.service import Principal
from service.backends.worker import WorkerFailed
from service.core.errors import DomainError
from service.core.http import NotJson, RefusedJson, load_json
from service.core.numbers import natural
from service.functions.llm_config import RESPONSES
from service.invocation.answers import Attended, relay
from service.invocation.engine import Admitted, Call
from service.invocation.http_routes import Exchange as EntryExchange
from service.invocation.routing import Target
from service.invocation.run import Finished, Streamed
from service.llm.errors import OpenAIError, from_domain, invalid, model_not_found
from service.llm.metrics import NONE, LlmMetrics
from service.llm.routing import (
    MODELS,
    PRIORITY_HEADER,
    ROUTES,
    SESSION_HEADER,
    RoundRobin,
    Session,
    check_target,
    gateway_path,
    preference,
    priority_of,
    route_error,
    route_path,
    routing_method,
    session_of,
    undeclared,
)
from service.llm.schemas import ParsedRequest, parse_request
from service.llm.service import list_models
from service.llm.sse import StreamWatch, collect_terminal, usage_of
from service.llm.tokens import AccountTokens, Charge, TokenLimiter, estimate, input_estimate

log = logging.getLogger("nvcf.llm")

_JSON = [(b"content-type", b"application/json")]


@dataclass
class Gateway:
    """What the entry keeps across requests: token counters and metrics."""

    suffix: str | None
    max_body: int
    tokens: TokenLimiter
    metrics: LlmMetrics
    #: refuse a model or path the function does not declare (NVCF_LLM_MODEL_ALLOWLIST)
    allowlist: bool = False
    #: every account's token limits, input and output, unless it has its own (the settings')
    account_tokens: tuple[str, str] = ("", "")
    turns: RoundRobin = field(default_factory=RoundRobin)

    def claims(self, scope: Scope) -> str | None:
        """The OpenAI path of a request to the gateway, else None (the entry's host dispatch
        asks once per request)."""
        host = ""
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
                break
        return gateway_path(scope["path"], host, self.suffix)

    async def answer(self, ex: EntryExchange, path: str) -> None:
        """Answer a request the invocation entry handed over (`claims` said `path`)."""
        exchange = _Exchange(self, ex, Request(ex.scope, ex.receive), path)
        response = await exchange.answer()
        await response(ex.scope, ex.receive, ex.send)

    async def aclose(self) -> None:
        await self.tokens.aclose()


@dataclass
class _Exchange:
    """One request through the gateway."""

    gateway: Gateway
    entry: EntryExchange
    request: Request
    path: str
    started: float = field(default_factory=time.monotonic)
    function_id: str = NONE
    model: str = NONE
    session: Session | None = None
    #: the token rate-limit headers of a charged request (tokens.py)
    charged: dict[str, str] = field(default_factory=dict)
    #: the version the engine resolved (its telemetries receive the token counts)
    target: Target | None = None
    #: the caller's account and its token limits (counted from the worker's usage)
    account: str = ""
    account_tokens: AccountTokens = field(default_factory=AccountTokens)

    @property
    def request_id(self) -> str:
        return str(getattr(self.request.state, "request_id", ""))

    @property
    def endpoint(self) -> str:
        """The metrics label of the path: one of the routes, else "other" (labels never take
        a value a client makes up)."""
        return self.path if self.path in ROUTES else "other"

    def _record(self, status: int) -> None:
        self.gateway.metrics.request(
            self.function_id, self.model, self.endpoint, status, time.monotonic() - self.started
        )

    def _error(self, error: OpenAIError) -> Response:
        self._record(error.status)
        response = error.response()
        self._answer_headers(response)
        return response

    def _answer_headers(self, response: Response) -> None:
        """The headers every answer of the gateway carries: the session's, the tokens'."""
        if self.session is not None:
            response.headers[SESSION_HEADER] = self.session.id
        for name, value in self.counted(response.status_code):
            if name not in response.headers:
                response.headers[name] = value

    def counted(self, status: int) -> list[tuple[str, str]]:
        """The token headers of an answer to a charged request (none when nothing was
        charged); `X-Should-Retry: false` on a success (a 429 says its own)."""
        if not self.charged:
            return []
        out = list(self.charged.items())
        if status < 400:
            out.append(("X-Should-Retry", "false"))
        return out

    async def answer(self) -> Response:
        try:
            refused = route_error(self.path, self.request.method)
            if refused is not None:
                return self._error(refused)
            if PRIORITY_HEADER.encode() in (k for k, _ in self.request.scope["headers"]):
                raise invalid(
                    "X-Priority is a reserved header and cannot be set by the client",
                    param=PRIORITY_HEADER,
                )
            self.path = route_path(self.path)
            principal = await self.entry.routes.caller(self.entry, scopes.INVOKE_FUNCTION)
            if self.path == MODELS:
                return await self._models(principal)
            return await self._invoke(principal)
        except OpenAIError as error:
            return self._error(error)
        except DomainError as error:
            return self._error(from_domain(error))

    async def _models(self, principal: Principal) -> Response:
        async with self.entry.routes.sessions()() as session:
            listed = await list_models(session, principal)
        self._record(200)
        return Response(json.dumps(listed, separators=(",", ":")), media_type="application/json")

    async def _body(self) -> bytes:
        limit = self.gateway.max_body
        declared = natural(self.request.headers.get("content-length", "").encode())
        too_large = OpenAIError(413, f"The request body exceeds {limit} bytes.")
        if declared is not None and declared > limit:
            raise too_large
        parts: list[bytes] = []
        size = 0
        async for part in self.request.stream():
            size += len(part)
            if size > limit:
                raise too_large
            parts.append(part)
        return b"".join(parts)

    async def _invoke(self, principal: Principal) -> Response:
        plane = self.entry.routes.plane()
        parsed = parse_request(self.path, await self._body())
        ref = parsed.ref
        self.session = session_of(self.path, parsed.body, self.request.headers.get(SESSION_HEADER))
        admission = _Admission(self, principal, parsed)
        # a hang-up ends the request (and frees its slot) wherever it is; a stream is relayed
        # in a block of its own (`_LlmStream`)
        async with Attended(self.entry.receive, self.entry.send):
            try:
                answer = await plane.engine.invoke(self._call(principal, parsed, admission))
            except BaseException as error:
                if admission.charge is not None:
                    await admission.charge.settle(0)  # never reached a worker: nothing used
                if isinstance(error, DomainError) and not admission.reached:
                    raise _unresolved(error, ref.id, ref.function_id) from None
                raise
            if isinstance(answer, Finished):
                if admission.charge is not None:
                    await admission.charge.settle(0)
                outcome = answer.outcome
                raise OpenAIError(
                    outcome.status if outcome.status >= 400 else 502,
                    f"The model server could not answer: {outcome.error or 'no answer'}.",
                )
            assert isinstance(answer, Streamed)  # never detached: poll_seconds is None
            return await self._respond(parsed, answer, admission.charge)

    def _call(self, principal: Principal, parsed: ParsedRequest, admission: _Admission) -> Call:
        # NVCF's gateway builds the worker's headers from a fixed set: nothing of the caller's
        # (an `x-cache-affinity-key` of its own, a credential) reaches the worker
        accept = (
            b"text/event-stream" if parsed.stream or self.path == RESPONSES else b"application/json"
        )
        return Call(
            principal=principal,
            function_id=parsed.ref.function_id,
            version_id=None,
            method="POST",
            path=None,
            headers=[*_JSON, (b"accept", accept)],
            body=parsed.worker_body(stream=True if self.path == RESPONSES else None),
            request_id=uuid.uuid4(),
            poll_seconds=None,
            check=admission,
            affinity=None if self.session is None else self.session.id,
        )

    async def _respond(
        self, parsed: ParsedRequest, answer: Streamed, charge: Charge | None
    ) -> Response:
        events = any(
            k == b"content-type" and v.lower().startswith(b"text/event-stream")
            for k, v in answer.headers
        )
        if answer.status >= 400:
            body, _ = await self._read(answer)
            if charge is not None:
                await charge.settle(0)
            raise _worker_error(answer.status, body)
        if events and (parsed.stream or self.path != RESPONSES):
            # (a worker streaming what was not asked as a stream is passed on as it is)
            self._record(answer.status)
            response = _LlmStream(self, answer, charge)
            self._answer_headers(response)
            return response
        watch = StreamWatch(self.path)
        if events:  # /v1/responses asked as a stream, the caller not streaming
            limit = self.entry.routes.plane().engine.result_max
            try:
                async with answer:  # closed (the slot freed) whatever happens
                    terminal = await collect_terminal(answer.chunks(), watch, limit)
            except WorkerFailed as exc:
                raise OpenAIError(502, f"The model server failed: {exc.reason}.") from None
            await self.settle(charge, watch)
            if terminal is None:
                raise OpenAIError(
                    502, "The model server's stream ended without a terminal Responses object."
                )
            body = json.dumps(terminal, separators=(",", ":")).encode()
            return self._whole(200, body, [(b"content-type", b"application/json")])
        body, error = await self._read(answer)
        if error is not None:
            raise OpenAIError(502, f"The model server failed: {error}.")
        with contextlib.suppress(NotJson, RefusedJson):
            watch.usage = usage_of(load_json(body))
        await self.settle(charge, watch)
        headers = [(k, v) for k, v in answer.headers if k != b"content-length"]
        return self._whole(answer.status, body, headers)

    def _whole(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
        self._record(status)
        response = Response(body, status_code=status)
        response.raw_headers = [*headers, (b"content-length", str(len(body)).encode())]
        self._answer_headers(response)
        return response

    async def _read(self, answer: Streamed) -> tuple[bytes, str | None]:
        """The worker's whole answer (bounded), closed; and why it stopped short."""
        return await answer.read(self.entry.routes.plane().engine.result_max)

    async def settle(self, charge: Charge | None, watch: StreamWatch) -> None:
        usage = watch.usage
        self.gateway.metrics.used(self.function_id, self.model, self.endpoint, usage)
        if self.target is not None and usage is not None:
            metrics = self.entry.routes.plane().engine.metrics
            metrics.tokens(self.target, self.model, usage.input_tokens, usage.output_tokens)
        if charge is not None:
            await charge.settle(None if usage is None else usage.total)
        if self.account_tokens and usage is not None:
            await self.gateway.tokens.count_account(
                self.account, self.account_tokens, usage.input_tokens, usage.output_tokens
            )


@dataclass
class _Admission:
    """The gateway's check of the version the engine resolves (`Call.check`): an LLM function
    serving the model, the model's tokens charged, the instance the request prefers."""

    exchange: _Exchange
    principal: Principal
    parsed: ParsedRequest
    #: the engine resolved the function (a refusal before is the function's, not the model's)
    reached: bool = False
    charge: Charge | None = None

    async def __call__(self, target: Target) -> Admitted:
        self.reached = True
        exchange, parsed, principal = self.exchange, self.parsed, self.principal
        exchange.target = target
        gateway, ref, path = exchange.gateway, parsed.ref, exchange.path
        config = check_target(
            target.function_type, target.models, ref, path, enforce=gateway.allowlist
        )
        passed = undeclared(target.models, ref, path)
        if passed is not None:
            log.warning(
                "LLM request passed through although %s (function %s)", passed, ref.function_id
            )
        given = input_estimate(path, parsed.body)
        tokens = estimate(path, parsed.body, given)
        # labelled by function and model only once they are known to exist (a made-up model
        # name must not become a metrics series)
        exchange.function_id, exchange.model = str(ref.function_id), ref.name
        own = exchange.entry.routes.own_limits(principal.account_id)
        limits = AccountTokens(*token_rates(own, gateway.account_tokens))
        if limits:
            await gateway.tokens.admit_account(principal.account_id, limits)
            exchange.account, exchange.account_tokens = principal.account_id, limits
        self.charge = await gateway.tokens.charge(
            config.get("tokenRateLimit"),
            account=principal.account_id,
            function_id=exchange.function_id,
            model=ref.name,
            tokens=tokens,
        )
        if self.charge is not None:
            exchange.charged = self.charge.headers
        method = routing_method(config)
        prefer = preference(
            [i.id for i in target.instances],
            method,
            session=exchange.session,
            key=ref.id,
            turns=gateway.turns,
        )
        headers = [
            ("x-request-id", exchange.request_id),
            ("x-routing-key", str(ref.function_id)),
            ("x-routing-method", method),
            ("x-model", ref.name),
            ("x-input-tokens", str(given)),
            ("x-token-estimate", str(tokens)),
        ]
        if exchange.session is not None:
            headers.append(("x-cache-affinity-key", exchange.session.affinity))
        priority = priority_of(target.llm_invocation_config, principal.account_id)
        if priority is not None:
            headers.append((PRIORITY_HEADER, str(priority)))
        return Admitted(
            prefer=prefer,
            priority=priority,
            path=target.inference_path.rstrip("/") + path,
            worker_headers=headers,
            model=ref.name,
        )


def _unresolved(error: DomainError, model: str, function_id: uuid.UUID) -> OpenAIError:
    """The engine's refusal of the function before the gateway's check, in OpenAI's terms."""
    if error.status == 404:
        return model_not_found(model, f"Function {function_id} was not found.")
    if error.status == 400:  # the body is fine: no version of it can serve now
        return OpenAIError(
            503,
            f"The model `{model}` cannot be served now: {error.detail}",
            code="model_not_available",
        )
    return from_domain(error)


def _worker_error(status: int, body: bytes) -> OpenAIError:
    """A worker's error answer in OpenAI's shape (an OpenAI-compatible server's own error
    object is kept)."""
    try:
        parsed = load_json(body)
    except (NotJson, RefusedJson):
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return OpenAIError(
            status,
            error["message"],
            type=error.get("type") if isinstance(error.get("type"), str) else None,
            param=error.get("param") if isinstance(error.get("param"), str) else None,
            code=error.get("code") if isinstance(error.get("code"), str) else None,
        )
    text = body.decode("utf-8", "replace").strip() or "no details"
    return OpenAIError(status, f"The model server answered {status}: {text}")


class _Watched:
    """The worker's stream as the caller gets it, watched on the way (answers.relay)."""

    def __init__(self, answer: Streamed, watch: StreamWatch) -> None:
        self._answer = answer
        self._watch = watch
        self.length = answer.length

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._answer.chunks():
            self._watch.feed(chunk)
            yield chunk


class _LlmStream(Response):
    """A streamed answer relayed as it arrives; closed (the slot freed) whatever happens."""

    def __init__(self, exchange: _Exchange, answer: Streamed, charge: Charge | None) -> None:
        self.status_code = answer.status
        self.background = None
        self._exchange = exchange
        self._answer = answer
        self._charge = charge
        self.raw_headers = [(k, v) for k, v in answer.headers if k != b"content-length"]
        self.raw_headers.append((b"cache-control", b"no-cache"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = self._exchange
        watch = StreamWatch(exchange.path, started=exchange.started)
        error: str | None = None
        try:
            async with Attended(receive, send) as attended:  # a hang-up ends the stream
                await attended(
                    {
                        "type": "http.response.start",
                        "status": self.status_code,
                        "headers": self.raw_headers,
                    }
                )
                error = await relay(_Watched(self._answer, watch), scope, attended)
        except BaseException as exc:
            error = f"{type(exc).__name__} while streaming the answer"
            raise
        finally:
            await self._answer.close(error)
            metrics = exchange.gateway.metrics
            metrics.streamed(
                exchange.function_id,
                exchange.model,
                exchange.endpoint,
                watch.time_to_first_token,
                time.monotonic() - exchange.started,
            )
            await exchange.settle(self._charge, watch)
