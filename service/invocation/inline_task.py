"""The inline invocation path's requests followed in a task (inline.py): from wherever a
request is when it needs one — begun there, or handed on by the callbacks — to its end:
streamed, detached after the poll time, handed to the general path when its worker refuses,
or answered with the general path's own outcome; and the request-context accounting both
ways share."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from starlette.requests import Request
from starlette.types import Message

from service.backends.worker import (
    WorkerEndpoint,
    WorkerFailed,
    WorkerResponse,
    WorkerUnreachable,
)
from service.core.errors import ServiceUnavailable
from service.core.logs import request_id_var
from service.core.middleware import Metrics, access_line
from service.invocation import answers
from service.invocation.inline_call import (
    InlineCall,
    outcome_message,
    read_detached,
)
from service.invocation.models import RequestState
from service.invocation.records import Invocation
from service.invocation.router import respond
from service.invocation.store import Outcome
from service.invocation.wire import nothing, write_whole

log = logging.getLogger("nvcf.invocation")

#: endpoints kept per instance route at most (routes are re-read every cache period)
MAX_ENDPOINTS = 4096


class TaskWay:
    """What `InlineInvocation` does in a task (see the module docstring)."""

    metrics: Metrics
    json_logs: bool
    #: by `InstanceRoute.key`
    _endpoints: dict[str, WorkerEndpoint]

    async def _guarded(self, call: InlineCall, response: WorkerResponse | None = None) -> None:
        """The request, from wherever it is (`response`: the worker's answer has begun),
        followed to its end; on the express lane, an unexpected error is answered as the
        server's own `run_asgi` does."""
        call.task = asyncio.current_task()
        token = request_id_var.set(call.request_id)
        loop = asyncio.get_running_loop()
        timer = loop.call_at(call.poll_at, self._detach, call)
        cycle = call.cycle
        try:
            await self._run(call, timer, response)
        except BaseException as exc:
            if cycle is None:
                raise
            log.error("Exception in ASGI application", exc_info=exc)
            if not cycle.response_started:
                await cycle.send_500_response()
            else:
                cycle.transport.close()
        finally:
            timer.cancel()
            if call.inv is None:
                self._account(call)
            request_id_var.reset(token)
            if cycle is not None:
                cycle.on_response = nothing

    async def _run(
        self, call: InlineCall, timer: asyncio.TimerHandle, response: WorkerResponse | None
    ) -> None:
        plane = call.plane
        held = True  # the instance's slot, released when the worker's answer is over
        try:
            try:
                if response is None:
                    async with asyncio.timeout_at(call.deadline):
                        response = await self._send(call)
            except WorkerUnreachable as exc:
                timer.cancel()
                if call.inv is None:
                    call.dispatcher.release_now(call.target, call.instance.key)
                    held = False
                    await self._hand_over(call, exc.reason)
                    return
                await self._end(
                    call, Outcome.failure(502, f"the worker could not be reached: {exc.reason}")
                )
                return
            except TimeoutError:
                reason = f"the worker did not answer within {plane.worker_timeout:g} s"
                await self._end(call, Outcome.failure(504, reason))
                return
            except WorkerFailed as exc:
                await self._end(call, Outcome.failure(502, f"the worker failed: {exc.reason}"))
                return
            if call.inv is not None:
                await self._end(call, await read_detached(plane, response))
                return
            timer.cancel()
            await self._stream(call, response)
        except asyncio.CancelledError:
            if call.inv is None:
                raise
            # detached: the caller has its 202; the request ends as a shut-down replica's
            if not call.inv.done.is_set():
                reason = f"the replica {plane.owner.value} running the request shut down"
                await asyncio.shield(self._end(call, Outcome.failure(503, reason)))
        finally:
            if held:
                call.dispatcher.release_now(call.target, call.instance.key)

    async def _send(self, call: InlineCall) -> WorkerResponse:
        if call.exchange is not None:
            return await call.exchange.response()
        endpoint = await self._endpoint(call)
        headers = call.plane.worker_headers(
            call.headers(), call.request_id, call.principal, call.target, call.instance
        )
        return await endpoint.send(call.scope["method"], call.path, headers, call.body)

    async def _endpoint(self, call: InlineCall) -> WorkerEndpoint:
        endpoint = self._endpoints.get(call.instance.key)
        if endpoint is None:
            endpoint = await call.plane.endpoint_of(call.target, call.instance)
            if len(self._endpoints) >= MAX_ENDPOINTS:
                self._endpoints.clear()
            self._endpoints[call.instance.key] = endpoint
        return endpoint

    async def _stream(self, call: InlineCall, response: WorkerResponse) -> None:
        """The worker's answer to the caller as it arrives (the handler's own task): in one
        piece when it has all arrived already."""
        head, listen = answers.stream_head(response, call.request_id)
        headers = head + call.reply_headers
        error: str | None = None
        try:
            call.status = response.status
            whole = None if listen else response.complete_body()
            if whole is not None:
                await self._send_whole(call, response.status, headers, whole)
            else:
                start = {"type": "http.response.start", "status": response.status}
                await call.send({**start, "headers": headers})
                error = await answers.relay(
                    response, call.receive, call.send, call.deadline, listen=listen
                )
        except BaseException as exc:
            error = f"{type(exc).__name__} while streaming the answer"
            raise
        finally:
            await response.aclose()
            self._counted(call, error is None and response.status < 400)

    @staticmethod
    def _counted(call: InlineCall, fulfilled: bool) -> None:
        """The invocation metrics of a request the worker answered (its time by the
        performance counter: the loop's clock may count whole milliseconds)."""
        call.plane.metrics.answered(call.target, fulfilled, time.perf_counter() - call.started)

    async def _end(self, call: InlineCall, outcome: Outcome) -> None:
        """A request that ends without a stream: answered here, or stored when detached."""
        detached = call.inv
        await call.plane.finish(detached or call.invocation(), outcome)
        if detached is not None:
            if call.pending is not None:
                await call.pending
            return
        if outcome.error is not None:
            err = answers.failure_error(outcome)
            path = call.scope.get("path", "")
            status, headers, body = answers.problem_message(
                err, path, call.request_id, call.request_id
            )
        else:
            status, headers, body = outcome_message(outcome, call.request_id)
        await self._reply(call, status, headers, body)

    async def _reply(
        self, call: InlineCall, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        call.status = status
        await self._send_whole(call, status, headers + call.reply_headers, body)

    @staticmethod
    async def _send_whole(
        call: InlineCall, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        """A whole answer: written to the connection at once on the express lane, else two
        ASGI messages."""
        if call.cycle is not None and write_whole(call.cycle, status, headers, body):
            return
        await call.send({"type": "http.response.start", "status": status, "headers": headers})
        await call.send({"type": "http.response.body", "body": body})

    def _detach(self, call: InlineCall) -> None:
        """The poll time passed without the worker's answer: the request is stored as
        pending and answered 202 by a task of its own; the handler waits on for the worker."""
        inv = call.inv = call.invocation()
        inv.detached = True
        inv.instance = call.instance
        call.plane.track(inv)
        call.pending = asyncio.ensure_future(self._answer_pending(call, inv))

    async def _answer_pending(self, call: InlineCall, inv: Invocation) -> None:
        try:
            await call.plane.store_pending(inv)
            body = json.dumps({"reqId": call.request_id, "status": answers.PENDING}).encode()
            status, headers = (
                202,
                [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *answers.nvcf_headers(call.request_id, answers.PENDING),
                ],
            )
        except ServiceUnavailable as err:
            path = call.scope.get("path", "")
            status, headers, body = answers.problem_message(
                err, path, call.request_id, call.request_id
            )
        try:
            await self._reply(call, status, headers, body)
        except OSError:
            log.info("the caller of request %s went away before its 202", call.request_id)
        finally:
            self._account(call)

    async def _hand_over(self, call: InlineCall, reason: str) -> None:
        """The worker refused the connection: the general path takes the request over — on
        another instance, or queued — and answers it within what is left of the poll time."""
        plane = call.plane
        inv = call.invocation(RequestState.QUEUED)
        inv.tried.append(call.instance.id)
        inv.reasons.append(f"instance {call.instance.id}: {reason}")
        inv.task = None
        scope = call.scope
        scope["state"] = {**(scope.get("state") or {}), "request_id": call.request_id}
        retry = await plane.retry(inv, call.target)
        if isinstance(retry, Outcome):
            await self._end(call, retry)
            return
        plane.begin(inv, retry[1])
        poll = max(0.0, call.poll_at - asyncio.get_running_loop().time())
        request = Request(scope, call.receive)
        response = await respond(request, plane, inv, poll, wrapped=False)

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                call.status = message["status"]
                message["headers"] = [*message.get("headers", []), *call.reply_headers]
            await call.send(message)

        await response(scope, call.receive, send)

    def _account(self, call: InlineCall) -> None:
        """The request-context middleware's accounting: metrics and the access line."""
        elapsed = time.perf_counter() - call.started
        method = call.scope["method"]
        status = call.status or 500
        self.metrics.record(method, call.label, status, elapsed)
        access_line(
            method,
            call.scope.get("path", ""),
            status,
            elapsed,
            call.request_id,
            call.principal.account_id,
            json_logs=self.json_logs,
        )
