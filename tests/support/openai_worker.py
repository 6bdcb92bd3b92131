"""A real local HTTP server playing an OpenAI-compatible model server (a simulated cluster's
`upstream`), in a thread: it answers `/v1/chat/completions`, `/v1/responses` and
`/v1/embeddings` as the tiny model of service/backends/simulated/llm.py does, over chunked
server-sent events when the body streams. Tests steer it without timing:

- `gate()`: from now on a stream writes its first event at once and each later one only after
  `next_event()` (or `stop()`);
- `requests`: every request as received (path, headers, JSON body);
- a body field `"x_status": NNN` answers that status with an OpenAI error object;
- `"x_force_stream": true` streams the answer although the body did not ask for it;
- `"x_raw": "<text>"` writes that text, as it is, as the answer's `usage` (a stream: in an
  extra chunk before `[DONE]`; with `x_status`: as the whole error body) — JSON a careless
  worker may write (`NaN`, nesting thousands deep).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from service.backends.simulated import llm


@dataclass(frozen=True)
class _Raw:
    """Text written into an answer as it is."""

    text: str


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: Any


class OpenAIWorker:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.streams_closed = 0
        self._lock = threading.Lock()
        self._gated = threading.Event()
        self._events = threading.Semaphore(0)
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> OpenAIWorker:
        worker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                worker._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        for _ in range(10_000):
            self._events.release()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def address(self) -> str:
        assert self._httpd is not None
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def gate(self) -> None:
        self._gated.set()

    def next_event(self) -> None:
        self._events.release()

    # ------------------------------------------------------------------ serving

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        with self._lock:
            self.requests.append(Received(req.path, dict(req.headers.items()), body))
        route = next((p for p in llm.PATHS if req.path.endswith(p)), None)
        try:
            if route is None or not isinstance(body, dict):
                self._json(req, 404, llm.error_body(f"no route {req.path}"))
                return
            usage = body.get("x_raw")
            if isinstance(body.get("x_status"), int):
                error = llm.error_body("as asked")
                self._json(req, body["x_status"], error if usage is None else _Raw(usage))
                return
            if body.get("x_force_stream") is True:
                body = {**body, "stream": True}
            whole, events = llm.answer(route, body)
            if events is None:
                assert whole is not None
                self._json(req, 200, whole if usage is None else {**whole, "usage": _Raw(usage)})
                return
            listed = list(events)
            if usage is not None:
                extra = (
                    f'data: {{"object":"chat.completion.chunk","choices":[],"usage":{usage}}}\n\n'
                )
                listed.insert(len(listed) - 1, extra.encode())
            self._stream(req, listed)
        except OSError:
            pass

    def _json(self, req: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        if isinstance(body, _Raw):
            data = body.text.encode()
        elif isinstance(body, dict) and isinstance(body.get("usage"), _Raw):
            text = json.dumps({**body, "usage": "\x00"}).replace('"\\u0000"', body["usage"].text)
            data = text.encode()
        else:
            data = json.dumps(body).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def _stream(self, req: BaseHTTPRequestHandler, events: list[bytes]) -> None:
        req.send_response(200)
        req.send_header("Content-Type", "text/event-stream")
        req.send_header("Transfer-Encoding", "chunked")
        req.end_headers()
        try:
            for index, event in enumerate(events):
                if index and self._gated.is_set():
                    self._events.acquire(timeout=60)
                    if self._stopping.is_set():
                        return
                req.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                req.wfile.flush()
            req.wfile.write(b"0\r\n\r\n")
            req.wfile.flush()
        except OSError:
            with self._lock:
                self.streams_closed += 1
            raise
