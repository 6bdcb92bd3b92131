"""Each way an invocation can fail, through each entry (pexec, exec, transparent mode, an org
alias): the same status, NVCF headers and problem every time, and the instance's one slot
(maxRequestConcurrency 1) free afterwards. The real server process, a raw-socket worker as
the simulated cluster's upstream (tests/support/framing.py)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support.framing import WAIT, Served, read_response, served

ENTRIES = ["pexec", "exec", "transparent", "alias"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served(
        tmp_path_factory.mktemp("failures"),
        NVCF_INVOKE_QUEUE_MAX="1",
        NVCF_INVOKE_QUEUE_TIMEOUT_SECONDS="1",
        NVCF_INVOKE_WORKER_TIMEOUT_SECONDS="2",
    ) as s:
        yield s


@pytest.fixture(scope="module")
def others(srv: Served) -> dict[str, tuple[str, str]]:
    """Functions of the same account: rate limited (one a minute), never deployed, and
    deployed where every connection to the worker is refused."""
    return {
        "limited": srv.deploy(rateLimit={"rateLimit": "1-M"}),
        "undeployed": srv.deploy(deploy=False),
        "dead": srv.deploy(group="dead"),
    }


@pytest.fixture(autouse=True)
def _fresh(srv: Served) -> Iterator[None]:
    srv.worker.clear()
    yield
    srv.worker.release()


def request(srv: Served, entry: str, mode: str, fn: tuple[str, str] | None = None) -> bytes:
    """An invocation of `fn` (default: the fixture's function) through `entry`, whose worker
    answers as `mode` says."""
    fid, vid = fn or (srv.fid, srv.vid)
    headers = {"x-worker-mode": mode, "Content-Type": "application/json"}
    if entry == "pexec":
        return srv.request(
            "POST", f"/v2/nvcf/pexec/functions/{fid}/versions/{vid}", headers=headers, body=b"{}"
        )
    if entry == "exec":
        body = json.dumps({"requestBody": {}}).encode()
        return srv.request(
            "POST", f"/v2/nvcf/exec/functions/{fid}/versions/{vid}", headers=headers, body=body
        )
    routing = {**headers, "function-id": fid, "function-version-id": vid}
    path = "/run" if entry == "transparent" else f"/v2/orgs/{srv.account}/nvcf/run"
    return srv.request("POST", path, headers=routing, body=b"{}")


def answer(srv: Served, raw: bytes) -> tuple[int, str, dict[str, Any] | bytes]:
    """(status, NVCF-STATUS, the problem without its per-request members, or the body)."""
    status, headers, body = srv.exchange(raw)
    return status, headers.get("nvcf-status", ""), shape(headers, body)


def shape(headers: dict[str, str], body: bytes) -> dict[str, Any] | bytes:
    if not headers.get("content-type", "").startswith("application/"):
        return body
    doc = json.loads(body)
    if "response" in doc and isinstance(doc["response"], dict):  # exec: the problem within
        doc = doc["response"]
    return {k: doc.get(k) for k in ("type", "title", "status") if k in doc}


def queue_depth(srv: Served) -> int:
    with httpx.Client(
        base_url=f"http://127.0.0.1:{srv.port}",
        headers={"Authorization": f"Bearer {srv.manager}"},
    ) as api:
        resp = api.get(f"/v2/nvcf/queues/functions/{srv.fid}/versions/{srv.vid}")
        assert resp.status_code == 200, resp.text
        return int(resp.json()["queues"][0]["queueDepth"])


def until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, "the condition was not met in time"
        time.sleep(0.02)


def slot_is_free(srv: Served, entry: str) -> None:
    """The function's one instance serves the next request (queue timeout 1 s: a held slot
    would make it a 503)."""
    assert answer(srv, request(srv, entry, "echo"))[0] == 200


@contextlib.contextmanager
def holding(srv: Served, entry: str) -> Iterator[Future[tuple[int, str, Any]]]:
    """A request held at the worker, occupying the instance's one slot."""
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(answer, srv, request(srv, entry, "hold"))
        until(lambda: len(srv.worker.of_mode("hold")) == 1)
        try:
            yield held
        finally:
            srv.worker.release()
            held.result()


def _same_everywhere(results: dict[str, tuple[int, str, Any]]) -> None:
    statuses = {(status, word) for status, word, _ in results.values()}
    assert len(statuses) == 1, results
    problems = [body for entry, (_, _, body) in results.items() if entry != "exec"]
    assert all(p == problems[0] for p in problems), results


# --- the worker's failures ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "status"),
    [("reset", 502), ("malformed", 502), ("hold", 504), ("status:503", 503)],
    ids=["resets-mid-answer", "malformed", "times-out", "answers-5xx"],
)
def test_a_worker_failure_is_answered_alike_through_every_entry(
    srv: Served, mode: str, status: int
) -> None:
    results = {}
    for entry in ENTRIES:
        results[entry] = answer(srv, request(srv, entry, mode))
        slot_is_free(srv, entry)
    _same_everywhere(results)
    assert results["pexec"][:2] == (status, "errored")


def test_a_refusing_worker_is_a_502_through_every_entry(
    srv: Served, others: dict[str, tuple[str, str]]
) -> None:
    results = {e: answer(srv, request(srv, e, "echo", others["dead"])) for e in ENTRIES}
    _same_everywhere(results)
    assert results["pexec"][:2] == (502, "errored")


def test_a_caller_hanging_up_mid_stream_frees_the_slot(srv: Served) -> None:
    for entry in ("pexec", "transparent", "alias"):  # (exec answers whole: never a stream)
        srv.worker.clear()
        sock = srv.connect()
        sock.sendall(request(srv, entry, "endless"))
        data = b""
        while b"tick" not in data:
            data += sock.recv(65536)
        sock.close()
        assert srv.worker.endless_closed.wait(WAIT)
        slot_is_free(srv, entry)


# --- the plane's refusals -------------------------------------------------------------------


def test_queue_full_is_a_429_through_every_entry(srv: Served) -> None:
    results = {}
    for entry in ENTRIES:
        with holding(srv, entry), ThreadPoolExecutor(1) as pool:
            queued = pool.submit(answer, srv, request(srv, entry, "echo"))
            until(lambda: queue_depth(srv) == 1)
            results[entry] = answer(srv, request(srv, entry, "echo"))
            srv.worker.release()
            assert queued.result()[0] == 200  # the queued one is served once the slot frees
        srv.worker.clear()
        slot_is_free(srv, entry)
    _same_everywhere(results)
    assert results["pexec"][:2] == (429, "errored")


def test_queue_timeout_is_a_503_through_every_entry(srv: Served) -> None:
    results = {}
    for entry in ENTRIES:
        with holding(srv, entry):
            results[entry] = answer(srv, request(srv, entry, "echo"))  # waits 1 s, then 503
        srv.worker.clear()
        slot_is_free(srv, entry)
    _same_everywhere(results)
    assert results["pexec"][:2] == (503, "errored")


def test_rate_limited_is_a_429_through_every_entry(
    srv: Served, others: dict[str, tuple[str, str]]
) -> None:
    assert answer(srv, request(srv, "pexec", "echo", others["limited"]))[0] == 200
    results = {e: answer(srv, request(srv, e, "echo", others["limited"])) for e in ENTRIES}
    _same_everywhere(results)
    assert results["pexec"][:2] == (429, "errored")


def test_a_version_not_invocable_is_a_400_through_every_entry(
    srv: Served, others: dict[str, tuple[str, str]]
) -> None:
    results = {e: answer(srv, request(srv, e, "echo", others["undeployed"])) for e in ENTRIES}
    _same_everywhere(results)
    assert results["pexec"][:2] == (400, "errored")
    assert not srv.worker.requests


def test_status_of_each_answer_is_read_from_a_kept_alive_connection(srv: Served) -> None:
    """Failures and successes, pipelined on one connection, come back in order."""
    with contextlib.closing(srv.connect()) as sock:
        sock.sendall(
            request(srv, "pexec", "status:503")
            + request(srv, "transparent", "echo")
            + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        assert [read_response(sock)[0] for _ in range(3)] == [503, 200, 200]
