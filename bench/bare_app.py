"""The baseline: a bare FastAPI app answering with pre-recorded JSON documents of the same size
as the real server's responses (set by BENCH_BARE_DOCS, a JSON file {name: document})."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response

DOCS: dict[str, bytes] = {
    name: json.dumps(doc, separators=(",", ":")).encode()
    for name, doc in json.loads(Path(os.environ["BENCH_BARE_DOCS"]).read_text()).items()
}

app = FastAPI()


@app.get("/one")
async def one() -> Response:
    return Response(DOCS["one"], media_type="application/json")


@app.get("/list")
async def listing() -> Response:
    return Response(DOCS["list"], media_type="application/json")


@app.post("/create")
async def create(request: Request) -> Response:
    await request.json()
    return Response(DOCS["create"], media_type="application/json")
