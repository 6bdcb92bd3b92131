"""A worker on raw sockets, for framing tests: it records the exact bytes of every request it
receives and answers as the request's `x-worker-mode` header says, including answers no
well-behaved HTTP library would write (extra bytes after the body, a short body, a huge
head, a forged status). It runs in a thread as a simulated cluster's `upstream`.

Modes (`x-worker-mode`, default `echo`):

- `echo`: 200 with JSON `{"path", "method", "headers", "body"}` of the request as received;
- `extra`: `Content-Length: 2`, `ok`, then a second whole response in the same write;
- `short`: `Content-Length: 100`, five bytes, then the connection is closed;
- `bighead`: a header value of `x-worker-size` bytes (default 1 MiB);
- `manyheaders`: `x-worker-size` header lines;
- `readclose`: the request is read, then the connection closed without an answer;
- `status:NNN`: a head with that status (e.g. `status:000`, `status:101`), an empty body
  declared by `Content-Length: 0` (or `x-worker-length` bytes);
- `endless`: a 200 with neither length nor chunking, then bytes until the caller goes;
- `reset`: half a status line, then the connection reset;
- `malformed`: bytes that are not HTTP;
- `hold`: the answer waits until `release()` (a 200 then), 30 s at most;
- `trailer`: chunked, `hello`, then a trailer line of `x-worker-size` bytes (`trailer_closed`
  is set once the server stops reading it);
- `trailers`: chunked, `ok`, with the trailer fields `Set-Cookie`, `Location` and
  `X-Request-Id` (one write);
- `forgedid`: a 200 with `X-Request-Id: forged`;
- `badchunk`: a valid chunked head, a chunk, then a chunk-size line that is not hex, in one
  write.
- `big`: a 200 of `x-worker-size` bytes (`Content-Length`), written as fast as they are read.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Received:
    """One request as the worker read it."""

    head: bytes
    body: bytes

    @property
    def request_line(self) -> bytes:
        return self.head.split(b"\r\n", 1)[0]

    @property
    def headers(self) -> list[tuple[str, str]]:
        lines = self.head.split(b"\r\n")[1:]
        out = []
        for line in lines:
            if not line:
                continue
            name, _, value = line.partition(b":")
            out.append((name.decode("latin-1").lower(), value.decode("latin-1").strip()))
        return out

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


@dataclass
class RawWorker:
    requests: list[Received] = field(default_factory=list)
    connections: int = 0
    endless_closed: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    trailer_closed: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> RawWorker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped = True
        self._sock.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self.endless_closed.clear()
            self.released.clear()
            self.trailer_closed.clear()

    def release(self) -> None:
        self.released.set()

    def of_mode(self, mode: str) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if mode in r.header("x-worker-mode")]

    # ------------------------------------------------------------------ serving

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                while len(buf) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                received = Received(head, body)
                with self._lock:
                    self.requests.append(received)
                if not self._answer(conn, received):
                    return
        except OSError:
            return
        finally:
            conn.close()

    def _answer(self, conn: socket.socket, req: Received) -> bool:
        """Answer `req`; False when the connection is to be closed."""
        modes = req.header("x-worker-mode")
        mode = modes[0] if modes else "echo"
        sizes = req.header("x-worker-size")
        size = int(sizes[0]) if sizes else 1 << 20
        if mode == "echo":
            line = req.request_line.decode("latin-1").split(" ")
            doc = {
                "method": line[0],
                "path": line[1] if len(line) > 1 else "",
                "headers": req.headers,
                "body": req.body.decode("latin-1"),
            }
            body = json.dumps(doc).encode()
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            return True
        if mode == "extra":
            forged = b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nforged!"
            second = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(forged), forged)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok" + second)
            return True
        if mode == "short":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello")
            return False
        if mode == "bighead":
            conn.sendall(b"HTTP/1.1 200 OK\r\nx-big: ")
            chunk = b"a" * 65536
            sent = 0
            try:
                while sent < size:
                    conn.sendall(chunk)
                    sent += len(chunk)
                conn.sendall(b"\r\ncontent-length: 0\r\n\r\n")
            except OSError:
                pass
            return False
        if mode == "manyheaders":
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            try:
                for i in range(0, size, 1000):
                    conn.sendall(b"".join(b"x-h%d: v\r\n" % j for j in range(i, i + 1000)))
                conn.sendall(b"content-length: 0\r\n\r\n")
            except OSError:
                pass
            return False
        if mode == "readclose":
            return False
        if mode.startswith("status:"):
            lengths = req.header("x-worker-length")
            length = int(lengths[0]) if lengths else 0
            conn.sendall(
                b"HTTP/1.1 %s Whatever\r\ncontent-length: %d\r\n\r\n%s"
                % (mode[7:].encode(), length, b"x" * length)
            )
            return True
        if mode == "endless":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n")
            try:
                while True:
                    conn.sendall(b"tick\n")
                    time.sleep(0.01)
            except OSError:
                self.endless_closed.set()
            return False
        if mode == "reset":
            conn.sendall(b"HTTP/1.1 2")
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if mode == "malformed":
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            return False
        if mode == "hold":
            self.released.wait(30)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nheld")
            return True
        chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        if mode == "trailer":
            conn.sendall(chunked + b"5\r\nhello\r\n0\r\nx-trailer: ")
            chunk = b"a" * 65536
            try:
                for _ in range(0, size, len(chunk)):
                    conn.sendall(chunk)
                conn.sendall(b"\r\n\r\n")
            except OSError:
                self.trailer_closed.set()
                return False
            return True
        if mode == "trailers":
            trailer = b"set-cookie: s=1\r\nlocation: /elsewhere\r\nx-request-id: forged\r\n\r\n"
            conn.sendall(chunked + b"2\r\nok\r\n0\r\n" + trailer)
            return True
        if mode == "forgedid":
            conn.sendall(b"HTTP/1.1 200 OK\r\nx-request-id: forged\r\ncontent-length: 2\r\n\r\nok")
            return True
        if mode == "badchunk":
            conn.sendall(chunked + b"5\r\nhello\r\nzz\r\n")
            return False
        if mode == "big":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
            piece = b"x" * 65536
            try:
                for start in range(0, size, len(piece)):
                    conn.sendall(piece[: size - start])
            except OSError:
                return False
            return True
        raise AssertionError(f"unknown worker mode {mode!r}")
