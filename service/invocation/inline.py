"""The inline invocation path (`NVCF_INVOKE_INLINE`): the common invocation answered in the
HTTP handler's own task, with nothing in between.

The general path (router.py, service.py) resolves, counts and queues a request, runs it in a
task of its own and hands the worker's answer to the waiting handler — right for a request
that waits in a queue, is retried or outlives its poll time, but most requests are none of
those: the caller's key was verified moments ago, the version's route is cached, an instance
has room now and the worker answers within the poll time. This path takes exactly those. It
checks what it can without waiting (a cached principal holding `invoke_function`, a fresh
cached route, no function rate limit, the in-process dispatcher, a body of declared length
within the limit, no query string, no client request id, a valid poll time), reads the body,
takes an instance that is free now and sends to its worker from the handler's task; the
worker's answer streams straight back. It does the request-context middleware's work itself
(request id, `X-Request-Id`, metrics, access log), with the same results.

Anything else is the general path's, unchanged: a request is handed over whole before its
body is read, or with its body replayed after (every instance busy: the request queues).
Once the request is on its way:

- the worker refuses the connection: the request continues on the general path (retried once
  on another instance, or queued when the version scaled to zero meanwhile);
- the poll time passes before the worker's answer: a timer detaches the request — a task
  started then stores it as pending and sends the 202 — while the handler keeps waiting for
  the worker and stores the outcome for polling.

When a kept-alive connection to the worker is idle (the common case under load), the request
does not even get a task: on the server's express lane it is begun as its body completes —
the worker request written at once — and the worker connection's data callback writes a whole
answer to the caller (`untasked`). Whatever is not that simple (an answer still arriving or
streamed, a failure, a stale connection, the poll time passing, the caller's connection not
taking writes) is followed from there in a task, as above (`followed`).

`answered` and `handed_over` count the two ways (tests show which path answered).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from service.backends.worker import (
    WorkerEndpoint,
    WorkerExchange,
    WorkerResponse,
)
from service.core.front import Front, Headers
from service.core.logs import request_id_var
from service.core.middleware import Metrics
from service.invocation import answers
from service.invocation.forward import request_lines
from service.invocation.inline_call import (
    X_REQUEST_ID,
    InlineCall,
    Ready,
    discarded,
    disconnected,
    header_index,
    unset,
    what_it_needs,
)
from service.invocation.inline_task import TaskWay
from service.invocation.routing import InstanceRoute
from service.invocation.wire import CycleWire, Replay, new_request_id

log = logging.getLogger("nvcf.invocation")

#: an answer of declared length up to this size whose head came first is awaited whole on
#: the callbacks (the head alone is of no use to the caller); a larger one is streamed
WHOLE_MAX = 64 * 1024
#: what the callbacks answer when they fail (as uvicorn's own 500)
_ERROR_BODY = b"Internal Server Error"
_ERROR_LINES = b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n" % len(
    _ERROR_BODY
)
#: scope key: the express lane handed the request over (the front door must not try again)
DECLINED = "nvcf.inline_declined"


class InlineInvocation(TaskWay):
    """See the module docstring. `general` answers what this path hands over."""

    def __init__(
        self,
        *,
        state: Any,
        metrics: Metrics,
        json_logs: bool,
        body_limit: int,
        general: ASGIApp,
    ) -> None:
        #: what `state` holds, as a mapping (a starlette `State` keeps a dict: an attribute
        #: read through its `__getattr__` first fails the ordinary lookup, an AttributeError
        #: made and dropped per read)
        values = getattr(state, "_state", None)
        self._values: Mapping[str, Any] = values if isinstance(values, dict) else vars(state)
        self.metrics = metrics
        self.json_logs = json_logs
        self.body_limit = body_limit
        self.general = general
        self.answered = 0
        self.handed_over = 0
        #: of `answered`: answered from callbacks alone, and begun so then followed in a task
        self.untasked = 0
        self.followed = 0
        #: of `answered`: taken by the front protocol (core/front.py) from the request's head
        self.fronted = 0
        self._endpoints: dict[str, WorkerEndpoint] = {}
        #: requests followed in tasks started from callbacks (kept from the garbage collector)
        self._tasks: set[asyncio.Task[None]] = set()
        #: the event loop last found running (`_loop_now`)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        function_id: str,
        version_id: str | None,
        path: str | None,
        label: str,
    ) -> None:
        started = time.perf_counter()
        ready = self._ready(scope, function_id, version_id)
        if ready is None:
            self.handed_over += 1
            await self.general(scope, receive, send)
            return
        try:
            message: Message | BaseException = await receive()
        except Exception as exc:  # a late body (408): the general path answers it
            message = exc
        if (
            isinstance(message, BaseException)
            or message["type"] != "http.request"
            or message.get("more_body", False)
        ):
            self.handed_over += 1
            await self.general(scope, Replay(message, receive), send)
            return
        instance = ready[1].take_now(ready[3])
        if instance is None:  # every instance is busy: the request queues
            self.handed_over += 1
            await self.general(scope, Replay(message, receive), send)
            return
        self.answered += 1
        body = message.get("body", b"")
        call = self._call(ready, instance, body, scope, receive, send, path, label, started)
        await self._guarded(call)

    def start(
        self,
        cycle: RequestResponseCycle,
        app: ASGIApp,
        *,
        function_id: str,
        version_id: str | None,
        path: str | None,
        label: str,
    ) -> Coroutine[Any, Any, None] | None:
        """The express lane's entry (core/server.py): the request of a server cycle, its body
        complete. When a connection to the worker is open and idle, the worker request is
        written now and its answer taken by callbacks (None: no task at all); else the
        coroutine that answers it in a task — the ordinary way (`cycle.run_asgi`) for
        anything this path hands over."""
        started = time.perf_counter()
        scope: Scope = cycle.scope  # type: ignore[assignment]
        ready = None
        if scope["method"] != "HEAD":
            ready = self._ready(scope, function_id, version_id)
        instance = None if ready is None else ready[1].take_now(ready[3])
        if ready is None or instance is None:
            self.handed_over += 1
            scope[DECLINED] = True
            return cycle.run_asgi(app)  # type: ignore[arg-type]
        self.answered += 1
        call = self._call(
            ready,
            instance,
            bytes(cycle.body),
            scope,
            cycle.receive,  # type: ignore[arg-type]
            cycle.send,  # type: ignore[arg-type]
            path,
            label,
            started,
            cycle,
        )
        call.wire = CycleWire(cycle)
        endpoint = self._endpoints.get(instance.key)
        if endpoint is not None:
            try:
                lines = self._worker_lines(call, scope["headers"])
                call.exchange = endpoint.begin(scope["method"], call.path, lines, call.body)
            except Exception:
                call.dispatcher.release_now(call.target, instance.key)
                raise
        if call.exchange is None:
            return self._guarded(call)
        self._listen(call)
        return None

    def run_front(
        self,
        front: Front,
        headers: Headers,
        body: bytes,
        *,
        function_id: str,
        version_id: str | None,
        path: str,
        label: str,
    ) -> bool:
        """The front protocol's entry (core/front.py): a pexec POST (`path`, no query) taken
        from its head, its body complete. When an instance has room and a connection to its
        worker is open and idle, the worker request is written now and its answer taken by
        callbacks (True); else False, and the request comes again by uvicorn's protocol."""
        started = time.perf_counter()
        ready = what_it_needs(self._values, self.body_limit, headers, function_id, version_id)
        if ready is None:
            return False
        dispatcher, target = ready[1], ready[3]
        instance = dispatcher.take_now(target)
        if instance is None:
            return False
        endpoint = self._endpoints.get(instance.key)
        exchange = None
        try:
            if endpoint is not None:
                raw = list(headers.items())
                scope = {"method": "POST", "path": path, "headers": raw}
                call = self._call(ready, instance, body, scope, unset, unset, None, label, started)
                lines = self._worker_lines(call, raw)
                exchange = call.exchange = endpoint.begin("POST", call.path, lines, body)
        finally:
            if exchange is None:
                dispatcher.release_now(target, instance.key)
        if exchange is None:
            return False
        self.answered += 1
        self.fronted += 1
        call.wire = front
        self._listen(call)
        return True

    @staticmethod
    def _worker_lines(call: InlineCall, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
        """The header lines of the worker request: the caller's, then the NVCF-* ones."""
        return request_lines(headers) + call.plane.worker_lines(
            call.request_id, call.principal, call.target, call.instance
        )

    def _listen(self, call: InlineCall) -> None:
        """The worker request written: its answer is followed by callbacks, the poll time and
        the worker's deadline by a timer."""
        assert call.exchange is not None
        call.exchange.listen(
            functools.partial(self._answered, call),
            until=min(call.poll_at, call.deadline),
            on_expiry=functools.partial(self._follow, call, None),
        )

    def _loop_now(self) -> float:
        """The running event loop's time, the loop kept while it runs: looking it up costs a
        system call on Python 3.11 (the process id is checked at every look-up)."""
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop.time()

    def _ready(self, scope: Scope, function_id: str, version_id: str | None) -> Ready | None:
        if scope.get("query_string"):
            return None
        headers = header_index(scope["headers"])
        if headers is None:
            return None
        return what_it_needs(self._values, self.body_limit, headers, function_id, version_id)

    def _call(
        self,
        ready: Ready,
        instance: InstanceRoute,
        body: bytes,
        scope: Scope,
        receive: Receive,
        send: Send,
        path: str | None,
        label: str,
        started: float,
        cycle: RequestResponseCycle | None = None,
    ) -> InlineCall:
        plane, dispatcher, principal, target, poll = ready
        request_id = new_request_id()
        now = self._loop_now()
        call = InlineCall(
            plane=plane,
            dispatcher=dispatcher,
            principal=principal,
            target=target,
            instance=instance,
            request_id=request_id,
            scope=scope,
            send=send,
            label=label,
            started=started,
            path=target.inference_path if path is None else path,
            body=body,
            accepted=now,
            deadline=now + plane.worker_timeout,
            poll_at=now + poll,
            receive=receive,
            cycle=cycle,
        )
        call.reply_headers.append((X_REQUEST_ID, request_id.encode()))
        return call

    # followed by callbacks (the express lane, a worker connection at hand)

    def _answered(self, call: InlineCall) -> None:
        """Something happened on the worker's connection: a whole answer is written to the
        caller at once (a small one whose head came first is waited for); anything else (a
        failure, an answer still arriving, the caller's connection not taking writes) is
        followed in a task from here on."""
        exchange, wire = call.exchange, call.wire
        assert exchange is not None and wire is not None
        if not exchange.settled or exchange.arriving(WHOLE_MAX):
            return
        exchange.listen(None)
        # this runs in the worker connection's context: the request's id for what it logs and
        # for the tasks it starts
        token = request_id_var.set(call.request_id)
        try:
            if self._write_answer(call, exchange, wire):
                self._account(call)
        finally:
            request_id_var.reset(token)

    def _write_answer(self, call: InlineCall, exchange: WorkerExchange, wire: Front) -> bool:
        """The whole answer written to the caller (True), or the request followed in a task
        from here (False)."""
        held = True
        written = False
        try:
            head = exchange.head() if wire.writable() else None
            lines = None if head is None else answers.whole_lines(*head, call.request_id)
            whole = None if lines is None else exchange.take_body()
            if head is None or lines is None or whole is None:
                self._follow(call, exchange.response_now())
                return False
            call.dispatcher.release_now(call.target, call.instance.key)
            held = False
            status = call.status = head[0]
            lines += b"x-request-id: " + call.request_id.encode() + b"\r\n"
            wire.write(status, lines, whole)
            written = True
            self.untasked += 1
            self._counted(call, status < 400)
        except Exception as exc:  # answered as the server's own run_asgi would
            log.error("Exception in ASGI application", exc_info=exc)
            if written:
                return True  # the answer is out: only what came after it failed
            exchange.abandon()
            if held:
                call.dispatcher.release_now(call.target, call.instance.key)
            call.status = 500
            if wire.writable():
                wire.write(500, _ERROR_LINES, _ERROR_BODY)
            else:
                wire.abort()
        return True

    def _follow(self, call: InlineCall, response: WorkerResponse | None) -> None:
        """From here on the request is followed in a task, as one that began there."""
        assert call.exchange is not None
        call.exchange.listen(None)
        self.followed += 1
        if call.cycle is None:  # taken by the front protocol: it goes on with a cycle
            assert call.wire is not None
            if call.wire.resume(functools.partial(self._resumed, call, response)):
                return
            # the caller went away: the request goes on as one whose connection is lost
            call.send, call.receive = discarded, disconnected
        task = asyncio.get_running_loop().create_task(self._guarded(call, response))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _resumed(
        self, call: InlineCall, response: WorkerResponse | None, cycle: RequestResponseCycle
    ) -> Coroutine[Any, Any, None]:
        """A request the front protocol took, going on in a task with the cycle uvicorn's
        protocol made of it."""
        call.cycle = cycle
        call.wire = CycleWire(cycle)
        call.scope = cycle.scope  # type: ignore[assignment]
        call.receive = cycle.receive  # type: ignore[assignment]
        call.send = cycle.send  # type: ignore[assignment]
        return self._guarded(call, response)
