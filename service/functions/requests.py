"""What the function registry takes in (api.md §2.3): the request bodies, the single
declaration of their fields and bounds, used to validate them."""

from __future__ import annotations

import json
import re
import uuid
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from service.auth.service import MAX_ACCOUNT_ID
from service.charts.schemas import HelmValidationPolicyIn
from service.core.durations import DurationError, parse_duration
from service.core.http import json_kind
from service.core.schemas import (
    MAX_SECRET_VALUE,
    SECRET_NAME_RE,
    Tags,
)
from service.core.token_rates import MAX_TOKEN_RATE, token_rate_error
from service.core.validation import (
    DNS_1035_LABEL,
    Check,
    Expect,
    MaxItems,
    OneOf,
    RequestModel,
    Rules,
    int_between,
    matches,
    raise_all,
)
from service.functions.llm_config import (
    LLM_URIS,
    MAX_ROUTING_METHOD,
    MAX_TOKENIZER,
    MAX_URI,
    MAX_URIS,
    routing_method_error,
)
from service.functions.sharing import MAX_AUTHORIZED_PARTIES

NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9\-_]*$")
#: a count has at most 9 digits (ratelimit.MAX_RATE_DIGITS), ASCII ones
RATE_RE = re.compile(r"^[1-9][0-9]{0,8}-[SMHD](,\s*[1-9][0-9]{0,8}-[SMHD])*$")
#: NVCF's selectors of the platform's own worker utilities (`utilsContainerImage`)
UTILS_SELECTORS = ("PYTHON", "GO")
#: an image reference (the distribution project's grammar: [domain[:port]/]path[:tag][@digest])
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
#: a registry, as Docker tells one from a path component: a '.', a port, or localhost
_IMAGE_DOMAIN = (
    rf"(?:localhost(?::[0-9]{{1,5}})?|{_IMAGE_LABEL}(?:\.{_IMAGE_LABEL})+(?::[0-9]{{1,5}})?"
    rf"|{_IMAGE_LABEL}:[0-9]{{1,5}})"
)
IMAGE_RE = re.compile(
    rf"^(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}"
    rf"(?:/{_IMAGE_COMPONENT})*(?::\w[\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$"
)
URI_PATH_RE = re.compile(r"^[A-Za-z0-9\-._~!$&'()*+,;=:@/%]+$")
MAX_URI_PATH = 2048
API_BODY_FORMATS = ("CUSTOM", "PREDICT_V2")
FUNCTION_TYPES = ("DEFAULT", "STREAMING", "LLM")
HEALTH_PROTOCOLS = ("HTTP", "gRPC")
#: entries of containerEnvironment, secrets, models and resources per version
MAX_ENVIRONMENT = 256
MAX_SECRETS = 128
MAX_ARTIFACTS = 64
#: exemptedNcaIds and perNcaIdRate entries (NVCF's bound)
MAX_RATE_ACCOUNTS = 32


def _uri_path(value: str) -> str | None:
    if "://" in value:
        return f"must be a URI path such as '/echo', not an absolute URL ('{value}')"
    if not URI_PATH_RE.match(value):
        return f"'{value}' is not a valid URI path (no spaces, '?' or '#')"
    if len(value) > MAX_URI_PATH:
        return f"must be at most {MAX_URI_PATH} characters"
    return None


def _iso_duration(value: str) -> str | None:
    try:
        parse_duration(value)
    except DurationError:
        return f"'{value}' is not an ISO-8601 duration such as 'PT10S'"
    return None


def _rate_units(value: str) -> str | None:
    units = [part.strip().split("-")[1] for part in value.split(",")]
    dup = sorted({u for u in units if units.count(u) > 1})
    return f"'{value}' names the unit {', '.join(dup)} more than once" if dup else None


def _reserved_key(value: str) -> str | None:
    if value.upper().startswith("NVCF_"):
        return f"'{value}': keys starting with NVCF_ are reserved for the platform"
    return None


def _secret_size(value: str | dict[str, Any]) -> str | None:
    text = value if isinstance(value, str) else secret_text(value)
    if not 1 <= len(text) <= MAX_SECRET_VALUE:
        # Never quote the value: it is a secret.
        return f"must be 1 to {MAX_SECRET_VALUE} characters, got {len(text)}"
    return None


def secret_text(value: str | dict[str, Any]) -> str:
    """A secret's stored text: strings as given, objects as compact sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


UriPath = Annotated[
    str,
    Field(min_length=1),
    Check(_uri_path, {"maxLength": MAX_URI_PATH, "pattern": URI_PATH_RE.pattern}),
]
Port = Annotated[StrictInt, int_between(1, 65535)]


class KeyValueIn(RequestModel):
    key: Annotated[str, Field(min_length=1, max_length=256), Check(_reserved_key)]
    value: str

    shape: ClassVar[str] = "with key and value"


class ArtifactIn(RequestModel):
    name: str = Field(min_length=1, max_length=1024)
    version: str = Field(min_length=1, max_length=1024)
    uri: str = Field(min_length=1, max_length=1024)

    shape: ClassVar[str] = "with name, version and uri"


TokenRateLimit = Annotated[
    str,
    Expect((str,), "must be a string such as '1000-S,5000-M'"),
    Field(max_length=MAX_TOKEN_RATE),
    Check(token_rate_error, {"examples": ["1000-S,5000-M"]}),
]
RATE_LIMIT_DOC = (
    "tokens per model and account: '<count>-<unit>' items, unit S, M, H, D, W or MO, no unit twice"
)
RoutingMethod = Annotated[
    str,
    Expect((str,), "must be a string such as 'power_of_two'"),
    Field(max_length=MAX_ROUTING_METHOD),
    Check(routing_method_error, {"examples": ["power_of_two", "round_robin"]}),
]
ROUTING_DOC = "how the instance of a request is chosen (docs/llm.md)"


class LlmConfigIn(RequestModel):
    """NVCF's `LlmConfigDto`, checked as its `LlmConfigValidator` does."""

    uris: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=MAX_URI)]],
        Expect((list,), "must be a non-empty list of OpenAI-compatible paths"),
        Field(min_length=1),
        MaxItems(MAX_URIS),
    ] = Field(
        description="the OpenAI-compatible paths the model serves, such as "
        f"{', '.join(LLM_URIS)} (any non-empty list, as NVCF)"
    )
    token_rate_limit: TokenRateLimit | None = Field(default=None, description=RATE_LIMIT_DOC)
    tokenizer: Annotated[str, Field(max_length=MAX_TOKENIZER)] | None = None
    routing_method: RoutingMethod | None = Field(default=None, description=ROUTING_DOC)

    shape: ClassVar[str] = 'like {"uris": ["/v1/chat/completions"]}'
    null_when_missing: ClassVar[tuple[str, ...]] = ("uris",)


class ModelIn(RequestModel):
    """NVCF's `FunctionModelDto`: `version` and `uri` are required unless the function is an
    LLM function, whose models carry `llmConfig` instead (validation.py)."""

    name: str = Field(min_length=1, max_length=1024)
    version: str | None = Field(default=None, min_length=1, max_length=1024)
    uri: str | None = Field(default=None, min_length=1, max_length=1024)
    llm_config: LlmConfigIn | None = Field(default=None, description="LLM functions only")

    shape: ClassVar[str] = "with name, and version and uri or llmConfig"


#: NVCF's bounds of a priority (u32) and of the per-account overrides
MAX_PRIORITY = 4294967295
MAX_PRIORITY_ACCOUNTS = 64
Priority = Annotated[StrictInt, int_between(0, MAX_PRIORITY)]


def _per_account_priority(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"must be an object of account id to priority, got {json_kind(value)}"
    if len(value) > MAX_PRIORITY_ACCOUNTS:
        return f"must have at most {MAX_PRIORITY_ACCOUNTS} accounts, got {len(value)}"
    bad = [k for k in value if not 1 <= len(k) <= MAX_ACCOUNT_ID]
    if bad:
        return f"account ids must be 1 to {MAX_ACCOUNT_ID} characters, got {len(bad[0])}"
    return None


class PriorityIn(RequestModel):
    """NVCF's `PriorityDto`: lower is served first, 0 highest."""

    default_priority: Priority | None = None
    per_account_priority: (
        Annotated[
            dict[str, Priority],
            Check(_per_account_priority, {"maxProperties": MAX_PRIORITY_ACCOUNTS}, before=True),
        ]
        | None
    ) = Field(default=None, description="a priority per account id")

    @model_validator(mode="after")
    def _default_with_overrides(self) -> PriorityIn:
        if self.per_account_priority and self.default_priority is None:
            raise_all([("defaultPriority", "is required when perAccountPriority has entries")])
        return self


class LlmInvocationConfigIn(RequestModel):
    """NVCF's `LlmInvocationConfigDto` (LLM functions only; shared by all their versions)."""

    priority: PriorityIn | None = None


def _uuid_text(value: str) -> str | None:
    try:
        uuid.UUID(value)
    except ValueError:
        return f"'{value}' is not a UUID"
    return None


TelemetryId = Annotated[str, Field(max_length=36), Check(_uuid_text, {"format": "uuid"})]


class TelemetriesIn(RequestModel):
    """NVCF's `TelemetriesDto`: the account's telemetries that receive the version's logs,
    metrics and traces (each checked by observability/references.py)."""

    logs_telemetry_id: TelemetryId | None = None
    metrics_telemetry_id: TelemetryId | None = None
    traces_telemetry_id: TelemetryId | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> TelemetriesIn:
        if not (self.logs_telemetry_id or self.metrics_telemetry_id or self.traces_telemetry_id):
            ids = "logsTelemetryId, metricsTelemetryId or tracesTelemetryId"
            raise_all([("", f"give at least one of {ids}")])
        return self


class LlmConfigUpdateIn(RequestModel):
    """NVCF's `LlmConfigUpdateDto`: the model settings a version may change in place."""

    token_rate_limit: TokenRateLimit | None = Field(default=None, description=RATE_LIMIT_DOC)
    routing_method: RoutingMethod | None = Field(default=None, description=ROUTING_DOC)

    shape: ClassVar[str] = 'like {"tokenRateLimit": "1000-S"}'

    @model_validator(mode="after")
    def _something(self) -> LlmConfigUpdateIn:
        if self.token_rate_limit is None and self.routing_method is None:
            raise_all([("", "give at least one of tokenRateLimit or routingMethod")])
        return self


class ModelUpdateIn(RequestModel):
    """NVCF's `ModelUpdateDto`: one model's settings changed on every version in place."""

    model_name: str = Field(min_length=1, max_length=1024)
    llm_config: LlmConfigUpdateIn

    shape: ClassVar[str] = "with modelName and llmConfig"
    null_when_missing: ClassVar[tuple[str, ...]] = ("modelName", "llmConfig")


class HealthIn(RequestModel):
    protocol: Annotated[str, OneOf(HEALTH_PROTOCOLS)]
    uri: UriPath
    port: Port
    timeout: Annotated[str, Check(_iso_duration, {"examples": ["PT10S"]})]
    expected_status_code: Annotated[StrictInt, int_between(100, 599)]


class SecretIn(RequestModel):
    name: Annotated[
        str,
        Field(min_length=1, max_length=48),
        matches(
            SECRET_NAME_RE.pattern,
            "'{value}' must start with a letter or digit and contain only letters, digits, "
            "'_', '.' and '-'",
        ),
    ]
    value: Annotated[
        str | dict[str, Any],
        Expect((str, dict), "must be a string or an object"),
        Check(_secret_size, {"description": f"1 to {MAX_SECRET_VALUE} characters (as JSON)"}),
    ]

    shape: ClassVar[str] = "with name and value"


Rate = Annotated[
    str,
    Expect((str,), "must be a string such as '100-S'"),
    matches(
        RATE_RE.pattern,
        "'{value}' must be '<count>-<unit>' items separated by commas, unit S, M, H or D "
        "(e.g. '100-S,5000-H')",
    ),
    Check(_rate_units, {"examples": ["100-S"]}),
]


def _exempted(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return "must be a list of account ids"
    if len(value) > MAX_RATE_ACCOUNTS:
        return f"must have at most {MAX_RATE_ACCOUNTS} items, got {len(value)}"
    return None


def _per_account(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"must be an object of account id to rate, got {json_kind(value)}"
    if len(value) > MAX_RATE_ACCOUNTS:
        return f"must have at most {MAX_RATE_ACCOUNTS} accounts, got {len(value)}"
    long = [k for k in value if len(k) > MAX_ACCOUNT_ID]
    if long:
        return f"account ids must be at most {MAX_ACCOUNT_ID} characters, got {len(long[0])}"
    return None


class RateLimit(RequestModel):
    """NVCF's `RateLimitDto`: at least one of rateLimit, perNcaIdRate and perUserRate; accounts
    are exempted only from `rateLimit`, and an account with its own rate is not exempted
    (NVCF's ValidRateLimitValues)."""

    rate_limit: Rate | None = None
    exempted_nca_ids: (
        Annotated[list[str], Check(_exempted, {"maxItems": MAX_RATE_ACCOUNTS}, before=True)] | None
    ) = None
    per_nca_id_rate: (
        Annotated[
            dict[str, Rate], Check(_per_account, {"maxProperties": MAX_RATE_ACCOUNTS}, before=True)
        ]
        | None
    ) = Field(default=None, description="a rate per account id")
    sync_check: StrictBool | None = None
    per_user_rate: Rate | None = Field(
        default=None, description="a rate applied to each caller identity on its own"
    )

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [{"required": [r]} for r in ("rateLimit", "perNcaIdRate", "perUserRate")]
        }
    )
    shape: ClassVar[str] = 'like {"rateLimit": "100-S"}'

    @model_validator(mode="after")
    def _between_fields(self) -> RateLimit:
        broken: list[tuple[str, str]] = []
        if self.rate_limit is None and self.per_nca_id_rate is None and self.per_user_rate is None:
            broken.append(("", "give at least one of rateLimit, perNcaIdRate or perUserRate"))
        if self.exempted_nca_ids and self.rate_limit is None:
            broken.append(
                (
                    "exemptedNcaIds",
                    "is allowed only with rateLimit, the rate they are exempted from",
                )
            )
        both = sorted(set(self.per_nca_id_rate or ()) & set(self.exempted_nca_ids or ()))
        if both:
            broken.append(
                (
                    "perNcaIdRate",
                    f"names accounts that exemptedNcaIds also lists ({', '.join(both)}); an "
                    "account has its own rate or is exempted, not both",
                )
            )
        if broken:
            raise_all(broken)
        return self


#: `models` and `resources`
Artifacts = Annotated[
    list[ArtifactIn],
    MaxItems(MAX_ARTIFACTS),
    Expect((list,), "must be a list of {name, version, uri}"),
]
Description = Annotated[str, Field(max_length=256)]


class FunctionCreate(RequestModel):
    """Body of `POST /functions` and `POST /functions/{id}/versions`."""

    # Field rules are declared here; the rules between fields are in validation.py.

    name: Annotated[
        str,
        Field(min_length=1, max_length=128),
        matches(
            NAME_RE.pattern,
            "'{value}' must start with a letter or digit and contain only letters, "
            "digits, '-' and '_'",
        ),
    ]
    inference_url: UriPath
    inference_port: Port | None = None
    container_image: str | None = Field(default=None, min_length=1, max_length=1024)
    #: NVCF's `PYTHON` / `GO` (the platform's own sidecar image) or an image reference
    utils_container_image: Annotated[
        str | None,
        Field(min_length=1, max_length=512),
        matches(
            rf"^(?:{'|'.join(UTILS_SELECTORS)})$|{IMAGE_RE.pattern}",
            "'{value}' is neither PYTHON, GO nor an image reference like "
            "registry.example.com/team/utils:1.0",
        ),
    ] = None
    helm_chart: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        examples=["oci://reg.example.com/acme/charts/inference-test-1.0.0.tgz"],
    )
    helm_chart_service_name: (
        Annotated[
            str,
            matches(
                DNS_1035_LABEL,
                "'{value}' must be a DNS-1035 label: at most 63 lower-case letters, "
                "digits and '-', starting with a letter and ending with a letter or digit",
            ),
        ]
        | None
    ) = Field(default=None, description="required with helmChart, only allowed with it")
    helm_validation_policy: HelmValidationPolicyIn | None = Field(
        default=None,
        description="helm functions only: the policy the chart is checked with at creation "
        "(not stored; each deployment specification names its own); some catalog cluster "
        "must permit it",
    )
    container_args: str | None = Field(default=None, max_length=4096)
    container_environment: (
        Annotated[
            list[KeyValueIn],
            MaxItems(MAX_ENVIRONMENT),
            Expect((list,), "must be a list of {key, value}"),
        ]
        | None
    ) = None
    models: (
        Annotated[
            list[ModelIn],
            MaxItems(MAX_ARTIFACTS),
            Expect((list,), "must be a list of {name, version, uri} or {name, llmConfig}"),
        ]
        | None
    ) = None
    resources: Artifacts | None = None
    api_body_format: Annotated[str, OneOf(API_BODY_FORMATS, "CUSTOM")] = "CUSTOM"
    function_type: Annotated[str, OneOf(FUNCTION_TYPES, "DEFAULT")] = "DEFAULT"
    health: HealthIn | None = None
    health_uri: UriPath | None = None
    description: Description | None = None
    tags: Tags | None = None
    secrets: (
        Annotated[
            list[SecretIn],
            MaxItems(MAX_SECRETS),
            Expect((list,), "must be a list of {name, value}"),
        ]
        | None
    ) = None
    rate_limit: RateLimit | None = None
    llm_invocation_config: LlmInvocationConfigIn | None = Field(
        default=None, description="LLM functions only; shared by every version of the function"
    )
    telemetries: TelemetriesIn | None = None


class FunctionMetadataUpdate(RequestModel):
    """Body of `PUT /functions/{id}/versions/{versionId}` (at least one field). `modelUpdates`
    and `llmInvocationConfig` (LLM functions) apply to every version of the function."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    tags: Tags | None = None
    description: Description | None = None
    rate_limit: RateLimit | None = None
    model_updates: (
        Annotated[
            list[ModelUpdateIn],
            MaxItems(MAX_ARTIFACTS),
            Expect((list,), "must be a list of {modelName, llmConfig}"),
        ]
        | None
    ) = Field(default=None, description="LLM functions: a model's tokenRateLimit/routingMethod")
    llm_invocation_config: LlmInvocationConfigIn | None = None


# --- sharing (NVCF's authorized parties, `/authorizations/functions/...`) --------------------

#: a function shared with every account is public, which only NVIDIA's operators make in NVCF
EVERY_ACCOUNT = "*"


def _account_id(value: str) -> str | None:
    if not value.strip():
        return "must not be blank"
    if value == EVERY_ACCOUNT:
        return "'*' (every account) cannot be authorized: a function cannot be made public here"
    return None


def _client_id(value: str) -> str | None:
    return "must not be only whitespace" if value and not value.strip() else None


class AuthorizedPartyIn(RequestModel):
    nca_id: Annotated[str, Field(min_length=1, max_length=MAX_ACCOUNT_ID), Check(_account_id)]
    client_id: Annotated[str, Field(max_length=MAX_ACCOUNT_ID), Check(_client_id)] | None = Field(
        default=None, description="accepted for compatibility; NVCF no longer uses it"
    )

    shape: ClassVar[str] = "with ncaId"


def _parties_list(value: Any) -> str | None:
    if value is None:
        return "is required: a non-empty list of {ncaId}"
    if not isinstance(value, list) or not value:
        return "must be a non-empty list of {ncaId}"
    return None


def _unique_accounts(parties: list[AuthorizedPartyIn]) -> list[str]:
    """NVCF: accounts are listed once, and a client id names one account."""
    messages: list[str] = []
    seen = [p.nca_id for p in parties]
    repeated = sorted({a for a in seen if seen.count(a) > 1})
    if repeated:
        messages.append(f"lists account(s) {', '.join(repeated)} more than once")
    clients = [p.client_id for p in parties if p.client_id]
    repeated = sorted({c for c in clients if clients.count(c) > 1})
    if repeated:
        messages.append(f"gives client id(s) {', '.join(repeated)} to more than one account")
    return messages


class AuthorizedPartiesRequest(RequestModel):
    """Body of `POST /authorizations/functions/{id}[/versions/{versionId}]`: the accounts the
    function (or the version) is shared with from now on."""

    null_when_missing: ClassVar[tuple[str, ...]] = ("authorizedParties",)

    authorized_parties: Annotated[
        list[AuthorizedPartyIn],
        Check(_parties_list, {"minItems": 1}, before=True),
        MaxItems(MAX_AUTHORIZED_PARTIES),
        Rules(lambda v: (v, _unique_accounts(v))),
    ]


class AuthorizedPartyPatch(RequestModel):
    """Body of `PATCH .../add` and `PATCH .../remove`."""

    authorized_party: AuthorizedPartyIn


DOC_MODELS: tuple[type[BaseModel], ...] = (
    FunctionCreate,
    FunctionMetadataUpdate,
    AuthorizedPartiesRequest,
    AuthorizedPartyPatch,
)
