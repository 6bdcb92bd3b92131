"""A worker process written as a container for NVCF is: it reads its input assets from
`NVCF-ASSET-DIR`, writes large outputs into `NVCF-LARGE-OUTPUT-DIR` and reports progress in
the `progress` file there (NVCF's worker-utilities format). It runs as its own process
(`python -m tests.support.file_worker PORT`), a simulated cluster's `upstream`.

What it does is chosen per request by `X-Worker-Mode`:

- `assets` (default): 200, JSON of the NVCF-* headers it received and, for every file of its
  asset directory, its size and sha256;
- `output:N`: writes N bytes (`pattern(N)`) to `out/frames.bin` in its output directory, then
  answers 200 with a small JSON;
- `body:N`: answers 200 with a body of N bytes (`pattern(N)`), nothing written;
- `progress`: reports 0 %, then 50 % once the file `50` exists in the directory named by
  `X-Control-Dir`, then 100 % once `100` exists, and answers once `done` exists (the test
  steers it; nothing depends on timing);
- `escape`: tries to hand out a file outside its directories (a symbolic link to
  `X-Secret-Path` in its output directory) and answers 200.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def pattern(size: int) -> bytes:
    """Deterministic bytes that do not repeat within 32 bytes (test and worker agree)."""
    block = hashlib.sha256(str(size).encode()).digest()
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(block + counter.to_bytes(8, "big")).digest()
        counter += 1
    return bytes(out[:size])


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _progress(out: Path, request_id: str, percent: int, partial: Any) -> None:
    tmp = out / ".progress.tmp"
    tmp.write_text(json.dumps({"id": request_id, "progress": percent, "partialResponse": partial}))
    os.replace(tmp, out / "progress")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _answer(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        mode = self.headers.get("X-Worker-Mode", "assets")
        asset_dir = Path(self.headers.get("NVCF-ASSET-DIR", "/nonexistent"))
        out = Path(self.headers.get("NVCF-LARGE-OUTPUT-DIR", "/nonexistent"))
        request_id = self.headers.get("NVCF-REQID", "")
        nvcf = {k.lower(): v for k, v in self.headers.items() if k.lower().startswith("nvcf-")}
        if mode == "assets":
            files = {}
            if asset_dir.is_dir():
                for path in sorted(asset_dir.iterdir()):
                    data = path.read_bytes()
                    files[path.name] = {
                        "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(),
                    }
            report = {"headers": nvcf, "assets": files, "outputDirExists": out.is_dir()}
            self._answer(200, json.dumps(report).encode())
        elif mode.startswith("output:"):
            size = int(mode.split(":", 1)[1])
            (out / "out").mkdir(exist_ok=True)
            (out / "out" / "frames.bin").write_bytes(pattern(size))
            self._answer(200, json.dumps({"wrote": size}).encode())
        elif mode.startswith("body:"):
            self._answer(200, pattern(int(mode.split(":", 1)[1])), "application/octet-stream")
        elif mode == "progress":
            control = Path(self.headers["X-Control-Dir"])
            _progress(out, request_id, 0, {"stage": "start"})
            _wait_for(control / "50")
            _progress(out, request_id, 50, {"stage": "half"})
            _wait_for(control / "100")
            _progress(out, request_id, 100, {"stage": "end"})
            _wait_for(control / "done")
            self._answer(200, json.dumps({"finished": True}).encode())
        elif mode == "escape":
            (out / "stolen").symlink_to(self.headers["X-Secret-Path"])
            self._answer(200, b"{}")
        else:
            self._answer(400, b'{"error": "unknown mode"}')


class FileWorker:
    """The worker process, started and stopped by a test fixture."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.file_worker", "0"],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        assert line.startswith("READY "), line
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
