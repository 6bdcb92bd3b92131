"""A real local HTTP server playing an inference worker (a simulated cluster's `upstream`, or
the endpoint behind the fake API server's service proxy), in a thread.

Every request is answered with JSON `{"echo": <body>, "path": ..., "method": ...,
"headers": {<NVCF-* headers>}, "upstream": true}`. Tests steer it without timing:

- `hold()`: from now on requests wait (after being counted in `arrived`) until `release()`;
- `Accept: text/event-stream`: the answer is a chunked event stream; event i+1 is written
  only once `next_event()` was called i+1 times (the first event goes out at once);
- `X-Upstream-Status: NNN`: answer with that status;
- `X-Upstream-Trickle: N` (or `"x_upstream_trickle": N` in a JSON body, for entries that
  forward a fixed set of headers, as the LLM gateway does): the answer declares
  `Content-Length: N`, then its bytes trickle (a few at a time: `trickling` is set) until the
  connection breaks (`trickle_cut` is set);
- `X-Upstream-Size: N`: the answer is N bytes (`Content-Length`), written as fast as they are
  read;
- per function version (its `NVCF-FUNCTION-VERSION-ID`): `fail_every[version] = n` answers
  every n-th request of that version 500 (n = 5: one in five fails), `delay[version] = s`
  answers its requests after s seconds (a slow version).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class UpstreamServer:
    def __init__(self) -> None:
        self.arrived = 0
        self.paths: list[str] = []
        self._cond = threading.Condition()
        self._open = threading.Event()
        self._open.set()
        self._events = threading.Semaphore(0)
        #: a trickled answer's head is out, and its connection broke
        self.trickling = threading.Event()
        self.trickle_cut = threading.Event()
        self.fail_every: dict[str, int] = {}
        self.delay: dict[str, float] = {}
        self._seen: dict[str, int] = {}
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> UpstreamServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                server._handle(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                return None

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False
            request_queue_size = 256

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()
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

    # ------------------------------------------------------------------ controls

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def next_event(self) -> None:
        self._events.release()

    # ------------------------------------------------------------------ serving

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        with self._cond:
            self.arrived += 1
            self.paths.append(req.path)
            self._cond.notify_all()
        self._open.wait(timeout=60)
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        echo = {
            "echo": body,
            "path": req.path,
            "method": req.command,
            "headers": {k: v for k, v in req.headers.items() if k.lower().startswith("nvcf-")},
            "upstream": True,
        }
        status = int(req.headers.get("X-Upstream-Status") or 200)
        version = req.headers.get("NVCF-FUNCTION-VERSION-ID", "")
        with self._cond:
            seen = self._seen[version] = self._seen.get(version, 0) + 1
        every = self.fail_every.get(version)
        if every and seen % every == 0:
            status = 500
        if version in self.delay:
            time.sleep(self.delay[version])
        try:
            trickle = req.headers.get("X-Upstream-Trickle")
            if trickle is None and isinstance(body, dict):
                trickle = body.get("x_upstream_trickle")
            if trickle:
                self._trickle(req, status, int(trickle))
                return
            if req.headers.get("X-Upstream-Size"):
                size = int(req.headers["X-Upstream-Size"])
                req.send_response(status)
                req.send_header("Content-Type", "application/octet-stream")
                req.send_header("Content-Length", str(size))
                req.end_headers()
                piece = b"x" * 65536
                for start in range(0, size, len(piece)):
                    req.wfile.write(piece[: size - start])
                return
            if "text/event-stream" in (req.headers.get("Accept") or ""):
                self._stream(req, status, echo)
                return
            data = json.dumps(echo).encode()
            req.send_response(status)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(data)))
            req.send_header("X-Upstream", "yes")
            req.end_headers()
            req.wfile.write(data)
        except OSError:
            pass

    def _trickle(self, req: BaseHTTPRequestHandler, status: int, declared: int) -> None:
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(declared))
        req.end_headers()
        req.wfile.flush()
        self.trickling.set()
        try:
            for _ in range(declared // 10):
                req.wfile.write(b" " * 10)
                req.wfile.flush()
                time.sleep(0.02)
        except OSError:
            self.trickle_cut.set()

    def _stream(self, req: BaseHTTPRequestHandler, status: int, echo: dict[str, Any]) -> None:
        req.send_response(status)
        req.send_header("Content-Type", "text/event-stream")
        req.send_header("Transfer-Encoding", "chunked")
        req.end_headers()
        count = int(req.headers.get("X-Upstream-Events") or 3)
        for index in range(count):
            if index:
                self._events.acquire(timeout=60)
            chunk = f"data: {json.dumps({'index': index, **echo})}\n\n".encode()
            req.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            req.wfile.flush()
        req.wfile.write(b"0\r\n\r\n")
        req.wfile.flush()
