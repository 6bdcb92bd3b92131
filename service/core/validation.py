"""Request bodies checked by pydantic models; every violation becomes one `FieldError`.

A request model declares each field's type and limits once: the same declaration validates
the body and is what the OpenAPI document shows. Rules with a message of their own are
written as `Annotated` markers:

- `Check(test, schema)`: a rule on an already typed value; `test` returns the message of a
  violation (or None), `schema` is what the JSON schema gains (`pattern`, `maximum`…).
- `matches(regex, message)`: a `Check` for a pattern, `{value}` in the message is the value.
- `Rules(test, schema)`: like `Check`, for rules that may find several violations at once and
  that may normalise the value (`test` returns the value as kept and every message).
- `Expect(types, message)`: the value must be one of these JSON kinds before anything else is
  checked (`message` is followed by ", got a string" and the like).
- `OneOf(allowed, default)`: an enumeration matched case-insensitively, written canonically.

`parse(model, body)` returns the model or None and the list of violations, so a domain's
cross-field pass can add to that same list before one `ValidationFailed` is raised. Pydantic's
own error types are put in the service's words by `message_of`; status is always 400.

Field names are matched ignoring case, as Go clients decode JSON (the NVCF docs write
`inferenceURL`): `parse` first renames, in the body itself and in every nested object a
request model declares, each key that equals a field's wire name ignoring case
(`canonical_keys`), so the cross-field pass that reads the body sees the same names. An
exact-case key wins over a case-folded one; two keys folding to one field with no exact match
are a violation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, Literal, TypeVar, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError, core_schema

from service.core.errors import FieldError
from service.core.http import json_kind

#: RFC 1123 label (host names, Kubernetes object names): 1-63 lower-case letters, digits, '-'.
DNS_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
DNS_LABEL_RE = re.compile(DNS_LABEL)
#: RFC 1035 label (Kubernetes Service names): as DNS_LABEL but starting with a letter.
DNS_1035_LABEL = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_1035_LABEL_RE = re.compile(DNS_1035_LABEL)

M = TypeVar("M", bound=BaseModel)


class RequestModel(BaseModel):
    """Base of request bodies: camelCase names only (the wire names), unknown fields ignored.

    `shape` words what the object should be ("with key and value") when it is not one.
    `null_when_missing` fields are seen as null when absent, so that their own rule words
    the "is required" message.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="ignore")
    shape: ClassVar[str] = ""
    null_when_missing: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _is_object(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            what = f"must be an object {cls.shape}" if cls.shape else "must be an object"
            _raise(f"{what}, got {json_kind(value)}")
        if cls.null_when_missing:
            value = {**dict.fromkeys(cls.null_when_missing), **value}
        return value


def _raise(message: str) -> None:
    raise PydanticCustomError("rule", message)


def raise_all(violations: Sequence[tuple[str, str]]) -> None:
    """Raise every (field, message) violation at once from a model validator; the field is
    relative to the model ("" for the model itself)."""
    raise PydanticValidationError.from_exception_data(
        "rules",
        [
            InitErrorDetails(
                type=PydanticCustomError("rule", message), loc=(where,) if where else (), input=None
            )
            for where, message in violations
        ],
    )


class Rule:
    """Base of the annotations that validate a field with this service's own messages.

    `mode` says when `_run` sees the value (`before` its type, `after` it, or `wrap` around
    it); `json_schema()` is what the annotation adds to the field's OpenAPI schema.
    """

    mode: ClassVar[Literal["before", "after", "wrap"]] = "before"

    def _run(self, value: Any, *args: Any) -> Any:
        raise NotImplementedError

    def json_schema(self) -> Mapping[str, Any]:
        return {}

    def _mode(self) -> Literal["before", "after", "wrap"]:
        return self.mode

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        mode = self._mode()
        if mode == "wrap":
            return core_schema.no_info_wrap_validator_function(self._run, handler(source))
        if mode == "after":
            return core_schema.no_info_after_validator_function(self._run, handler(source))
        return core_schema.no_info_before_validator_function(self._run, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out.update(self.json_schema())
        return out


@dataclass(frozen=True, eq=False)  # hashed by identity: typing hashes Annotated metadata
class Check(Rule):
    """A rule on a typed value with its own message; `schema` documents it in OpenAPI."""

    test: Callable[[Any], str | None]
    schema: Mapping[str, Any] = field(default_factory=dict)
    #: check the raw input before its type (for a message that covers both)
    before: bool = False

    def _mode(self) -> Literal["before", "after", "wrap"]:
        return "before" if self.before else "after"

    def json_schema(self) -> Mapping[str, Any]:
        return self.schema

    def _run(self, value: Any, *_: Any) -> Any:
        message = self.test(value)
        if message is not None:
            _raise(message)
        return value


@dataclass(frozen=True, eq=False)
class Rules(Rule):
    """Rules on a typed value that may each be broken: `test` returns the value as kept
    (normalised, or as given) and the message of every violation; `schema` documents them."""

    test: Callable[[Any], tuple[Any, Sequence[str]]]
    schema: Mapping[str, Any] = field(default_factory=dict)
    mode: ClassVar[Literal["before", "after", "wrap"]] = "after"

    def json_schema(self) -> Mapping[str, Any]:
        return self.schema

    def _run(self, value: Any, *_: Any) -> Any:
        kept, messages = self.test(value)
        if len(messages) == 1:
            _raise(messages[0])
        if messages:
            raise_all([("", m) for m in messages])
        return kept


def matches(regex: str, message: str) -> Check:
    """`value` must match `regex` (Python `re.match`); `{value}` in `message` is the value."""
    compiled = re.compile(regex)

    def test(value: str) -> str | None:
        return None if compiled.match(value) else message.format(value=value)

    return Check(test, {"pattern": regex})


def int_between(low: int, high: int) -> Check:
    def test(value: int) -> str | None:
        return None if low <= value <= high else f"must be between {low} and {high}, got {value}"

    return Check(test, {"minimum": low, "maximum": high})


@dataclass(frozen=True)
class MaxItems(Rule):
    """At most `limit` items; a longer list still has each of its items checked."""

    limit: int
    mode: ClassVar[Literal["before", "after", "wrap"]] = "wrap"

    def json_schema(self) -> Mapping[str, Any]:
        return {"maxItems": self.limit}

    def _run(self, value: Any, *args: Any) -> Any:
        handler: core_schema.ValidatorFunctionWrapHandler = args[0]
        if not isinstance(value, list) or len(value) <= self.limit:
            return handler(value)
        message = f"must have at most {self.limit} items, got {len(value)}"
        errors = [InitErrorDetails(type=PydanticCustomError("rule", message), loc=(), input=value)]
        try:
            handler(value)
        except PydanticValidationError as exc:
            errors += [
                InitErrorDetails(
                    type=PydanticCustomError("rule", message_of(e)), loc=tuple(e["loc"]), input=None
                )
                for e in exc.errors(include_url=False)
            ]
        raise PydanticValidationError.from_exception_data("list", errors)


@dataclass(frozen=True)
class Expect(Rule):
    """Before anything else: the value must be one of `types` (JSON kinds); None = missing."""

    types: tuple[type, ...]
    message: str

    def _run(self, value: Any, *_: Any) -> Any:
        if value is None:
            raise PydanticCustomError("missing", "is required")
        if isinstance(value, bool) and bool not in self.types:
            _raise(f"{self.message}, got {json_kind(value)}")
        if not isinstance(value, self.types):
            _raise(f"{self.message}, got {json_kind(value)}")
        return value


@dataclass(frozen=True)
class OneOf(Rule):
    """A string from `allowed`, any case, returned as written in `allowed`; null = `default`."""

    allowed: tuple[str, ...]
    default: str | None = None

    def json_schema(self) -> Mapping[str, Any]:
        return {"enum": list(self.allowed)}

    def _run(self, value: Any, *_: Any) -> Any:
        if value is None:
            if self.default is None:
                raise PydanticCustomError("missing", "is required")
            return self.default
        choices = ", ".join(self.allowed)
        if not isinstance(value, str):
            _raise(f"must be one of {choices}, got {json_kind(value)}")
        for name in self.allowed:
            if name.lower() == value.lower():
                return name
        _raise(f"must be one of {choices}, got '{value}'")


def never_null(schema: dict[str, Any]) -> None:
    """`json_schema_extra` of a field that may be left out but is refused as null (a `Check`
    says so): documents only its non-null form."""
    options = [o for o in schema.pop("anyOf", []) if o.get("type") != "null"]
    if len(options) == 1:
        schema.update(options[0])
    schema.pop("default", None)


def path_of(loc: tuple[int | str, ...]) -> str:
    """`('containerEnvironment', 0, 'value')` -> `containerEnvironment[0].value`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "body"


_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "bool_type": "a boolean",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def message_of(error: ErrorDetails) -> str:
    """One pydantic error in the service's words (api.md's wording of each rule)."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "missing" or (kind in _TYPE_WORDS and value is None):
        return "is required"
    if kind in _TYPE_WORDS:
        return f"must be {_TYPE_WORDS[kind]}, got {json_kind(value)}"
    if kind == "string_too_short":
        low = int(ctx.get("min_length", 1))
        return "must not be empty" if low <= 1 else f"must be at least {low} characters"
    if kind == "string_too_long":
        length = len(value) if isinstance(value, str) else "more"
        return f"must be at most {ctx.get('max_length')} characters, got {length}"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items, got {ctx.get('actual_length')}"
    if kind == "too_short":
        low = int(ctx.get("min_length", 1))
        return "must not be empty" if low <= 1 else f"must have at least {low} items"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        sign = {"greater_than_equal": "≥", "greater_than": ">", "less_than_equal": "≤"}
        bound = next(iter(ctx.values()), "?")
        return f"must be {sign.get(kind, '<')} {bound}, got {value!r}"
    return str(error["msg"])


def field_errors(exc: PydanticValidationError, prefix: str = "") -> list[FieldError]:
    out: list[FieldError] = []
    for error in exc.errors(include_url=False):
        where = path_of(tuple(error["loc"]))
        if prefix:
            where = f"{prefix}{where}" if where.startswith("[") else f"{prefix}.{where}"
        out.append(FieldError(where, message_of(error)))
    return out


@cache
def _wire_fields(model: type[BaseModel]) -> dict[str, tuple[str, type[BaseModel] | None]]:
    """A model's fields by case-folded wire name: (wire name, the model its value is, or its
    items are, when it is one)."""
    out: dict[str, tuple[str, type[BaseModel] | None]] = {}
    for name, info in model.model_fields.items():
        wire = info.validation_alias if isinstance(info.validation_alias, str) else None
        wire = wire or info.alias or name
        out[wire.casefold()] = (wire, _model_in(info.annotation))
    return out


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The request model inside a field's type (`list[X] | None`, `Annotated[X, ...]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def canonical_keys(model: type[BaseModel], value: Any, path: str = "") -> list[FieldError]:
    """Rename in place every key of `value` (an object, or a list of objects, of `model`)
    that equals one of its fields' wire names ignoring case, recursively into nested models.

    An exact-case key wins (a folded duplicate is left as an unknown, ignored key); two keys
    folding to the same field without an exact one are each left alone and reported."""
    if isinstance(value, list):
        return [
            e for i, item in enumerate(value) for e in canonical_keys(model, item, f"{path}[{i}]")
        ]
    if not isinstance(value, dict):
        return []
    fields = _wire_fields(model)
    folded: dict[str, list[str]] = {}
    for key in value:
        hit = fields.get(key.casefold()) if isinstance(key, str) else None
        if hit is not None and key != hit[0] and hit[0] not in value:
            folded.setdefault(hit[0], []).append(key)
    errors: list[FieldError] = []
    renames: dict[str, str] = {}
    for wire, keys in folded.items():
        if len(keys) == 1:
            renames[keys[0]] = wire
            continue
        given = ", ".join(f"'{k}'" for k in keys)
        errors.append(
            FieldError(
                f"{path}.{wire}" if path else wire,
                f"is given {len(keys)} times in different cases ({given}); give it once",
            )
        )
    if renames:
        items = [(renames.get(k, k), v) for k, v in value.items()]
        value.clear()
        value.update(items)
    for wire, nested in fields.values():
        if nested is not None and wire in value:
            errors += canonical_keys(nested, value[wire], f"{path}.{wire}" if path else wire)
    return errors


def parse(model: type[M], body: Mapping[str, Any]) -> tuple[M | None, list[FieldError]]:
    """`body` checked against `model`: the model (None if any field is wrong) and every
    violation of every field. Keys naming a field in another case are renamed in `body` first
    (`canonical_keys`)."""
    clashes = canonical_keys(model, body)
    try:
        validated = model.model_validate(body)
    except PydanticValidationError as exc:
        clashing = failed(clashes)
        return None, clashes + [e for e in field_errors(exc) if e.field not in clashing]
    return (None, clashes) if clashes else (validated, [])


def failed(errors: list[FieldError]) -> set[str]:
    """The field paths that already have a violation (cross-field rules skip them)."""
    return {e.field for e in errors}
