"""An LLM function's per-model configuration (NVCF's `FunctionModelDto.llmConfig`): the
OpenAI-compatible paths a model serves, its routing method and its token rate limit.

The rules are NVCF's `LlmConfigValidator`'s: a routing method is one of the request router's
algorithms, matched ignoring case with '_' for '-' (as nvcf-cli writes them: round_robin,
power_of_two, …), and stored as given; a token rate limit is comma-separated
`<positive integer>-<unit>` items (service/core/token_rates.py), no unit twice. What each
routing method does here is in docs/llm.md; the LLM gateway (service/llm/) reads these values.
"""

from __future__ import annotations

#: the OpenAI-compatible paths an LLM model may declare in `llmConfig.uris`
CHAT_COMPLETIONS = "/v1/chat/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
LLM_URIS = (CHAT_COMPLETIONS, RESPONSES, EMBEDDINGS)
#: bounds of `llmConfig.uris` (NVCF takes any non-empty list; these bound what is stored)
MAX_URIS = 64
MAX_URI = 256

#: the request router's algorithms (NVCF's list), canonical spelling
ROUTING_METHODS = (
    "power-of-two",
    "wait-and-widen",
    "round-robin",
    "random",
    "pulsar",
    "pulsar-wait-and-widen",
    # deprecated aliases NVCF keeps accepting for existing functions
    "groq-multiregion",
    "pulsar-multiregion",
)
#: NVCF's router default when a model names none
DEFAULT_ROUTING_METHOD = "power-of-two"

MAX_ROUTING_METHOD = 64
MAX_TOKENIZER = 256


def canonical_routing_method(value: str) -> str | None:
    """The router algorithm `value` names (any case, '_' or '-'), or None when it names none."""
    normal = value.strip().lower().replace("_", "-")
    return normal if normal in ROUTING_METHODS else None


def routing_method_error(value: str) -> str | None:
    """NVCF's rule: blank means the default; anything else must name an algorithm."""
    if not value.strip() or canonical_routing_method(value) is not None:
        return None
    names = ", ".join(m.replace("-", "_") for m in ROUTING_METHODS)
    return f"'{value}' is not a routing method; use one of {names} ('-' or '_', any case)"
