"""An LLM function's per-model configuration (NVCF's `FunctionModelDto.llmConfig`): the
OpenAI-compatible paths a model serves, its routing method and its token rate limit.

The rules are NVCF's `LlmConfigValidator`'s: a routing method is one of the request router's
algorithms, matched ignoring case with '_' for '-' (as nvcf-cli writes them: round_robin,
power_of_two, …), and stored as given; a token rate limit is comma-separated
`<positive integer>-<unit>` items, unit S, M, H, D or W (a week), no unit twice. What each
routing method does here is in docs/llm.md; the LLM gateway (service/llm/) reads these values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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

#: token rate units and their window in seconds
TOKEN_RATE_UNITS = {"S": 1, "M": 60, "H": 3600, "D": 86400, "W": 7 * 86400}
#: digits of a token count (a trillion tokens per window is plenty, and sums stay in int64)
MAX_TOKEN_DIGITS = 12
TOKEN_RATE_RE = re.compile(
    rf"^[1-9][0-9]{{0,{MAX_TOKEN_DIGITS - 1}}}-[SMHDW]"
    rf"(,\s*[1-9][0-9]{{0,{MAX_TOKEN_DIGITS - 1}}}-[SMHDW])*$"
)
MAX_TOKEN_RATE = 128
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


@dataclass(frozen=True, slots=True)
class TokenRate:
    """One `<count>-<unit>` item: at most `count` tokens per `seconds`."""

    count: int
    unit: str

    @property
    def seconds(self) -> int:
        return TOKEN_RATE_UNITS[self.unit]

    @property
    def text(self) -> str:
        return f"{self.count}-{self.unit}"


def token_rate_error(value: str) -> str | None:
    """Why `value` is not a token rate limit, or None (blank means no limit, as NVCF)."""
    if not value.strip():
        return None
    if len(value) > MAX_TOKEN_RATE:
        return f"must be at most {MAX_TOKEN_RATE} characters, got {len(value)}"
    if not TOKEN_RATE_RE.match(value):
        return (
            f"'{value}' must be comma-separated '<count>-<unit>' items, count a positive "
            f"integer of at most {MAX_TOKEN_DIGITS} digits, unit S, M, H, D or W "
            "(e.g. '1000-S,5000-M')"
        )
    units = [part.strip().rsplit("-", 1)[1] for part in value.split(",")]
    repeated = sorted({u for u in units if units.count(u) > 1}, key="SMHDW".index)
    if repeated:
        return f"'{value}' names the unit {', '.join(repeated)} more than once"
    return None


def parse_token_rates(value: object) -> tuple[TokenRate, ...]:
    """The items of a stored token rate limit, shortest window first; () for none or for a
    value that breaks the rules (stored values were checked when they were written)."""
    if not isinstance(value, str) or token_rate_error(value) is not None or not value.strip():
        return ()
    rates = []
    for part in value.split(","):
        count, _, unit = part.strip().rpartition("-")
        rates.append(TokenRate(int(count), unit))
    return tuple(sorted(rates, key=lambda r: r.seconds))
