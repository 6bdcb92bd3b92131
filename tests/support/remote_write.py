"""A Prometheus remote-write receiver in a thread: it takes `POST /api/v1/write` as Prometheus
does (raw snappy, then a `prometheus.WriteRequest`) and decodes the protobuf wire itself with
prompb's field numbers (WriteRequest.timeseries = 1; TimeSeries.labels = 1, samples = 2;
Label.name = 1, value = 2; Sample.value = 1 (double), timestamp = 2 (int64)), independently of
the server's encoder. `status` answers every request with that HTTP status."""

from __future__ import annotations

import ssl
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import cramjam

PATH = "/api/v1/write"


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(data: bytes) -> Iterator[tuple[int, Any]]:
    """(field number, raw value) of each field of a protobuf message: an int for a varint,
    bytes for a length-delimited field, 8 bytes for a fixed64."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            yield number, value
        elif wire == 2:
            size, i = _varint(data, i)
            yield number, data[i : i + size]
            i += size
        elif wire == 1:
            yield number, data[i : i + 8]
            i += 8
        else:
            raise ValueError(f"unexpected wire type {wire}")


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    timestamp_ms: int


def decode(body: bytes) -> list[Sample]:
    """Every sample of a snappy-compressed WriteRequest."""
    out: list[Sample] = []
    for number, series in fields(bytes(cramjam.snappy.decompress_raw(body))):
        assert number == 1
        labels: list[tuple[str, str]] = []
        samples: list[tuple[float, int]] = []
        for n, value in fields(series):
            parts = dict(fields(value))
            if n == 1:
                labels.append((parts.get(1, b"").decode(), parts.get(2, b"").decode()))
            elif n == 2:
                number_value = struct.unpack("<d", parts[1])[0] if 1 in parts else 0.0
                samples.append((number_value, parts.get(2, 0)))
        names = [name for name, _ in labels]
        assert names == sorted(names), f"labels not sorted by name: {names}"
        out.extend(Sample(dict(labels), v, t) for v, t in samples)
    return out


@dataclass(frozen=True)
class Write:
    headers: dict[str, str]
    samples: list[Sample]


class RemoteWriteReceiver:
    """With `tls`, served over HTTPS with that server context (e.g. one requiring clients'
    certificates: a connection without one fails its handshake and writes nothing)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.writes: list[Write] = []
        self.status = 204
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.hostport}{PATH}"

    @property
    def hostport(self) -> str:
        assert self._httpd is not None
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> RemoteWriteReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus serves remote write

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != PATH:
                    self.send_response(404)
                elif receiver.status < 300:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    write = Write(headers, decode(body))
                    with receiver._lock:
                        receiver.writes.append(write)
                    self.send_response(receiver.status)
                else:
                    self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        if self.tls is not None:
            self._httpd.socket = self.tls.wrap_socket(self._httpd.socket, server_side=True)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def samples(self, name: str, **labels: str) -> list[Sample]:
        """Every sample of series `name` whose labels include these, in arrival order."""
        with self._lock:
            writes = list(self.writes)
        return [
            s
            for w in writes
            for s in w.samples
            if s.labels.get("__name__") == name
            and all(s.labels.get(k) == v for k, v in labels.items())
        ]
