"""Connection bounds for the uvicorn server: header time, body time, keep-alive idle time and
how many connections are open at once.

uvicorn bounds only the keep-alive idle time: a connection that sends nothing, or half a
request head, or half a body, stays open for as long as the client likes, each one holding a
file descriptor. `BoundedHttpToolsProtocol` (uvicorn's httptools protocol, installed with
`uvicorn.run(http=...)`) adds one deadline per connection:

- from the connection opening, and from a later request's first byte, the head must be
  complete within `header_timeout`;
- from the head, the body must be complete within `body_timeout` (the ASGI side,
  `service.core.middleware.BodyDeadlineMiddleware`, answers a route reading a late body 408);
- between requests, uvicorn's keep-alive timer, set to `keepalive_timeout`.

When the deadline passes the connection is closed: at once if no response is under way, or
else as soon as the response is complete. A connection opened while `max_connections` are open
is answered 503 and closed without reading from it.

An `Express` lane, when the application names one, serves the requests it claims in place of
the ASGI application — no middleware, no ASGI messages, and when it can, no task: it is
started once the request's body has arrived (a claimed request whose body is still incomplete
after the bytes at hand goes the ordinary way) and may answer from callbacks; it falls back to
the ordinary way (`cycle.run_asgi(app)`) for whatever it will not answer itself. The
invocation plane's inline path is one (service/invocation/inline.py).

Under the serve commands connections start with the front protocol (front.py), which hands a
connection to this protocol with the bytes of the request at hand: `resume` then continues a
request already under way (instead of claiming it anew), and `home` takes the connection
back to the front protocol once it is idle between requests.

`freeze_startup_objects` (`NVCF_GC_FREEZE`): the serve commands call it once the application is
built, before serving.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from uvicorn._types import ASGI3Application, HTTPScope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

log = logging.getLogger("nvcf.server")

_REFUSAL_TEXT = b"too many open connections; retry later\n"
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: " + str(len(_REFUSAL_TEXT)).encode() + b"\r\n"
    b"retry-after: 1\r\n"
    b"connection: close\r\n\r\n" + _REFUSAL_TEXT
)

#: file descriptors kept for everything but client connections (database, Redis, Kubernetes
#: and registry clients, chart files, Helm subprocesses), at most half of the limit
FD_RESERVE = 128


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float
    body_timeout: float
    keepalive_timeout: float
    max_connections: int


def soft_fd_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(configured: int, soft_fd_limit: int | None) -> int:
    """`configured`, lowered so that connections cannot use up the file-descriptor limit."""
    if soft_fd_limit is None:
        return configured
    room = soft_fd_limit - min(FD_RESERVE, soft_fd_limit // 2)
    return max(1, min(configured, room))


def freeze_startup_objects(enabled: bool) -> bool:
    """Move everything alive at start-up (modules, classes, the application) out of the cyclic
    garbage collector's reach, so that its full collections, which otherwise walk all of it
    and pause every request for a few hundred ms on a busy machine, walk only what requests
    created. True when done (`NVCF_GC_FREEZE`)."""
    if not enabled:
        return False
    gc.collect()
    gc.freeze()
    return True


class Express(Protocol):
    """A lane past the ASGI stack for some requests (see the module docstring)."""

    def claim(self, scope: HTTPScope) -> bool:
        """Whether this lane would serve the request (its head is complete, not its body)."""
        ...

    def start(
        self, cycle: RequestResponseCycle, app: ASGI3Application
    ) -> Coroutine[Any, Any, None] | None:
        """Begin answering the claimed request of `cycle`, its body complete: None when the
        answer is under way without a task (it completes the cycle itself), else the
        coroutine the server runs as the request's task (which may be `cycle.run_asgi(app)`)."""
        ...


#: how a request handed over already under way goes on, given its cycle (as `Express.start`)
Resume = Callable[[RequestResponseCycle], Coroutine[Any, Any, None] | None]


class Deadline:
    """One connection's deadline: `arm(seconds)` sets it (replacing the one set), `disarm()`
    clears it, `on_passed` is called when it passes. One timer at most, which looks again
    when it fires: a later deadline leaves it be (it sets itself again), so arming one per
    request costs no timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_passed: Callable[[], None]) -> None:
        self._loop = loop
        self._on_passed = on_passed
        #: when the deadline passes (loop time); None: none is set
        self._at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    @property
    def armed(self) -> bool:
        return self._at is not None

    def arm(self, seconds: float) -> None:
        at = self._at = self._loop.time() + seconds
        if self._timer is None or at < self._timer_at:
            self._rearm(at)

    def arm_at(self, at: float) -> None:
        """`arm` for a loop time."""
        self._at = at
        if self._timer is None or at < self._timer_at:
            self._rearm(at)

    def _rearm(self, at: float) -> None:
        """The timer set for `at`, earlier than the one set (if any)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(at, self._look)
        self._timer_at = at

    def disarm(self) -> None:
        self._at = None

    def cancel(self) -> None:
        """Disarmed, and its timer gone (the connection is closed)."""
        self._at = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _look(self) -> None:
        self._timer = None
        at = self._at
        if at is None:
            return
        if self._loop.time() < at:
            self._timer = self._loop.call_at(at, self._look)
            self._timer_at = at
            return
        self._at = None
        self._on_passed()


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits]
    express: ClassVar[Express | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keepalive_timeout  # type: ignore[assignment]
        self._clock = Deadline(self.loop, self._deadline_passed)
        #: the deadline passed while a response was under way: close once it is complete
        self._expired = False
        self._refused = False
        #: a request the express lane claimed, waiting for the rest of its body
        self._claimed: tuple[RequestResponseCycle, ASGI3Application] | None = None
        self._completing = False
        #: set by the front protocol (front.py) handing over a request already under way,
        #: which it replays: how that request goes on, given its cycle
        self.resume: Resume | None = None
        #: set by the front protocol handing its connection over: it takes an open
        #: connection's place (never refused for the connection limit)
        self.adopted = False
        #: how the connection goes back to the front protocol it came from (front.py), as
        #: soon as it is idle between requests; None: it stays
        self.home: Callable[[BoundedHttpToolsProtocol], None] | None = None
        #: the parser is between messages (none begun since the last one completed)
        self._between = True
        self._feeding = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        full = not self.adopted and len(self.connections) >= self.limits.max_connections
        super().connection_made(transport)
        if full:
            self._refused = True
            self.connections.discard(self)
            transport.write(REFUSAL)
            transport.close()
            return
        self._clock.arm(self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._clock.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            self._feeding = True
            try:
                super().data_received(data)
            finally:
                self._feeding = False
            self._unclaim()

    # httptools parser callbacks

    def on_message_begin(self) -> None:
        self._between = False
        super().on_message_begin()
        if not self._clock.armed:  # the first request's deadline runs from the connection
            self._clock.arm(self.limits.header_timeout)

    def on_headers_complete(self) -> None:
        self._clock.arm(self.limits.body_timeout)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._clock.disarm()
        self._between = True
        super().on_message_complete()
        claimed = self._claimed
        if claimed is not None and claimed[0] is self.cycle:
            self._claimed = None
            self._express(*claimed)
        cycle = self.cycle
        if (
            cycle is not None
            and cycle.response_complete
            and not self.pipeline
            and not self.transport.is_closing()
        ):
            # The body finished arriving after its response (the route never read it): the
            # connection is idle from now on, which the keep-alive timer bounds.
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    # uvicorn hooks

    def on_response_complete(self) -> None:
        self._completing = True
        try:
            super().on_response_complete()  # may start a pipelined request
        finally:
            self._completing = False
        self._unclaim()
        if self._expired and not self.transport.is_closing():
            self.transport.close()
        elif self.home is not None:
            self._go_home()

    def _go_home(self) -> None:
        """Back to the front protocol, when the connection is idle between requests."""
        cycle = self.cycle
        if (
            self.home is None
            or self._feeding
            or not self._between
            or self.pipeline
            or self._claimed is not None
            or self.resume is not None
            or cycle is None
            or not cycle.response_complete
            or self.transport.is_closing()
        ):
            return
        home, self.home = self.home, None
        self._unset_keepalive_if_required()
        self._clock.cancel()
        self.connections.discard(self)
        home(self)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        express = self.express
        if self.resume is not None:
            pass  # the request replayed by the front protocol: it goes on once it is whole
        elif express is None or not express.claim(cycle.scope):
            super()._start_asgi_task(cycle, app)
            return
        if cycle.more_body:
            self._claimed = (cycle, app)  # until its message is complete (or not, for now)
        elif self._completing:
            # a pipelined request, started while the one before it finishes: once that has
            # (whatever it holds, such as an instance's slot, is released after its answer)
            self.loop.call_soon(self._express, cycle, app)
        else:
            self._express(cycle, app)

    # the express lane

    def _express(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        resume, self.resume = self.resume, None
        try:
            if resume is not None:
                coroutine = resume(cycle)
            else:
                assert self.express is not None
                coroutine = self.express.start(cycle, app)
        except Exception as exc:  # answered as uvicorn's own run_asgi would
            log.error("Exception in ASGI application", exc_info=exc)
            if cycle.response_started:
                self.transport.close()
                return
            coroutine = cycle.send_500_response()
        if coroutine is not None:
            task = self.loop.create_task(coroutine)
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

    def _unclaim(self) -> None:
        """A claimed request whose body has not all arrived with the bytes at hand goes the
        ordinary way, which reads a body as it comes (and bounds its time)."""
        claimed, self._claimed = self._claimed, None
        if claimed is not None:
            if self.resume is not None:  # cannot be (the front protocol replays it whole)
                self.resume = None
                self.transport.close()
                return
            super()._start_asgi_task(*claimed)

    # the deadline

    def _deadline_passed(self) -> None:
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._expired = True
        else:
            self.transport.close()


def bounded_protocol(
    limits: ConnectionLimits, express: Express | None = None
) -> type[asyncio.Protocol]:
    """The protocol class for `uvicorn.run(http=...)`, bound to `limits` (and `express`)."""
    attributes = {"limits": limits, "express": express}
    return type(BoundedHttpToolsProtocol.__name__, (BoundedHttpToolsProtocol,), attributes)
