"""The LLM gateway's routing decisions (service/llm/routing.py): which requests are the
gateway's, the model a request names, whether the model serves the path, sessions and the
instance each routing method chooses."""

from __future__ import annotations

import random
import uuid
from collections import Counter

import pytest

from service.llm.errors import OpenAIError
from service.llm.routing import (
    Candidate,
    ModelRef,
    RoundRobin,
    Session,
    check_target,
    choose,
    gateway_path,
    is_llm_host,
    parse_model,
    route_error,
    routing_method,
    session_of,
)

FID = uuid.UUID("7f0c9c5e-3a43-4d55-8a5e-6a3b1f0e9d21")
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
MODELS = [
    {"name": "chat", "llmConfig": {"uris": [CHAT, RESPONSES]}},
    {"name": "meta/llama-3", "llmConfig": {"uris": [EMBEDDINGS], "routingMethod": "Round_Robin"}},
]


@pytest.mark.parametrize(
    ("host", "suffix", "expected"),
    [
        ("llm.invocation.localhost", "invocation.localhost", True),
        ("LLM.Invocation.Localhost:8080", "invocation.localhost", True),
        ("llm.invocation.localhost.", "invocation.localhost", True),
        ("llm.other.example", "invocation.localhost", False),
        ("llm.anything.example:443", None, True),
        ("llm", None, False),
        ("llm:8000", None, False),
        ("api.invocation.localhost", "invocation.localhost", False),
        (f"{FID}.invocation.localhost", "invocation.localhost", False),
        ("[::1]:8000", None, False),
        ("", None, False),
    ],
)
def test_the_llm_host_is_llm_dot_the_invoke_suffix(
    host: str, suffix: str | None, expected: bool
) -> None:
    assert is_llm_host(host, suffix) is expected


def test_gateway_paths_by_prefix_on_any_host_or_as_they_are_on_the_llm_host() -> None:
    assert gateway_path("/v2/nvcf/llm/v1/chat/completions", "localhost:8000", "x.y") == CHAT
    assert gateway_path("/v2/nvcf/llm", "localhost", None) == "/"
    assert gateway_path("/v2/nvcf/llmx/v1/models", "localhost", None) is None
    assert gateway_path("/v1/models", "llm.x.y", "x.y") == "/v1/models"
    assert gateway_path("/v1/models", "localhost", "x.y") is None
    assert gateway_path("/v2/nvcf/functions", "llm.x.y", "x.y") == "/v2/nvcf/functions"


def test_unknown_routes_and_methods_are_openai_404_and_405() -> None:
    assert route_error(CHAT, "POST") is None
    assert route_error("/v1/models", "GET") is None
    assert route_error("/v1/models/", "GET") is None
    missing = route_error("/v1/completions", "POST")
    assert missing is not None and missing.status == 404
    assert "POST /v1/chat/completions" in missing.message
    wrong = route_error(CHAT, "GET")
    assert wrong is not None and wrong.status == 405 and wrong.headers == {"Allow": "POST"}
    body = wrong.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]


def test_model_is_function_id_slash_model_name() -> None:
    assert parse_model(f"{FID}/meta/llama-3") == ModelRef(FID, "meta/llama-3")
    assert parse_model(f"{FID}/meta/llama-3").id == f"{FID}/meta/llama-3"
    for bad in ("gpt-4o", f"{FID}", f"{FID}/", "not-a-uuid-at-all-but-36-characters-/m", "/m"):
        with pytest.raises(OpenAIError) as info:
            parse_model(bad)
        assert info.value.status == 404
        assert info.value.code == "model_not_found" and info.value.param == "model"
        assert f"`{bad}`" in info.value.message


def test_the_target_must_be_an_llm_function_model_declaring_the_path() -> None:
    assert check_target("LLM", MODELS, ModelRef(FID, "chat"), CHAT) == MODELS[0]["llmConfig"]
    cases = [
        ("DEFAULT", ModelRef(FID, "chat"), CHAT, "model_not_found", "not an LLM function"),
        ("LLM", ModelRef(FID, "ghost"), CHAT, "model_not_found", "has no model 'ghost'"),
        ("LLM", ModelRef(FID, "chat"), EMBEDDINGS, "unsupported_endpoint", "does not serve"),
    ]
    for kind, ref, path, code, words in cases:
        with pytest.raises(OpenAIError) as info:
            check_target(kind, MODELS, ref, path)
        assert info.value.status == 404 and info.value.code == code
        assert words in info.value.message


def test_routing_methods_are_canonical_with_aliases_resolved() -> None:
    assert routing_method(MODELS[1]["llmConfig"]) == "round-robin"  # type: ignore[arg-type]
    assert routing_method({}) == "power-of-two"
    assert routing_method({"routingMethod": " "}) == "power-of-two"
    assert routing_method({"routingMethod": "groq_multiregion"}) == "wait-and-widen"
    assert routing_method({"routingMethod": "pulsar-multiregion"}) == "pulsar-wait-and-widen"


def test_sessions_follow_nvcf_precedence_per_endpoint() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    chat = {"messages": messages, "prompt_cache_key": "conv-1"}
    assert session_of(CHAT, chat, "hdr") == Session("conv-1", "prompt_cache_key")
    assert session_of(CHAT, {"messages": messages}, "hdr") == Session("hdr", SESSION)
    by_hash = session_of(CHAT, {"messages": messages}, None)
    assert by_hash is not None and by_hash.source == "hash"
    # later turns of the conversation keep its opening, hence its session
    longer = session_of(CHAT, {"messages": [*messages, {"role": "user", "content": "more"}]}, None)
    assert longer == by_hash
    responses = {"input": "hello", "conversation": {"id": "c-9"}}
    assert session_of(RESPONSES, responses, "hdr") == Session("c-9", "conversation.id")
    assert session_of(RESPONSES, {"input": "x", "conversation": "c-7"}, None) == Session(
        "c-7", "conversation.id"
    )
    assert session_of(RESPONSES, {"input": "x", "prompt_cache_key": ""}, "h") == Session(
        "h", SESSION
    )
    assert session_of(EMBEDDINGS, {"input": "x", "prompt_cache_key": "k"}, "h") is None
    assert session_of(RESPONSES, {}, None) is None


SESSION = "x-multi-turn-session-id"


def test_a_key_sent_back_in_the_header_keeps_the_session() -> None:
    for raw in ("plain-key", "ünïcode key ☃"):
        first = session_of(CHAT, {"messages": [{}], "prompt_cache_key": raw}, None)
        assert first is not None
        first.id.encode("latin-1")  # always a valid header value
        again = session_of(CHAT, {"messages": [{"content": "other"}]}, first.id)
        assert again is not None and again.affinity == first.affinity


def test_a_bad_session_header_is_an_openai_400() -> None:
    for bad in ("a" * 257, "tab\there"):
        with pytest.raises(OpenAIError) as info:
            session_of(CHAT, {"messages": [{}]}, bad)
        assert info.value.status == 400 and info.value.param == SESSION


THREE = [Candidate("i-a"), Candidate("i-b"), Candidate("i-c")]


def test_a_session_sticks_to_one_of_three_instances_and_sessions_spread() -> None:
    rng = random.Random(7)
    session = Session("conversation-42", "prompt_cache_key")
    picks = {choose(THREE, "power-of-two", session=session, rng=rng).id for _ in range(10)}
    assert len(picks) == 1
    homes = Counter(
        choose(THREE, "random", session=Session(f"s{i}", "hash"), rng=rng).id for i in range(300)
    )
    assert set(homes) == {"i-a", "i-b", "i-c"} and min(homes.values()) > 50
    # an instance leaving moves only its own sessions
    before = {i: choose(THREE, "random", session=Session(f"s{i}", "h")).id for i in range(200)}
    after = {i: choose(THREE[:2], "random", session=Session(f"s{i}", "h")).id for i in range(200)}
    assert all(after[i] == before[i] for i in before if before[i] != "i-c")


def test_a_busy_home_yields_unless_the_method_is_pulsar() -> None:
    session = Session("k", "prompt_cache_key")
    home = choose(THREE, "random", session=session)
    busy = [Candidate(c.id, 5, free=c.id != home.id) for c in THREE]
    assert choose(busy, "pulsar", session=session).id == home.id
    assert choose(busy, "pulsar-wait-and-widen", session=session).id != home.id
    assert choose(busy, "power-of-two", session=session).id != home.id


def test_each_routing_method_chooses_as_documented() -> None:
    rng = random.Random(1)
    loaded = [Candidate("i-a", 3), Candidate("i-b", 0), Candidate("i-c", 7)]
    assert {choose(loaded, "wait-and-widen", rng=rng).id for _ in range(20)} == {"i-b"}
    turns = RoundRobin()
    order = [choose(THREE, "round-robin", key="f/m", turns=turns).id for _ in range(6)]
    assert order == ["i-a", "i-b", "i-c", "i-a", "i-b", "i-c"]
    assert choose(THREE, "round-robin", key="other", turns=turns).id == "i-a"
    spread = Counter(choose(THREE, "random", rng=rng).id for _ in range(300))
    assert min(spread.values()) > 60
    # power of two never picks the busiest of three: it loses every pair it is in
    assert "i-c" not in {choose(loaded, "power-of-two", rng=rng).id for _ in range(100)}
    assert choose(loaded, "pulsar", rng=rng).id != "i-c"  # no session: the default
    with pytest.raises(ValueError):
        choose([], "random")
