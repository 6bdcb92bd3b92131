"""The send deadline (`NVCF_HTTP_SEND_TIMEOUT`): a caller that reads nothing of its answer
does not hold it, nor the instance slot behind it, for longer. The real server process, a
raw-socket caller and worker (tests/support/framing.py)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from service.core.settings import Settings
from tests.support.framing import WAIT, Served, read_response, served

SIZE = 16 * 1024 * 1024  # far over what the socket buffers on both sides hold


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served(
        tmp_path_factory.mktemp("send-deadline"),
        NVCF_HTTP_SEND_TIMEOUT="0.5",
        NVCF_INVOKE_RESULT_MAX_BYTES=str(4 * SIZE),  # streamed through, not a large result
        NVCF_GRPC_PORT="0",  # (any free one: other servers may run on this machine)
    ) as s:
        yield s


def test_a_caller_reading_nothing_loses_its_answer_and_frees_the_slot(srv: Served) -> None:
    headers = {"x-worker-mode": "big", "x-worker-size": str(SIZE)}
    request = srv.request("POST", srv.pexec, headers=headers, body=b"{}")
    with contextlib.closing(socket.socket()) as caller:
        caller.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        caller.settimeout(WAIT)
        caller.connect(("127.0.0.1", srv.port))
        caller.sendall(request)  # and reads nothing
        with contextlib.closing(srv.connect()) as other:
            # the function's one slot (maxRequestConcurrency 1) serves the next request: the
            # first one's ended once sending it made no progress for 0.5 s
            other.sendall(srv.request("POST", srv.pexec, body=b"{}"))
            assert read_response(other)[0] == 200
        received = 0
        while chunk := caller.recv(1 << 20):  # what was sent before; then the server closed
            received += len(chunk)
        assert 0 < received < SIZE
    # cut as a caller that went away is, not as an application that failed to answer
    assert "ASGI callable returned without completing response" not in srv.log.read_text()


def test_the_send_deadline_defaults_to_a_minute_and_must_be_positive() -> None:
    assert Settings(_env_file=None).http_send_timeout == 60
    with pytest.raises(ValueError, match="http_send_timeout"):
        Settings(_env_file=None, http_send_timeout=0)
