"""Watching a worker's server-sent events (service/llm/sse.py): events decoded however the
bytes are split, the first token, the usage and the terminal Responses object found, the
relay passing every chunk on unchanged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from service.llm.sse import (
    MAX_USAGE_TOKENS,
    Event,
    SseDecoder,
    StreamWatch,
    Usage,
    collect_terminal,
    relay,
    usage_of,
)

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


def chunk(content: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, object] = {
        "object": "chat.completion.chunk",
        "choices": [] if content is None else [{"index": 0, "delta": {"content": content}}],
    }
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n".encode()


STREAM = (
    b": keep-alive comment\n\n"
    + b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
    + chunk("Hel")
    + chunk("lo")
    + chunk(None, {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9})
    + b"data: [DONE]\n\n"
)


def test_decoder_follows_the_event_stream_rules() -> None:
    decoder = SseDecoder()
    events = decoder.feed(
        b"event: a\r\ndata: one\r\ndata:two\r\n\r\n"  # CRLF, no space after the colon
        b"data: x\rdata: y\r\r"  # bare CR
        b"id: 5\nretry: 10\n\n"  # no data: nothing dispatched
        b"data\n\n"  # a field with no colon: empty data
    )
    assert events == [Event("a", "one\ntwo"), Event("message", "x\ny"), Event("message", "")]
    assert decoder.feed(b"data: unfinished") == []
    assert decoder.feed(b"\n\n") == [Event("message", "unfinished")]


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12))
def test_any_split_of_the_bytes_decodes_the_same(cuts: list[int]) -> None:
    whole = SseDecoder().feed(STREAM)
    decoder = SseDecoder()
    got: list[Event] = []
    last = 0
    for cut in [*sorted(set(cuts)), len(STREAM)]:
        got += decoder.feed(STREAM[last:cut])
        last = cut
    assert got == whole and len(whole) == 5


def test_crlf_split_between_chunks_is_one_line_end() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\r\n") == [Event("message", "a")]


def test_an_event_over_the_bound_is_skipped_and_the_next_one_seen() -> None:
    decoder = SseDecoder(max_event=64)
    events = decoder.feed(b"data: " + b"x" * 100 + b"\n\n" + b"data: small\n\n")
    assert events == [Event("message", "small")]
    assert decoder.feed(b"data: " + b"y" * 50) == []
    assert decoder.feed(b"z" * 50 + b"\n\ndata: next\n\n") == [Event("message", "next")]


def test_usage_in_both_of_openais_shapes() -> None:
    assert usage_of({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}) == Usage(3, 4)
    assert usage_of({"usage": {"input_tokens": 5, "output_tokens": 1}}) == Usage(5, 1)
    assert usage_of({"usage": {"prompt_tokens": 8, "total_tokens": 8}}) == Usage(8, 0)
    assert usage_of({"usage": {"total_tokens": 11}}) == Usage(11, 0)
    no_usage: list[object] = [{}, {"usage": None}, {"usage": {"prompt_tokens": -1}}, [], "x"]
    for none in no_usage:
        assert usage_of(none) is None
    assert usage_of({"usage": {"prompt_tokens": True}}) is None


def test_a_workers_usage_counts_at_most_a_bounded_figure() -> None:
    """A worker's absurd `usage` cannot overflow the counters fed from it (Redis's are 64-bit)."""
    huge = {"usage": {"prompt_tokens": 2**70, "completion_tokens": 2**64, "total_tokens": 2**80}}
    assert usage_of(huge) == Usage(MAX_USAGE_TOKENS, MAX_USAGE_TOKENS)
    assert usage_of({"usage": {"total_tokens": 2**80}}) == Usage(MAX_USAGE_TOKENS, 0)


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_relay_passes_every_chunk_on_and_watches_it() -> None:
    ticks = iter([10.0, 10.5, 11.0])
    watch = StreamWatch(CHAT, started=10.0, clock=lambda: next(ticks))
    parts = [STREAM[:50], STREAM[50:130], STREAM[130:]]
    out = [c async for c in relay(_chunks(*parts), watch)]
    assert out == parts
    assert watch.usage == Usage(7, 2) and watch.done
    assert watch.time_to_first_token == 0.0  # the clock's first tick: the first content


def responses_stream(terminal: str = "response.completed") -> bytes:
    done: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [],
    }
    done["usage"] = {"input_tokens": 4, "output_tokens": 6, "total_tokens": 10}
    events = [
        ("response.created", {"type": "response.created", "response": {"id": "resp_1"}}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Hi"}),
        (terminal, {"type": terminal, "response": done}),
    ]
    return b"".join(f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in events)


async def test_the_terminal_responses_object_is_collected() -> None:
    watch = StreamWatch(RESPONSES)
    terminal = await collect_terminal(_chunks(responses_stream()), watch, limit=1 << 20)
    assert terminal is not None and terminal["id"] == "resp_1"
    assert watch.usage == Usage(4, 6) and watch.first_token is not None
    failed = await collect_terminal(
        _chunks(responses_stream("response.failed")), StreamWatch(RESPONSES), limit=1 << 20
    )
    assert failed is not None and failed["status"] == "completed"
    cut = await collect_terminal(_chunks(responses_stream()[:80]), StreamWatch(RESPONSES), 1 << 20)
    assert cut is None
    over = await collect_terminal(_chunks(responses_stream()), StreamWatch(RESPONSES), limit=10)
    assert over is None
