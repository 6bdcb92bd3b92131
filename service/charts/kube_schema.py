"""Rendered objects against the Kubernetes OpenAPI schema of the target's version, and the
standard API versions of a Kubernetes version (what `.Capabilities.APIVersions` holds).

The schemas are those `kubernetes-validate` ships, one set per Kubernetes minor (its
`kubernetes-json-schema/v<version>-local/_definitions.json`: the OpenAPI definitions as JSON
Schema, every field nullable). A version's definitions are read once per process
(`schemas_for`) and indexed by the group/version/kind each resource definition declares.

Speed: `jsonschema` takes milliseconds per object through the definitions' `$ref`s, which
for a chart of hundreds of objects is more than the render. So each definition is compiled,
lazily and once per version, into a plain Python predicate (`_Compiler`) that understands
the few keywords these definitions use (`type`, `properties`, `additionalProperties`,
`items`, `required`, `enum`, `oneOf`, `$ref`) and answers "certainly valid" in microseconds.
Any other keyword makes the predicate answer "not sure". Only an object the predicate does
not pass is handed to `jsonschema`'s validator (built once per version and kind), which is
the authority: its errors become the findings, and when it finds none there is no finding.

Nulls: Kubernetes decodes `field: null` as an unset field (a chart writing `resources:` with
nothing under it is valid), so keys whose value is null are left out before checking.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from service.charts.findings import Finding, KubeObject, object_name, object_ref

#: Findings per object at most (a template broken everywhere says so in a few lines).
MAX_FINDINGS_PER_OBJECT = 20

_DEFS_URI = "https://kubernetes.io/api/_definitions.json"
_REF_PREFIXES = ("#/$defs/", "/api/_definitions.json#/$defs/", f"{_DEFS_URI}#/$defs/")
#: Keywords that only describe (they never make an instance invalid).
_ANNOTATIONS = frozenset({"description", "format", "default", "title", "example", "examples"})
_KNOWN = frozenset(
    {"type", "properties", "additionalProperties", "items", "required", "enum", "oneOf", "$ref"}
)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")

Check = Callable[[Any], bool]


def _never(_value: Any) -> bool:
    return False


def _is_integer(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and v.is_integer())


_TYPES: dict[str, Check] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": _is_integer,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def _type_check(names: tuple[str, ...]) -> Check:
    """The predicate of a `type` keyword (one type, or one type or null, are the usual)."""
    predicates = [_TYPES.get(n, _never) for n in names if n != "null"]
    nullable = "null" in names
    if len(predicates) == 1:
        only = predicates[0]
        if names in (("string",), ("string", "null")):
            return (lambda v: v is None or isinstance(v, str)) if nullable else only
        if names in (("object",), ("object", "null")):
            return (lambda v: v is None or isinstance(v, dict)) if nullable else only
        return (lambda v: v is None or only(v)) if nullable else only
    if not predicates:
        return _TYPES["null"] if nullable else _never
    return lambda v: (nullable and v is None) or any(p(v) for p in predicates)


class _Compiler:
    """Definitions → predicates "certainly valid" (False: invalid, or a keyword it does not
    know). Compiles each definition on first use; thread-safe enough (a race compiles twice
    and keeps either, both equal)."""

    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs
        self.compiled: dict[str, Check] = {}

    def definition(self, name: str) -> Check:
        known = self.compiled.get(name)
        if known is not None:
            return known
        schema = self.defs.get(name)
        if not isinstance(schema, dict):
            return _never
        slot: list[Check] = []
        # a definition referring to itself (directly or not) calls through the slot
        self.compiled[name] = lambda v: slot[0](v)
        compiled = self.node(schema)
        slot.append(compiled)
        self.compiled[name] = compiled
        return compiled

    def _ref(self, ref: Any) -> Check:
        if not isinstance(ref, str):
            return _never
        name = next((ref[len(p) :] for p in _REF_PREFIXES if ref.startswith(p)), None)
        if name is None:
            return _never
        target: list[Check] = []

        def lazy(v: Any) -> bool:
            if not target:
                target.append(self.definition(name))
            return target[0](v)

        return lazy

    def node(self, schema: Any) -> Check:
        if schema is True or schema == {}:
            return lambda v: True
        if not isinstance(schema, dict):
            return _never
        keys = {k for k in schema if not k.startswith("x-")} - _ANNOTATIONS
        if keys - _KNOWN:
            return _never
        types: Check | None = None
        if "type" in schema:
            names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            types = _type_check(tuple(str(n) for n in names))
        enum: frozenset[str] | None = None
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
                return _never
            enum = frozenset(values)
        ref = self._ref(schema["$ref"]) if "$ref" in schema else None
        props: dict[str, Check] | None = None
        if "properties" in schema:
            if not isinstance(schema["properties"], dict):
                return _never
            props = {k: self.node(s) for k, s in schema["properties"].items()}
        extra: Check | None = None
        if "additionalProperties" in schema:
            extra = self.node(schema["additionalProperties"])
        required: tuple[str, ...] = tuple(schema.get("required") or ())
        items = self.node(schema["items"]) if "items" in schema else None
        one_of: tuple[Check, ...] = ()
        if "oneOf" in schema:
            if not isinstance(schema["oneOf"], list):
                return _never
            one_of = tuple(self.node(s) for s in schema["oneOf"])
        return _assemble(types, enum, ref, props, extra, required, items, one_of)


def _assemble(
    types: Check | None,
    enum: frozenset[str] | None,
    ref: Check | None,
    props: dict[str, Check] | None,
    extra: Check | None,
    required: tuple[str, ...],
    items: Check | None,
    one_of: tuple[Check, ...],
) -> Check:
    """One node's predicate, specialised to the keywords it has (most nodes have one or two:
    a call per node is most of the cost)."""
    if enum is None and ref is None and not one_of:
        if props is None and extra is None and not required and items is None:
            return types or (lambda v: True)
        if items is None and not required and types is not None:
            fields = props or {}
            if extra is None:

                def members(v: Any) -> bool:
                    if not isinstance(v, dict) or not types(v):
                        return types(v)
                    for k, x in v.items():
                        if x is not None:
                            c = fields.get(k)
                            if c is not None and not c(x):
                                return False
                    return True

                return members
            if props is None:
                values = extra

                def mapping(v: Any) -> bool:
                    if not isinstance(v, dict) or not types(v):
                        return types(v)
                    return all(x is None or values(x) for x in v.values())

                return mapping
        if props is None and extra is None and not required and items is not None:
            each = items

            def sequence(v: Any) -> bool:
                if types is not None and not types(v):
                    return False
                return not isinstance(v, list) or all(each(x) for x in v)

            return sequence
    fields = props or {}

    def check(v: Any) -> bool:
        if types is not None and not types(v):
            return False
        if enum is not None and not (isinstance(v, str) and v in enum):
            return False
        if ref is not None and not ref(v):
            return False
        if isinstance(v, dict):
            for r in required:
                if v.get(r) is None:
                    return False
            if props is not None or extra is not None:
                for k, x in v.items():
                    if x is None:
                        continue  # null: an unset field
                    c = fields.get(k)
                    if c is None:
                        c = extra
                    if c is not None and not c(x):
                        return False
        elif items is not None and isinstance(v, list):
            for x in v:
                if not items(x):
                    return False
        return not one_of or sum(1 for c in one_of if c(v)) == 1

    return check


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def _kube_tuple(version: str) -> tuple[int, int] | None:
    match = _VERSION.match(version.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


@cache
def supported_minors() -> tuple[tuple[int, int], ...]:
    """The Kubernetes minors `kubernetes-validate` ships schemas for, oldest first."""
    from kubernetes_validate.utils import all_versions

    found = {_kube_tuple(v) for v in all_versions()}
    return tuple(sorted(v for v in found if v is not None))


@dataclass(frozen=True)
class SchemaVersion:
    """Which bundled schema validates a requested Kubernetes version: `minor` ("1.30"), and
    `note` when it is not the requested minor (the nearest one instead), saying so."""

    minor: str
    requested: str
    note: str | None = None


def schema_version(kube_version: str) -> SchemaVersion:
    """The bundled schema for `kube_version`: its own minor when shipped, else the nearest
    shipped minor (ties: the older), with a note saying so."""
    minors = supported_minors()
    wanted = _kube_tuple(kube_version)
    if not minors:
        raise RuntimeError("kubernetes-validate ships no schemas")
    if wanted in minors:
        assert wanted is not None
        return SchemaVersion(f"{wanted[0]}.{wanted[1]}", kube_version)
    if wanted is None:
        chosen = minors[-1]
        why = f"Kubernetes version {kube_version!r} is not a version number"
    else:
        chosen = min(minors, key=lambda m: (abs((m[0] - wanted[0]) * 1000 + m[1] - wanted[1]), m))
        why = f"no schema is bundled for Kubernetes {wanted[0]}.{wanted[1]}"
    first, last = minors[0], minors[-1]
    minor = f"{chosen[0]}.{chosen[1]}"
    return SchemaVersion(
        minor,
        kube_version,
        f"{why} (kubernetes-validate ships {first[0]}.{first[1]} to {last[0]}.{last[1]}); "
        f"objects were validated against Kubernetes {minor}, the nearest",
    )


GVK = tuple[str, str, str]


def _group_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


@dataclass
class KubeSchemas:
    """One Kubernetes minor's definitions: the resource index and compiled checks."""

    minor: str
    defs: dict[str, Any]
    #: (group, version, kind) → definition name, for resource definitions
    index: dict[GVK, str]
    _compiler: _Compiler = field(init=False)
    _validators: dict[str, Any] = field(init=False, default_factory=dict)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._compiler = _Compiler(self.defs)

    @property
    def groups(self) -> frozenset[str]:
        return frozenset(g for g, _, _ in self.index)

    def api_versions(self) -> tuple[str, ...]:
        """What a cluster of this version serves by default, as Helm's capabilities list it:
        every group/version and `group/version/Kind` of its resources, alpha versions left
        out (a cluster serves those only when switched on)."""
        out: set[str] = set()
        for group, version, kind in self.index:
            if "alpha" in version or kind.endswith("List"):
                continue
            gv = _group_version(group, version)
            out.add(gv)
            out.add(f"{gv}/{kind}")
        return tuple(sorted(out))

    def check(self, name: str) -> Check:
        return self._compiler.definition(name)

    def validator(self, name: str) -> Any:
        """`jsonschema`'s validator for one definition (built once)."""
        with self._lock:
            known = self._validators.get(name)
            if known is None:
                import jsonschema
                from referencing import Registry, Resource

                resource = Resource.from_contents(
                    {"$schema": "https://json-schema.org/draft/2020-12/schema", **self._root()}
                )
                registry: Registry[Any] = resource @ Registry()
                known = jsonschema.Draft202012Validator(
                    {"$ref": f"{_DEFS_URI}#/$defs/{name}"}, registry=registry
                )
                self._validators[name] = known
            return known

    def _root(self) -> dict[str, Any]:
        return {"$id": _DEFS_URI, "$defs": self.defs}


_LOADED: dict[str, KubeSchemas] = {}
_LOADING = threading.Lock()


def schemas_for(minor: str) -> KubeSchemas:
    """The definitions of a shipped minor ("1.30"), read from `kubernetes-validate` once."""
    known = _LOADED.get(minor)
    if known is not None:
        return known
    with _LOADING:
        known = _LOADED.get(minor)
        if known is None:
            known = _load(minor)
            _LOADED[minor] = known
    return known


def _load(minor: str) -> KubeSchemas:
    from kubernetes_validate.utils import all_versions, schema_contents

    full = next(v for v in all_versions() if _kube_tuple(v) == _kube_tuple(minor))
    data = schema_contents(f"kubernetes-json-schema/v{full}-local/_definitions.json", full)
    defs: dict[str, Any] = data["$defs"]
    index: dict[GVK, str] = {}
    for name, schema in defs.items():
        if name.startswith("io.k8s.apimachinery.") or not isinstance(schema, dict):
            continue  # meta types (DeleteOptions, WatchEvent, ...) name every group
        for gvk in schema.get("x-kubernetes-group-version-kind") or ():
            if isinstance(gvk, dict):
                key = (str(gvk.get("group") or ""), str(gvk.get("version")), str(gvk.get("kind")))
                index.setdefault(key, name)
    return KubeSchemas(minor, defs, index)


@cache
def standard_api_versions(kube_version: str) -> tuple[str, ...]:
    """The API versions a cluster of `kube_version` serves by default (nearest shipped
    minor when that one is not shipped)."""
    return schemas_for(schema_version(kube_version).minor).api_versions()


# --- validating objects ----------------------------------------------------------------------


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _message(error: Any) -> str:
    """A person's sentence for one `jsonschema` error (the field path comes separately)."""
    value = error.instance
    shown = json.dumps(value)[:80]
    if error.validator == "type":
        wanted = error.validator_value
        names = [t for t in (wanted if isinstance(wanted, list) else [wanted]) if t != "null"]
        expected = " or ".join(names) or "null"
        return f"must be {_article(expected)}, not the {_json_type(value)} {shown}"
    if error.validator == "required":
        return str(error.message)
    if error.validator == "oneOf":
        return (
            f"{shown} is not valid here (expected an integer or a string)"
            if isinstance(value, int | float | bool) or value is None
            else f"{shown} does not match the field's schema"
        )
    if error.validator == "enum":
        allowed = ", ".join(map(str, error.validator_value))
        return f"must be one of {allowed}, not {shown}"
    return str(error.message)


def _short(obj: KubeObject) -> str:
    return f"{obj.get('kind') or '?'}/{object_name(obj) or '?'}"


def validate_objects(
    objects: Sequence[KubeObject],
    kube_version: str,
    *,
    declared_api_versions: Iterable[str] = (),
) -> list[Finding]:
    """Schema findings for `objects` on a cluster of `kube_version`.

    - `schema-invalid` (error): a field of the wrong type, a missing required field or a
      value outside an enumeration, one finding per violation naming the object and path;
    - `api-version-unsupported` (error): an object of a built-in API group whose
      group/version/kind this Kubernetes version does not serve (and the cluster does not
      declare in `declared_api_versions`);
    - `schema-skipped` (info): objects of other groups (custom resources) are not checked,
      listed once;
    - `schema-version` (info): the requested version has no bundled schema; the nearest did.
    """
    chosen = schema_version(kube_version)
    schemas = schemas_for(chosen.minor)
    declared = set(declared_api_versions)
    findings: list[Finding] = []
    if chosen.note is not None:
        findings.append(Finding("schema-version", "info", None, None, chosen.note))
    groups = schemas.groups
    skipped: list[str] = []
    for obj in objects:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            continue  # other rules report objects without a type
        group, _, version = api_version.rpartition("/")
        name = schemas.index.get((group, version, kind))
        if name is None:
            if (group in groups or group == "") and api_version not in declared:
                served = sorted(
                    _group_version(g, v) for g, v, k in schemas.index if k == kind and g == group
                )
                findings.append(
                    Finding(
                        "api-version-unsupported",
                        "error",
                        object_ref(obj),
                        "apiVersion",
                        f"{_short(obj)}: Kubernetes {schemas.minor} does not serve {kind} in "
                        f"{api_version}"
                        + (f" (it serves {kind} in {', '.join(served)})" if served else ""),
                    )
                )
            else:
                label = f"{api_version}.{kind}"
                if label not in skipped:
                    skipped.append(label)
            continue
        if schemas.check(name)(obj):
            continue
        errors = schemas.validator(name).iter_errors(_strip_nulls(obj))
        for count, error in enumerate(
            sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])
        ):
            if count == MAX_FINDINGS_PER_OBJECT:
                findings.append(
                    Finding(
                        "schema-invalid",
                        "error",
                        object_ref(obj),
                        None,
                        f"{_short(obj)}: more schema violations not shown",
                    )
                )
                break
            where = _path(error.absolute_path)
            findings.append(
                Finding(
                    "schema-invalid",
                    "error",
                    object_ref(obj),
                    where or None,
                    f"{_short(obj)}: {where + ' ' if where else ''}{_message(error)} "
                    f"(Kubernetes {schemas.minor} schema)",
                )
            )
    if skipped:
        findings.append(
            Finding(
                "schema-skipped",
                "info",
                None,
                None,
                "no Kubernetes schema is known for "
                + ", ".join(skipped)
                + f" (not built into Kubernetes {schemas.minor}); not schema-validated",
            )
        )
    return findings


__all__ = [
    "KubeSchemas",
    "SchemaVersion",
    "schema_version",
    "schemas_for",
    "standard_api_versions",
    "supported_minors",
    "validate_objects",
]
