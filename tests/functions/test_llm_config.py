"""LLM functions' models and llmConfig (issue 28): NVCF's LlmConfigValidator rules, every
violation listed, checked without a server; token rate strings parsed."""

from __future__ import annotations

from typing import Any

import pytest

from service.core.errors import ValidationFailed
from service.core.token_rates import TokenRate, parse_token_rates, token_rate_error
from service.functions.llm_config import canonical_routing_method
from service.functions.validation import validate_create, validate_metadata_update

CHAT = "/v1/chat/completions"
LLM: dict[str, Any] = {
    "name": "sample-llm-function",
    "inferenceUrl": "/",
    "inferencePort": 8000,
    "containerImage": "nvcr.io/example/openai-compatible:latest",
    "functionType": "LLM",
    "models": [
        {
            "name": "dummy-model",
            "llmConfig": {
                "uris": [CHAT, "/v1/responses", "/v1/embeddings"],
                "routingMethod": "power_of_two",
                "tokenRateLimit": "1000-S",
            },
        }
    ],
}


def llm(**config: Any) -> dict[str, Any]:
    return {**LLM, "models": [{"name": "m", "llmConfig": {"uris": [CHAT], **config}}]}


def errors_of(body: Any) -> list[tuple[str, str]]:
    with pytest.raises(ValidationFailed) as info:
        validate_create(body)
    return [(e.field, e.message) for e in info.value.errors]


def test_nvcf_documented_llm_function_is_accepted_as_given() -> None:
    spec = validate_create(LLM)
    assert spec.function_type == "LLM"
    assert spec.models == LLM["models"]  # stored as given: routingMethod keeps its spelling


@pytest.mark.parametrize(
    "method",
    [
        "round_robin",
        "power_of_two",
        "random",
        "wait_and_widen",
        "pulsar",
        "pulsar-wait-and-widen",
        "groq_multiregion",
        "pulsar-multiregion",
        "Round-Robin",
        " power-of-two ",
        "",
    ],
)
def test_routing_methods_as_nvcf_cli_and_the_router_name_them(method: str) -> None:
    assert validate_create(llm(routingMethod=method)).models is not None


@pytest.mark.parametrize(
    "limit", ["1000-S", "1000-S,5000-M", "1-S,2-M,3-H,4-D,5-W", "10-M, 5-S", "999999999999-W"]
)
def test_token_rate_limits_accepted(limit: str) -> None:
    assert validate_create(llm(tokenRateLimit=limit)).models is not None


@pytest.mark.parametrize(
    ("limit", "words"),
    [
        ("1000", "'<count>-<unit>'"),
        ("0-S", "positive integer"),
        ("10-Y", "unit S, M, H, D, W or MO"),
        ("10-s", "unit S, M, H, D, W or MO"),
        ("1000-S,5000-S", "names the unit S more than once"),
        ("1-M,2-S,3-M,4-S", "names the unit S, M more than once"),
        ("1000-S,", "'<count>-<unit>'"),
        ("1" * 13 + "-S", "at most 12 digits"),
        ("-1-S", "'<count>-<unit>'"),
    ],
)
def test_bad_token_rate_limits_say_why(limit: str, words: str) -> None:
    ((field, message),) = errors_of(llm(tokenRateLimit=limit))
    assert field == "models[0].llmConfig.tokenRateLimit"
    assert words in message


def test_uris_are_any_non_empty_list_as_nvcf() -> None:
    validate_create(llm(uris=["/v1/completions", "/v1/audio/speech", CHAT, CHAT]))
    ((field, message),) = errors_of(llm(uris=[CHAT] * 65))
    assert field == "models[0].llmConfig.uris" and "64" in message


def test_every_llm_violation_is_listed_together() -> None:
    body = {
        **LLM,
        "llmInvocationConfig": {"priority": {"perAccountPriority": {"acct": 1}}},
        "models": [
            {"name": "a", "llmConfig": {"uris": []}},
            {"name": "b", "llmConfig": {"uris": ["", "/x" * 200]}},
            {"name": "c", "llmConfig": {"routingMethod": "fastest", "tokenRateLimit": "5-X"}},
            {"name": "d"},
            {"name": "a", "llmConfig": {"uris": [CHAT], "tokenizer": "t" * 300}},
        ],
    }
    errors = errors_of(body)
    fields = [f for f, _ in errors]
    assert ("models[0].llmConfig.uris", "must not be empty") in errors
    assert "models[1].llmConfig.uris[0]" in fields  # empty
    assert "models[1].llmConfig.uris[1]" in fields  # over 256 characters
    assert ("models[2].llmConfig.uris", "is required") in errors
    assert any(
        f == "models[2].llmConfig.routingMethod" and "'fastest' is not a routing method" in m
        for f, m in errors
    )
    assert "models[2].llmConfig.tokenRateLimit" in fields
    assert ("models[3].llmConfig", "is required for an LLM function's models") in errors
    assert any(f == "models[4].name" and "more than once" in m for f, m in errors)
    assert "models[4].llmConfig.tokenizer" in fields
    assert (
        "llmInvocationConfig.priority.defaultPriority",
        "is required when perAccountPriority has entries",
    ) in errors


def test_llm_function_needs_models() -> None:
    body = {k: v for k, v in LLM.items() if k != "models"}
    assert errors_of(body) == [
        ("models", "is required when functionType is LLM: the models it serves")
    ]
    assert errors_of({**body, "models": []})[0][0] == "models"


def test_other_functions_models_need_version_and_uri_and_no_llm_config() -> None:
    body = {**LLM, "functionType": "DEFAULT", "llmInvocationConfig": {}}
    errors = errors_of(body)
    assert ("models[0].version", "is required unless functionType is LLM") in errors
    assert ("models[0].uri", "is required unless functionType is LLM") in errors
    assert ("models[0].llmConfig", "is only allowed when functionType is LLM") in errors
    assert ("llmInvocationConfig", "is only allowed when functionType is LLM") in errors


def test_llm_invocation_config_and_telemetries_are_kept() -> None:
    priority = {"defaultPriority": 5, "perAccountPriority": {"acct-1": 0}}
    telemetries = {"logsTelemetryId": "0b7a4c1e-2f57-4a52-9d55-1d7e3f3f2a10"}
    spec = validate_create(
        {**LLM, "llmInvocationConfig": {"priority": priority}, "telemetries": telemetries}
    )
    assert spec.llm_invocation_config == {"priority": priority}
    assert spec.telemetries == telemetries


def test_bad_priority_and_telemetries_are_listed() -> None:
    errors = errors_of(
        {
            **LLM,
            "llmInvocationConfig": {
                "priority": {
                    "defaultPriority": 2**32,
                    "perAccountPriority": {f"a{i}": -1 for i in range(65)},
                }
            },
            "telemetries": {"tracesTelemetryId": "not-a-uuid"},
        }
    )
    fields = {f for f, _ in errors}
    assert "llmInvocationConfig.priority.defaultPriority" in fields
    assert "llmInvocationConfig.priority.perAccountPriority" in fields
    assert ("telemetries.tracesTelemetryId", "'not-a-uuid' is not a UUID") in errors
    assert errors_of({**LLM, "telemetries": {}}) == [
        (
            "telemetries",
            "give at least one of logsTelemetryId, metricsTelemetryId or tracesTelemetryId",
        )
    ]


def test_model_updates_are_validated_like_creation() -> None:
    update = validate_metadata_update(
        {"modelUpdates": [{"modelName": "m", "llmConfig": {"routingMethod": "round_robin"}}]}
    )
    assert [(u.model_name, u.routing_method, u.token_rate_limit) for u in update.model_updates] == [
        ("m", "round_robin", None)
    ]
    with pytest.raises(ValidationFailed) as info:
        validate_metadata_update(
            {
                "modelUpdates": [
                    {"modelName": "m", "llmConfig": {}},
                    {"modelName": "m", "llmConfig": {"tokenRateLimit": "5-S,6-S"}},
                    {"llmConfig": {"routingMethod": "nope"}},
                ]
            }
        )
    errors = [(e.field, e.message) for e in info.value.errors]
    assert (
        "modelUpdates[0].llmConfig",
        "give at least one of tokenRateLimit or routingMethod",
    ) in errors
    assert (
        "modelUpdates[1].llmConfig.tokenRateLimit",
        "'5-S,6-S' names the unit S more than once",
    ) in errors
    assert ("modelUpdates[2].modelName", "is required") in errors
    assert any(f == "modelUpdates[2].llmConfig.routingMethod" for f, _ in errors)
    with pytest.raises(ValidationFailed) as info:
        validate_metadata_update({"modelUpdates": []})
    assert info.value.errors[0].field == "body"


def test_token_rates_parse_shortest_window_first() -> None:
    assert parse_token_rates("5000-M, 9-MO, 1000-S,7-W") == (
        TokenRate(1000, "S"),
        TokenRate(5000, "M"),
        TokenRate(7, "W"),
        TokenRate(9, "MO"),
    )
    assert parse_token_rates("") == ()
    assert parse_token_rates("1-S,2-S") == ()  # never stored: the rules refuse it
    assert parse_token_rates(None) == ()
    assert TokenRate(7, "W").seconds == 7 * 86400
    assert TokenRate(9, "MO").seconds == 30 * 86400  # NVIDIA's month (PR #1658)
    assert token_rate_error("  ") is None
    assert canonical_routing_method("Round_Robin") == "round-robin"
    assert canonical_routing_method("fastest") is None
