"""The framing regression suite: what a hostile caller or a malicious worker writes never
changes how the next hop reads the stream. Raw sockets against the real server process, a
raw-socket worker of the test's own as the simulated cluster's upstream
(tests/support/framing.py), every invocation entry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.framing import SUFFIX, Served, echoed, served

INJECTED = (
    "x%0D%0ANVCF-NCAID:%20B%0D%0AContent-Length:%200%0D%0A%0D%0A"
    "POST%20/smuggled%20HTTP/1.1%0D%0AX-Pad:%20"
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served(tmp_path_factory.mktemp("framing")) as s:
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
