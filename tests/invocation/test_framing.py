"""The framing regression suite: what a hostile caller or a malicious worker writes never
changes how the next hop reads the stream. Raw sockets against the real server process, a
raw-socket worker of the test's own as the simulated cluster's upstream
(tests/support/framing.py), every invocation entry."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from tests.support.framing import SUFFIX, WAIT, Served, echoed, read_response, served

INJECTED = (
    "x%0D%0ANVCF-NCAID:%20B%0D%0AContent-Length:%200%0D%0A%0D%0A"
    "POST%20/smuggled%20HTTP/1.1%0D%0AX-Pad:%20"
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served(tmp_path_factory.mktemp("framing"), NVCF_HTTP_BODY_TIMEOUT="1") as s:
        yield s


@pytest.fixture(autouse=True)
def _fresh(srv: Served) -> None:
    srv.worker.clear()


# --- D0: a path reaches the worker as the client encoded it ----------------------------------


def _alias_requests(srv: Served) -> list[tuple[str, dict[str, str]]]:
    by_id = {"function-id": srv.fid}
    by_host = {"Host": f"{srv.fid}.{SUFFIX}"}
    org = f"/v2/orgs/{srv.account}/nvcf/{INJECTED}"
    team = f"/v2/orgs/{srv.account}/teams/t/nvcf/{INJECTED}"
    return [(org, by_id), (team, by_id), (org, by_host), (team, by_host)]


@pytest.mark.parametrize("case", range(4), ids=["org-id", "team-id", "org-host", "team-host"])
def test_d0_alias_path_is_forwarded_encoded_never_decoded(srv: Served, case: int) -> None:
    target, headers = _alias_requests(srv)[case]
    host = headers.pop("Host", None)
    request = srv.request("POST", target, headers={**headers, "x-worker-mode": "echo"}, body=b"{}")
    if host is not None:
        request = request.replace(b"Host: 127.0.0.1", f"Host: {host}".encode())
    status, _, body = srv.exchange(request)
    assert status == 200, body
    got = srv.worker.requests
    assert len(got) == 1, [r.head for r in got]  # nothing smuggled after it
    assert got[0].request_line == f"POST {target} HTTP/1.1".encode()
    assert got[0].header("nvcf-ncaid") == [srv.account]  # the platform's, not the caller's
    assert echoed(body)["path"] == target
    assert not any(r.request_line.startswith(b"POST /smuggled") for r in got)


# --- the worker's side, through every entry ----------------------------------------------

ENTRIES = ["pexec", "transparent", "alias"]


def _invoke(srv: Served, entry: str, mode: str, **headers: str) -> bytes:
    """An invocation through `entry` whose worker answers as `mode` says."""
    sent = {"x-worker-mode": mode, "Content-Type": "application/json", **headers}
    if entry == "pexec":
        return srv.request("POST", srv.pexec, headers=sent, body=b"{}")
    if entry == "transparent":
        return srv.request("POST", "/run", headers={**sent, "function-id": srv.fid}, body=b"{}")
    alias = f"/v2/orgs/{srv.account}/nvcf/run"
    return srv.request("POST", alias, headers={**sent, "function-id": srv.fid}, body=b"{}")


@pytest.mark.parametrize("entry", ENTRIES)
def test_d1_bytes_past_the_end_of_an_answer_never_reach_the_next_request(
    srv: Served, entry: str
) -> None:
    with contextlib.closing(srv.connect()) as sock:
        # the invocation and a request after it, pipelined on one kept-alive connection
        sock.sendall(_invoke(srv, entry, "extra") + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = read_response(sock)
        assert (status, body, headers["content-length"]) == (200, b"ok", "2")
        status, _, body = read_response(sock)
        assert status == 200 and b"forged" not in body and json.loads(body)["status"]
    # the worker connection that carried the extra bytes is not used again
    before = srv.worker.connections
    status, _, _ = srv.exchange(_invoke(srv, entry, "echo"))
    assert status == 200 and srv.worker.connections == before + 1


@pytest.mark.parametrize("entry", ENTRIES)
def test_d2_a_worker_failing_after_its_head_closes_the_callers_connection(
    srv: Served, entry: str
) -> None:
    with contextlib.closing(srv.connect()) as sock:
        sock.sendall(_invoke(srv, entry, "short"))
        data = b""
        while chunk := sock.recv(65536):  # to the end of the stream: never a timeout
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"content-length: 100" in head.lower()
    assert body == b"hello"  # five bytes of a hundred, then the connection closed


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("mode", ["bighead", "manyheaders"])
def test_d3_a_worker_answer_head_over_its_bounds_is_a_502(
    srv: Served, entry: str, mode: str
) -> None:
    size = str(100 << 20) if mode == "bighead" else "1000000"
    status, headers, body = srv.exchange(_invoke(srv, entry, mode, **{"x-worker-size": size}))
    assert status == 502, body
    assert headers["nvcf-status"] == "errored"
    # other invocations go on
    assert srv.exchange(_invoke(srv, entry, "echo"))[0] == 200


def test_d5_a_request_the_worker_may_have_read_is_never_sent_again(srv: Served) -> None:
    with contextlib.closing(srv.connect()) as sock:
        sock.sendall(_invoke(srv, "pexec", "echo"))  # leaves a kept-alive worker connection
        assert read_response(sock)[0] == 200
        sock.sendall(_invoke(srv, "pexec", "readclose"))  # read on it, then closed unanswered
        status, headers, _ = read_response(sock)
    assert status == 502 and headers["nvcf-status"] == "errored"
    assert len(srv.worker.of_mode("readclose")) == 1


def test_d6_underscore_spellings_of_platform_headers_are_dropped(srv: Served) -> None:
    sent = {"nvcf_ncaid": "spoofed", "NVCF_FUNCTION_ID": "spoofed", "x_kept": "1"}
    status, _, body = srv.exchange(_invoke(srv, "pexec", "echo", **sent))
    assert status == 200
    names = [name for name, _ in echoed(body)["headers"]]
    assert "nvcf_ncaid" not in names and "nvcf_function_id" not in names
    assert "x_kept" in names
    assert srv.worker.requests[-1].header("nvcf-ncaid") == [srv.account]


def test_d10_a_late_pexec_body_has_one_body_deadline(srv: Served) -> None:
    with contextlib.closing(srv.connect()) as sock:
        head = srv.request("POST", srv.pexec, headers={"Content-Type": "application/json"})
        sock.sendall(head.replace(b"Content-Length: 0", b"Content-Length: 100"))
        status = None
        for _ in range(40):  # 2 bytes every 0.25 s: 10 s at most, the deadline is 1 s
            try:
                sock.sendall(b"  ")
            except OSError:
                break
            time.sleep(0.25)
            sock.setblocking(False)
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                data = b""
            finally:
                sock.setblocking(True)
                sock.settimeout(WAIT)
            if data:
                status = int(data.split(b" ", 2)[1])
                break
    assert status == 408


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("code", ["000", "600", "999", "101"])
def test_d11_a_worker_status_outside_200_to_599_is_a_502(
    srv: Served, entry: str, code: str
) -> None:
    status, headers, _ = srv.exchange(_invoke(srv, entry, f"status:{code}"))
    assert status == 502 and headers["nvcf-status"] == "errored"


@pytest.mark.parametrize("code", [204, 304])
def test_d11_no_body_framing_on_204_and_304(srv: Served, code: int) -> None:
    with contextlib.closing(srv.connect()) as sock:
        sock.sendall(_invoke(srv, "pexec", f"status:{code}", **{"x-worker-length": "5"}))
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head = data.partition(b"\r\n\r\n")[0].lower()
        assert head.startswith(b"http/1.1 %d" % code)
        assert b"content-length" not in head and b"transfer-encoding" not in head
        # the connection goes on with the next request, answered in order
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = read_response(sock)
        assert status == 200 and json.loads(body)["status"]


def test_d15_a_caller_gone_mid_stream_with_a_pipelined_request_frees_the_slot(
    srv: Served,
) -> None:
    sock = srv.connect()
    sock.sendall(_invoke(srv, "pexec", "endless"))
    data = b""
    while b"tick" not in data:
        data += sock.recv(65536)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # pipelined behind the stream
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # the caller goes away
    assert srv.worker.endless_closed.wait(WAIT)  # the worker's stream is given up
    # the one instance (maxRequestConcurrency 1) is free again: the next request is served
    assert srv.exchange(_invoke(srv, "pexec", "echo"))[0] == 200


# --- the caller's side: a request head is bounded -----------------------------------------


@pytest.mark.parametrize("route", ["/health", "/v2/nvcf/functions", "pexec"])
def test_d4_a_request_head_over_its_bounds_is_a_431(srv: Served, route: str) -> None:
    target = srv.pexec if route == "pexec" else route
    with contextlib.closing(srv.connect()) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nX-Big: ".encode())
        status = None
        try:
            for _ in range(2000):  # 128 MiB at most; the bound is 64 KiB
                sock.sendall(b"a" * 65536)
        except OSError:
            pass
        status, headers, body = read_response(sock)
    assert status == 431 and headers["content-type"] == "application/problem+json"
    assert json.loads(body)["status"] == 431
    many = "".join(f"X-H{i}: v\r\n" for i in range(500))
    status, _, _ = srv.exchange(f"GET {target} HTTP/1.1\r\nHost: x\r\n{many}\r\n".encode())
    assert status == 431
    assert srv.exchange(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200


# --- the caller's side: an ambiguous request is refused, never guessed at ---------------

AMBIGUOUS = {
    "cl-and-te": b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two-lengths": b"Content-Length: 2\r\nContent-Length: 4\r\n\r\n{}{}",
    "obs-fold": b"X-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
    "bare-lf": b"X-A: 1\nContent-Length: 2\r\n\r\n{}",
    "space-before-colon": b"Content-Length : 2\r\n\r\n{}",
    "bad-chunk-size": b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(AMBIGUOUS))
@pytest.mark.parametrize("entry", ["pexec", "transparent", "api"])
def test_an_ambiguously_framed_request_is_a_400_and_closed(
    srv: Served, case: str, entry: str
) -> None:
    if entry == "pexec":
        line = f"POST {srv.pexec} HTTP/1.1\r\nHost: x\r\n"
    elif entry == "transparent":
        line = f"POST /run HTTP/1.1\r\nHost: x\r\nfunction-id: {srv.fid}\r\n"
    else:
        line = "POST /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\n"
    head = f"{line}Authorization: Bearer {srv.key}\r\n".encode()
    with contextlib.closing(srv.connect()) as sock:
        sock.sendall(head + AMBIGUOUS[case] + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):  # to the end: the server closes the connection
            data += chunk
    assert data.startswith(b"HTTP/1.1 400"), data[:200]
    assert data.count(b"HTTP/1.1 ") == 1  # nothing after it was read as a request
    assert not srv.worker.requests  # nothing reached the worker


def test_a_pipelined_connection_mixing_invocations_and_api_requests_is_answered_in_order(
    srv: Served,
) -> None:
    auth = {"Authorization": f"Bearer {srv.manager}"}  # `key` may only invoke
    requests = [
        _invoke(srv, "pexec", "echo"),
        srv.request("GET", "/v2/nvcf/functions", headers=auth, auth=False),
        _invoke(srv, "transparent", "echo"),
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        _invoke(srv, "alias", "echo"),
        srv.request("GET", f"/v2/nvcf/functions/{srv.fid}/versions", headers=auth, auth=False),
    ]
    with contextlib.closing(srv.connect()) as sock:
        sock.sendall(b"".join(requests))  # all at once, on one kept-alive connection
        answers = [read_response(sock) for _ in requests]
    statuses = [status for status, _, _ in answers]
    assert statuses == [200] * 6
    invocations = [answers[i][1] for i in (0, 2, 4)]
    assert all(h["nvcf-status"] == "fulfilled" for h in invocations)
    assert json.loads(answers[1][2])["functions"]  # the API's own answers, in their places
    assert json.loads(answers[3][2])["status"]
    assert all(v["id"] == srv.fid for v in json.loads(answers[5][2])["functions"])


# --- round 3: what follows a worker answer's head ----------------------------------------


def _to_the_end(sock: socket.socket) -> bytes:
    """Everything the server writes until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize("entry", ENTRIES)
def test_d18_a_worker_answers_trailer_over_the_head_bound_ends_the_request(
    srv: Served, entry: str
) -> None:
    """D18: a chunked answer whose trailer goes on past NVCF_INVOKE_WORKER_MAX_HEAD_BYTES is
    not read to its end: 502 when nothing was sent yet, else the caller's connection is
    closed before the answer's end; the worker connection is dropped."""
    request = _invoke(srv, entry, "trailer", **{"x-worker-size": str(32 << 20)})
    with contextlib.closing(srv.connect()) as sock:
        sock.sendall(request)
        data = _to_the_end(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    if head.startswith(b"HTTP/1.1 502"):
        assert b"nvcf-status: errored" in head.lower()
    else:  # the head had gone out: the answer is cut, never ended as if whole
        assert head.startswith(b"HTTP/1.1 200") and b"hello" in body
        assert not body.endswith(b"0\r\n\r\n")
    assert srv.worker.trailer_closed.wait(WAIT)  # the server stopped reading it
    before = srv.worker.connections
    assert srv.exchange(_invoke(srv, entry, "echo"))[0] == 200
    assert srv.worker.connections == before + 1  # never reused


def _raw_head(srv: Served, request: bytes) -> list[tuple[bytes, bytes]]:
    """The header lines (lower-cased names) of the answer to `request`, duplicates kept."""
    with contextlib.closing(srv.connect()) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
    lines = data.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]
    return [(n.strip().lower(), v.strip()) for n, _, v in (x.partition(b":") for x in lines)]


@pytest.mark.parametrize("entry", ENTRIES)
def test_d23_worker_trailers_never_reach_the_caller_as_headers(srv: Served, entry: str) -> None:
    """D23: trailer fields of a worker's answer are dropped."""
    head = _raw_head(srv, _invoke(srv, entry, "trailers"))
    names = [name for name, _ in head]
    assert b"set-cookie" not in names and b"location" not in names
    assert (b"x-request-id", b"forged") not in head


@pytest.mark.parametrize("entry", ENTRIES)
def test_d28_the_caller_gets_the_platforms_request_id_only(srv: Served, entry: str) -> None:
    """D28: a worker's X-Request-Id is dropped; the platform's is the one."""
    head = _raw_head(srv, _invoke(srv, entry, "forgedid"))
    ids = [value for name, value in head if name == b"x-request-id"]
    assert len(ids) == 1 and ids != [b"forged"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_worker_answer_broken_in_its_heads_own_read_is_a_502(srv: Served, entry: str) -> None:
    """A valid head and bad chunk framing in one read: 502, not a 200 head and a reset."""
    status, headers, body = srv.exchange(_invoke(srv, entry, "badchunk"))
    assert status == 502, body
    assert headers["nvcf-status"] == "errored"
    assert headers["content-type"] == "application/problem+json"


def test_cutting_a_broken_answer_is_logged_as_what_it_is_not_as_an_app_error(
    srv: Served,
) -> None:
    """A worker answer cut short after its head closes the caller's connection as designed:
    the server logs why, never uvicorn's `ASGI callable returned without completing
    response` error."""
    start = len(srv.log.read_bytes())
    with contextlib.closing(srv.connect()) as sock:
        sock.sendall(_invoke(srv, "pexec", "short"))
        assert _to_the_end(sock).endswith(b"hello")
    # the invocation's call has returned once a later request is logged after its own line
    assert srv.exchange(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200

    def since() -> str:
        return srv.log.read_bytes()[start:].decode()

    deadline = time.monotonic() + WAIT
    while "GET /health" not in since().partition("the worker's answer broke off")[2]:
        assert time.monotonic() < deadline, since()
        time.sleep(0.05)
    assert "ASGI callable returned without completing response" not in since()


def test_cutting_a_broken_answer_with_a_request_queued_behind_it_frees_the_slot(
    srv: Served,
) -> None:
    """The cut of a broken answer returns (and frees the instance's slot) even when a
    pipelined request waits behind it on the caller's connection."""
    with contextlib.closing(srv.connect()) as sock:
        pipelined = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        sock.sendall(_invoke(srv, "pexec", "short") + pipelined)
        data = _to_the_end(sock)
    assert data.endswith(b"hello") and data.count(b"HTTP/1.1 ") == 1
    # the one instance (maxRequestConcurrency 1) is free again: the next request is served
    assert srv.exchange(_invoke(srv, "pexec", "echo"))[0] == 200
