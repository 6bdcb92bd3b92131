"""The headers that go to the worker and back (invocation/forward.py)."""

from __future__ import annotations

import pytest

from service.invocation.forward import (
    caller_headers,
    header_text,
    request_target_safe,
    worker_request_headers,
)

CALLER = [
    (b"host", b"nvcf"),
    (b"authorization", b"Bearer nvapi-secret"),
    (b"content-type", b"application/json"),
    (b"content-length", b"2"),
    (b"connection", b"keep-alive, x-hop"),
    (b"x-hop", b"dropped: the connection header names it"),
    (b"keep-alive", b"timeout=5"),
    (b"nvcf-function-id", b"forged by the caller"),
    (b"x-trace", b"kept"),
    (b"accept", b"*/*"),
]

WORKER = [
    (b"Content-Type", b"application/json"),
    (b"Date", b"Wed, 02 Dec 2026 00:00:00 GMT"),
    (b"Server", b"worker"),
    (b"Content-Length", b"12"),
    (b"Connection", b"X-Private"),
    (b"X-Private", b"hop"),
    (b"NVCF-REQID", b"forged"),
    (b"X-Upstream", b"yes"),
    (b"Content-Length", b"99"),
]


def test_the_caller_gets_the_workers_headers_without_hop_by_hop_ones_and_the_first_length() -> None:
    headers, length = caller_headers(WORKER)
    assert length == 12
    assert headers == [(b"content-type", b"application/json"), (b"x-upstream", b"yes")]
    assert caller_headers([(b"Content-Type", b"text/event-stream")]) == (
        [(b"content-type", b"text/event-stream")],
        None,
    )


def test_d28_the_workers_request_id_never_reaches_the_caller() -> None:
    """D28: the platform writes X-Request-Id; a worker's would come first and be taken."""
    headers, _ = caller_headers([(b"X-Request-Id", b"forged"), (b"x-kept", b"1")])
    assert headers == [(b"x-kept", b"1")]


def test_the_worker_gets_the_callers_headers_without_credentials_or_nvcf_ones() -> None:
    forwarded = worker_request_headers(CALLER)
    assert forwarded == [
        ("content-type", "application/json"),
        ("x-trace", "kept"),
        ("accept", "*/*"),
    ]


def test_connection_names_strip_only_optional_white_space() -> None:
    caller = [(b"connection", b" x-hop\t, x-other\xa0"), (b"x-hop", b"1"), (b"x-other", b"2")]
    forwarded = dict(worker_request_headers(caller))
    assert "x-hop" not in forwarded  # named (tab and spaces stripped): dropped
    assert forwarded["x-other"] == "2"  # "x-other\xa0" names another header


def test_underscore_spellings_of_dropped_headers_are_dropped() -> None:
    caller = [
        (b"nvcf_ncaid", b"spoofed"),
        (b"NVCF_Function_Id", b"spoofed"),
        (b"content_length", b"9"),
        (b"x_custom_thing", b"kept"),
    ]
    forwarded = worker_request_headers(caller, [("nvcf-ncaid", "A")])
    assert forwarded == [("x_custom_thing", "kept"), ("nvcf-ncaid", "A")]


def test_header_text_keeps_a_value_on_its_line() -> None:
    assert header_text("user-42 (acme)") == "user-42 (acme)"
    assert header_text("a\r\nX-Injected: 1") == "a%0D%0AX-Injected: 1"
    assert header_text("李") == "%E6%9D%8E"


@pytest.mark.parametrize(
    ("target", "safe"),
    [
        ("/v2/orgs/a/nvcf/x%0D%0Ay?q=%20", True),
        ("/x\r\nNVCF-NCAID: B", False),
        ("/x y", False),
        ("/x\x00", False),
        ("/x\x7f", False),
        ("/caf\u00e9", False),
    ],
)
def test_a_worker_request_target_is_printable_ascii_only(target: str, safe: bool) -> None:
    assert request_target_safe(target) is safe
