"""A double of Datadog's metrics and logs intakes in a thread: `POST /api/v2/series` as
Datadog's API documents it (a JSON `{"series": [{metric, type, points: [{timestamp, value}],
tags}]}`) and `POST /api/v2/logs` (a JSON list of `{message, ddsource, ddtags, hostname,
service}`), the key in `DD-API-KEY`, answering 202 as Datadog does, or `status` when a test
sets it."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PATH = "/api/v2/series"
LOGS_PATH = "/api/v2/logs"


@dataclass(frozen=True)
class Post:
    path: str
    headers: dict[str, str]
    body: Any


class DatadogIntake:
    def __init__(self) -> None:
        self.posts: list[Post] = []
        self.status = 202
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://{self.hostport}"

    @property
    def hostport(self) -> str:
        assert self._httpd is not None
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> DatadogIntake:
        intake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path not in (PATH, LOGS_PATH):
                    self.send_response(404)
                else:
                    if intake.status < 300:
                        headers = {k.lower(): v for k, v in self.headers.items()}
                        with intake._lock:
                            intake.posts.append(Post(self.path, headers, json.loads(body)))
                    self.send_response(intake.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def series(self, metric: str, tag: str) -> list[dict[str, Any]]:
        """Every series entry of `metric` carrying `tag`, in arrival order."""
        with self._lock:
            posts = list(self.posts)
        return [
            s
            for p in posts
            if p.path == PATH
            for s in p.body["series"]
            if s["metric"] == metric and tag in s["tags"]
        ]

    def logs(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """(headers, entry) of every log entry received, in arrival order."""
        with self._lock:
            posts = list(self.posts)
        return [(p.headers, e) for p in posts if p.path == LOGS_PATH for e in p.body]
