"""What the LLM gateway decides before the engine runs a request: whether a request is the
gateway's at all, which function and model it names, whether that model serves the path,
the session it belongs to, and which instance serves it.

**Where the gateway answers** (docs/llm.md):

- on the LLM host, `Host: llm.<NVCF_INVOKE_HOST_SUFFIX>` (e.g. `llm.invocation.localhost`),
  any port, the OpenAI paths as they are: `/v1/chat/completions`, `/v1/models`, …; with no
  suffix set, any host whose first label is `llm` and that has more labels;
- on any host under the prefix `/v2/nvcf/llm` for clients that cannot set a Host
  (`base_url="http://server/v2/nvcf/llm/v1"`), the same paths after it.

**Model**: `<function-id>/<model-name>`; the function id routes and authorizes, the worker
receives `<model-name>` (which may itself hold '/').

**Sessions** (NVCF's precedence): chat completions take `prompt_cache_key`, then the
`x-multi-turn-session-id` header, then a hash of the conversation's opening (its first two
messages); responses take `prompt_cache_key`, `conversation.id`, the header, then a hash of
the input's opening; embeddings have none. The answer carries `x-multi-turn-session-id`.

**Instances**: a session goes to the same instance while it is Running and has a free slot
(rendezvous hashing: when instances come and go, only the sessions of those move); otherwise
the model's `routingMethod` chooses (`preference`).
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.functions.llm_config import (
    CHAT_COMPLETIONS,
    DEFAULT_ROUTING_METHOD,
    EMBEDDINGS,
    RESPONSES,
    canonical_routing_method,
)
from service.llm.errors import OpenAIError, invalid, model_not_found

#: the path prefix of the gateway for clients that cannot set a Host
PREFIX = "/v2/nvcf/llm"
#: the first label of the LLM host
HOST_LABEL = "llm"
MODELS = "/v1/models"
#: the routes of the gateway: path -> method
ROUTES = {CHAT_COMPLETIONS: "POST", RESPONSES: "POST", EMBEDDINGS: "POST", MODELS: "GET"}
SESSION_HEADER = "x-multi-turn-session-id"
#: reserved to the gateway: a caller's is refused (NVCF's priority guard)
PRIORITY_HEADER = "x-priority"
#: NVCF's bound of a session key (prompt_cache_key or the header), in bytes
MAX_SESSION_KEY = 256
#: how many leading messages (or input items) make a conversation's opening
OPENING = 2


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host  # an IPv6 literal is never the LLM host
    return host.rsplit(":", 1)[0].lower().rstrip(".")


def is_llm_host(host: str, suffix: str | None) -> bool:
    """Whether `host` (a Host header, port allowed) is the LLM host for the transparent-mode
    suffix `suffix` (None: any suffix)."""
    labels = _hostname(host).split(".")
    if len(labels) < 2 or labels[0] != HOST_LABEL:
        return False
    return suffix is None or ".".join(labels[1:]) == suffix


def gateway_path(path: str, host: str, suffix: str | None) -> str | None:
    """The OpenAI path (`/v1/...`) a request addresses when it is the gateway's, else None:
    anything under the prefix, and anything on the LLM host."""
    if path == PREFIX or path.startswith(PREFIX + "/"):
        return path[len(PREFIX) :] or "/"
    if is_llm_host(host, suffix):
        return path
    return None


def route_path(path: str) -> str:
    """The route a gateway path names: trailing slashes are no part of it (as NVCF's router
    and OpenAI's take `/v1/chat/completions/` for `/v1/chat/completions`)."""
    return path.rstrip("/") or "/"


def route_error(path: str, method: str) -> OpenAIError | None:
    """OpenAI's 404/405 for a gateway path or method that is not one of its routes."""
    wanted = ROUTES.get(route_path(path))
    if wanted is None:
        routes = ", ".join(f"{m} {p}" for p, m in ROUTES.items())
        return OpenAIError(
            404, f"Invalid URL ({method} {path}): the LLM gateway serves {routes}", code="not_found"
        )
    if method != wanted:
        return OpenAIError(
            405,
            f"Method {method} is not allowed on {path}; use {wanted}",
            code="method_not_allowed",
            headers={"Allow": wanted},
        )
    return None


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A request's `model`: the function it routes to and the model name the worker gets."""

    function_id: uuid.UUID
    name: str

    @property
    def id(self) -> str:
        return f"{self.function_id}/{self.name}"


def parse_model(value: str) -> ModelRef:
    """`<function-id>/<model-name>`: NVCF's 400s for an empty `model` ("model is required")
    and one without its function-id prefix ("model prefix is required"), OpenAI's 404 for a
    prefix that cannot name a function here."""
    if not value:
        raise invalid("model is required", param="model")
    head, sep, name = value.partition("/")
    if not sep:
        raise invalid("model prefix is required", param="model")
    try:
        function_id = uuid.UUID(head) if len(head) == 36 else None
    except ValueError:
        function_id = None
    if function_id is None or not sep or not name:
        raise model_not_found(
            value,
            "Models are named '<function-id>/<model-name>'; GET /v1/models lists those you "
            "may use.",
        )
    return ModelRef(function_id, name)


def llm_config_of(models: Any, name: str) -> dict[str, Any] | None:
    """The `llmConfig` of model `name` in a version's stored models, or None."""
    for model in models if isinstance(models, list) else ():
        if isinstance(model, dict) and model.get("name") == name:
            config = model.get("llmConfig")
            return config if isinstance(config, dict) else None
    return None


def _declared_uri(uri: object) -> str:
    """A declared uri as NVCF's gateway matches it: surrounding space, trailing slashes and
    letter case ignored, a missing leading slash added."""
    text = str(uri).strip().rstrip("/")
    return "/" + text.removeprefix("/").lower() if text else ""


def undeclared(models: Any, ref: ModelRef, path: str) -> str | None:
    """What the function does not declare of a request (its model, or the path among the
    model's `uris`), in words; None when both are declared."""
    config = llm_config_of(models, ref.name)
    if config is None:
        return f"the function declares no model '{ref.name}'"
    uris = config.get("uris") or []
    if path.lower() not in {_declared_uri(u) for u in uris}:
        return f"the model '{ref.name}' does not declare {path} in llmConfig.uris"
    return None


def check_target(
    function_type: str, models: Any, ref: ModelRef, path: str, *, enforce: bool
) -> dict[str, Any]:
    """The routed model's `llmConfig` (empty for a model the function does not declare), or
    OpenAI's error: 404 for a function that is not an LLM function. With `enforce` (the
    allow-list setting, NVCF's MODEL_URI_ALLOWLIST_ENABLED) also 404 for a model the function
    does not declare and NVCF's 400 for a path its `uris` do not list; without, both pass
    (the gateway logs them)."""
    if function_type != "LLM":
        raise model_not_found(
            ref.id, f"Function {ref.function_id} is not an LLM function (functionType LLM)."
        )
    config = llm_config_of(models, ref.name)
    if enforce and config is None:
        raise model_not_found(ref.id, f"Function {ref.function_id} has no model '{ref.name}'.")
    if enforce and undeclared(models, ref, path) is not None:
        raise OpenAIError(
            400,
            f'model "{ref.name}" does not support {path}',
            param="model",
            code="unsupported_endpoint",
        )
    return config or {}


def priority_of(invocation_config: Any, account: str) -> int | None:
    """The priority of `account`'s requests (`llmInvocationConfig.priority`: its
    `perAccountPriority` entry, else `defaultPriority`; None when neither is set). Lower is
    served first, 0 first of all (NVCF's `PriorityDto`)."""
    config = invocation_config if isinstance(invocation_config, dict) else {}
    priority = config.get("priority")
    if not isinstance(priority, dict):
        return None
    per_account = priority.get("perAccountPriority")
    value = per_account.get(account) if isinstance(per_account, dict) else None
    if value is None:
        value = priority.get("defaultPriority")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


#: NVCF's deprecated names and the algorithms they stand for
ALIASES = {"groq-multiregion": "wait-and-widen", "pulsar-multiregion": "pulsar-wait-and-widen"}


def routing_method(config: Mapping[str, Any]) -> str:
    """The model's routing method, canonical (aliases resolved); the default when it names
    none."""
    value = config.get("routingMethod")
    method = DEFAULT_ROUTING_METHOD
    if isinstance(value, str) and value.strip():
        method = canonical_routing_method(value) or DEFAULT_ROUTING_METHOD
    return ALIASES.get(method, method)


# --- sessions ---------------------------------------------------------------------------


def _key_error(value: str) -> str | None:
    if len(value.encode("utf-8")) > MAX_SESSION_KEY:
        return f"must be at most {MAX_SESSION_KEY} bytes"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        return "must not contain control characters"
    return None


def _printable_ascii(value: str) -> bool:
    return all(0x20 <= ord(c) < 0x7F for c in value)


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class Session:
    """A request's session: `id` is what `x-multi-turn-session-id` carries back (the raw
    key when it can be a header value, else its SHA-256); `affinity` the hash instances are
    chosen by (the same for the key and for the header sent back)."""

    id: str
    source: str

    @property
    def affinity(self) -> str:
        return hashlib.sha256(self.id.encode()).hexdigest()

    @classmethod
    def of_key(cls, raw: str, source: str) -> Session:
        return cls(raw if _printable_ascii(raw) else _digest(raw), source)


def session_of(path: str, body: Mapping[str, Any], header: str | None) -> Session | None:
    """The session of a request to `path` (NVCF's precedence per endpoint; None for
    embeddings), or OpenAI's 400 for a malformed key. `body` was checked by schemas.py."""
    if path == EMBEDDINGS:
        return None
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return Session.of_key(key, "prompt_cache_key")
    if path == RESPONSES:
        conversation = body.get("conversation")
        cid = conversation.get("id") if isinstance(conversation, dict) else conversation
        if isinstance(cid, str) and cid:
            return Session.of_key(cid, "conversation.id")
    if header:
        why = _key_error(header)
        if why is not None:
            raise invalid(f"Header {SESSION_HEADER} {why}.", param=SESSION_HEADER)
        return Session.of_key(header, SESSION_HEADER)
    opening = body.get("messages") if path == CHAT_COMPLETIONS else body.get("input")
    if isinstance(opening, list):
        opening = opening[:OPENING]
    if opening is None or opening == [] or opening == "":
        return None
    return Session(_digest(opening), "hash")


def prompt_cache_key_error(value: str) -> str | None:
    """schemas.py: why a `prompt_cache_key` is refused (NVCF: ≤ 256 bytes, no control
    characters; empty is ignored)."""
    return _key_error(value)


# --- instances ---------------------------------------------------------------------------


def _weight(affinity: str, instance: uuid.UUID) -> bytes:
    return hashlib.sha256(f"{affinity}/{instance}".encode()).digest()


def home_of(instances: Sequence[uuid.UUID], affinity: str) -> uuid.UUID:
    """A session's instance: the highest rendezvous weight among `instances` (when instances
    come and go, only the sessions of those move)."""
    return max(instances, key=lambda i: _weight(affinity, i))


class RoundRobin:
    """Round-robin turns per (function, model); in memory, per replica."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def take(self, key: str, count: int) -> int:
        turn = self._next.get(key, 0)
        self._next[key] = (turn + 1) % (1 << 30)
        return turn % count


def preference(
    instances: Sequence[uuid.UUID],
    method: str,
    *,
    session: Session | None = None,
    key: str = "",
    turns: RoundRobin | None = None,
    rng: random.Random | None = None,
) -> tuple[uuid.UUID, ...]:
    """The instances a request would have serve it, best first (`Admitted.prefer`): the engine's
    dispatcher gives it the first with a free slot, and when none has one (or nothing is
    preferred) the instance with the fewest requests in flight.

    A session prefers its instance (`home_of`). Otherwise, by `method` (canonical,
    routing_method()):

    - round-robin: the instances in id order from the next turn, per function and model
      (`key`);
    - random: the instances shuffled;
    - power-of-two (the default), wait-and-widen, pulsar, pulsar-wait-and-widen: no
      preference — the dispatcher's fewest-in-flight choice, which compares every instance
      (power-of-two samples two of them) and is the shortest expected wait without RTT or
      throughput signals; pulsar's affinity is the session's.
    """
    if not instances:
        return ()
    if session is not None:
        return (home_of(instances, session.affinity),)
    if method == "round-robin":
        ordered = sorted(instances, key=str)
        start = (turns or RoundRobin()).take(key, len(ordered))
        return tuple(ordered[start:] + ordered[:start])
    if method == "random":
        shuffled = list(instances)
        (rng or random.Random()).shuffle(shuffled)  # noqa: S311 - spreading load, not security
        return tuple(shuffled)
    return ()
