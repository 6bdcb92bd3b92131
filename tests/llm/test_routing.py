"""The LLM gateway's routing decisions (service/llm/routing.py): which requests are the
gateway's, the model a request names, whether the model serves the path, sessions and the
instance each routing method chooses."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from typing import Any

import pytest

from service.llm.errors import OpenAIError
from service.llm.routing import (
    ModelRef,
    RoundRobin,
    Session,
    check_target,
    gateway_path,
    home_of,
    is_llm_host,
    parse_model,
    preference,
    route_error,
    routing_method,
    session_of,
    undeclared,
)

FID = uuid.UUID("7f0c9c5e-3a43-4d55-8a5e-6a3b1f0e9d21")
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
MODELS: list[dict[str, Any]] = [
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
    assert isinstance(body, dict)
    assert set(body) == {"message", "type", "param", "code"}


def test_model_is_function_id_slash_model_name() -> None:
    assert parse_model(f"{FID}/meta/llama-3") == ModelRef(FID, "meta/llama-3")
    assert parse_model(f"{FID}/meta/llama-3").id == f"{FID}/meta/llama-3"
    for bad in (f"{FID}/", "not-a-uuid-at-all-but-36-characters-/m", "/m"):
        with pytest.raises(OpenAIError) as info:
            parse_model(bad)
        assert info.value.status == 404
        assert info.value.code == "model_not_found" and info.value.param == "model"
        assert f"`{bad}`" in info.value.message
    for bad, message in [
        ("gpt-4o", "model prefix is required"),
        (str(FID), "model prefix is required"),
        ("", "model is required"),
    ]:
        with pytest.raises(OpenAIError) as info:
            parse_model(bad)
        assert (info.value.status, info.value.message) == (400, message)


def test_the_target_must_be_an_llm_function_and_the_allowlist_refuses_the_undeclared() -> None:
    chat = ModelRef(FID, "chat")
    for enforce in (False, True):
        assert check_target("LLM", MODELS, chat, CHAT, enforce=enforce) == MODELS[0]["llmConfig"]
    cases = [
        ("DEFAULT", ModelRef(FID, "chat"), CHAT, False, 404, "not an LLM function"),
        ("DEFAULT", ModelRef(FID, "chat"), CHAT, True, 404, "not an LLM function"),
        ("LLM", ModelRef(FID, "ghost"), CHAT, True, 404, "has no model 'ghost'"),
        ("LLM", ModelRef(FID, "chat"), EMBEDDINGS, True, 400, 'model "chat" does not support'),
    ]
    for kind, ref, path, enforce, status, words in cases:
        with pytest.raises(OpenAIError) as info:
            check_target(kind, MODELS, ref, path, enforce=enforce)
        assert info.value.status == status and words in info.value.message
    # NVCF's default: passed through (no config for a model it does not declare)
    assert check_target("LLM", MODELS, ModelRef(FID, "ghost"), CHAT, enforce=False) == {}
    assert check_target("LLM", MODELS, chat, EMBEDDINGS, enforce=False)
    assert undeclared(MODELS, chat, EMBEDDINGS) is not None
    # declared uris match as NVCF's do: space, trailing slash, missing leading slash, case
    lenient = [{"name": "m", "llmConfig": {"uris": [" V1/Chat/Completions/ "]}}]
    assert undeclared(lenient, ModelRef(FID, "m"), CHAT) is None


def test_routing_methods_are_canonical_with_aliases_resolved() -> None:
    assert routing_method(MODELS[1]["llmConfig"]) == "round-robin"
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


THREE = [uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3)]


def test_a_session_prefers_one_of_three_instances_and_sessions_spread() -> None:
    session = Session("conversation-42", "prompt_cache_key")
    picks = {preference(THREE, "power-of-two", session=session) for _ in range(10)}
    assert len(picks) == 1 and len(next(iter(picks))) == 1
    homes = Counter(home_of(THREE, Session(f"s{i}", "hash").affinity) for i in range(300))
    assert set(homes) == set(THREE) and min(homes.values()) > 50
    # an instance leaving moves only its own sessions
    before = {i: home_of(THREE, Session(f"s{i}", "h").affinity) for i in range(200)}
    after = {i: home_of(THREE[:2], Session(f"s{i}", "h").affinity) for i in range(200)}
    assert all(after[i] == before[i] for i in before if before[i] != THREE[2])


def test_each_routing_method_prefers_as_documented() -> None:
    turns = RoundRobin()
    firsts = [preference(THREE, "round-robin", key="f/m", turns=turns)[0] for _ in range(6)]
    assert firsts == [*THREE, *THREE]
    assert preference(THREE, "round-robin", key="f/m", turns=turns) == (
        THREE[0],
        THREE[1],
        THREE[2],
    )
    assert preference(THREE, "round-robin", key="other", turns=turns)[0] == THREE[0]
    rng = random.Random(3)
    shuffled = Counter(preference(THREE, "random", rng=rng)[0] for _ in range(300))
    assert min(shuffled.values()) > 60
    assert sorted(preference(THREE, "random", rng=rng)) == THREE
    for method in ("power-of-two", "wait-and-widen", "pulsar", "pulsar-wait-and-widen"):
        assert preference(THREE, method) == ()  # the dispatcher's fewest in flight
    assert preference([], "round-robin") == ()
