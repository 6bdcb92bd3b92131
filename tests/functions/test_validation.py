"""Every rule of api.md §2.1–2.2: a passing and a failing case each, checked without a server."""

from __future__ import annotations

from typing import Any

import pytest

from service.core.errors import ValidationFailed
from service.functions.validation import (
    UtilsImages,
    image_repository,
    utils_image,
    validate_create,
    validate_metadata_update,
)

BASE: dict[str, Any] = {
    "name": "echo",
    "inferenceUrl": "/echo",
    "containerImage": "nvcr.io/acme/echo:1",
}
HELM: dict[str, Any] = {
    "name": "helm-fn",
    "inferenceUrl": "/infer",
    "inferencePort": 8000,
    "helmChart": "oci://reg.example.com/acme/charts/inference-test-1.0.0.tgz",
    "helmChartServiceName": "entrypoint",
}


def errors_of(body: Any) -> list[tuple[str, str]]:
    with pytest.raises(ValidationFailed) as info:
        validate_create(body)
    return [(e.field, e.message) for e in info.value.errors]


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(base)
    for k, v in changes.items():
        if v is ...:
            out.pop(k, None)
        else:
            out[k] = v
    return out


PASSING: list[tuple[str, dict[str, Any]]] = [
    ("minimal container", BASE),
    ("name with - and _", with_(BASE, name="My_echo-2")),
    ("name of 128 chars", with_(BASE, name="a" * 128)),
    ("relative inference url", with_(BASE, inferenceUrl="v2/models/m/versions/1/infer")),
    ("port bounds", with_(BASE, inferencePort=65535)),
    ("port low bound", with_(BASE, inferencePort=1)),
    ("helm function", HELM),
    (
        "helm plain oci ref",
        with_(HELM, helmChart="oci://reg.example.com:5000/acme/inference-test:1.0.0"),
    ),
    ("helm https", with_(HELM, helmChart="https://charts.example.com/acme/inference-test-v1.tgz")),
    ("helm version v1", with_(HELM, helmChart="oci://reg.example.com/a/chart-v1.tgz")),
    ("service name 63", with_(HELM, helmChartServiceName="a" * 63)),
    (
        "models only",
        {
            "name": "m",
            "inferenceUrl": "/x",
            "models": [{"name": "a", "version": "1", "uri": "s3://b"}],
        },
    ),
    (
        "health full",
        with_(
            BASE,
            health={
                "protocol": "grpc",
                "uri": "/h",
                "port": 9000,
                "timeout": "PT1M30S",
                "expectedStatusCode": 204,
            },
        ),
    ),
    (
        "env",
        with_(BASE, containerEnvironment=[{"key": "A", "value": "1"}, {"key": "B", "value": ""}]),
    ),
    ("enums any case", with_(BASE, apiBodyFormat="predict_v2", functionType="streaming")),
    ("description 256", with_(BASE, description="d" * 256)),
    ("64 tags", with_(BASE, tags=[f"t{i}" for i in range(64)])),
    ("tag charset", with_(BASE, tags=["a-b_c:d=e"])),
    (
        "secrets",
        with_(
            BASE, secrets=[{"name": "K.ey-1_x", "value": "v"}, {"name": "json", "value": {"a": 1}}]
        ),
    ),
    ("secret max", with_(BASE, secrets=[{"name": "s" * 48, "value": "x" * 32768}])),
    ("rate limit", with_(BASE, rateLimit={"rateLimit": "100-S, 5000-H"})),
    ("per-account rate only", with_(BASE, rateLimit={"perNcaIdRate": {"acme": "5-S"}})),
    ("per-user rate only", with_(BASE, rateLimit={"perUserRate": "10-M"})),
    (
        "all rates",
        with_(
            BASE,
            rateLimit={
                "rateLimit": "100-S",
                "exemptedNcaIds": ["ops"],
                "perNcaIdRate": {"acme": "5-S,100-H"},
                "perUserRate": "1-S",
                "syncCheck": True,
            },
        ),
    ),
    ("unknown field ignored", with_(BASE, somethingElse=True)),
]


@pytest.mark.parametrize(("case", "body"), PASSING, ids=[c for c, _ in PASSING])
def test_valid_bodies_pass(case: str, body: dict[str, Any]) -> None:
    validate_create(body)


FAILING: list[tuple[str, dict[str, Any], str, str]] = [
    ("name missing", with_(BASE, name=...), "name", "is required"),
    ("name empty", with_(BASE, name=""), "name", "empty"),
    ("name too long", with_(BASE, name="a" * 129), "name", "at most 128"),
    ("name symbol", with_(BASE, name="echo!"), "name", "only letters"),
    ("name leading dash", with_(BASE, name="-echo"), "name", "must start"),
    ("name not string", with_(BASE, name=3), "name", "must be a string"),
    ("inferenceUrl missing", with_(BASE, inferenceUrl=...), "inferenceUrl", "is required"),
    (
        "inferenceUrl absolute",
        with_(BASE, inferenceUrl="http://x/y"),
        "inferenceUrl",
        "not an absolute URL",
    ),
    (
        "inferenceUrl space",
        with_(BASE, inferenceUrl="/a b"),
        "inferenceUrl",
        "not a valid URI path",
    ),
    ("port zero", with_(BASE, inferencePort=0), "inferencePort", "between 1 and 65535"),
    ("port high", with_(BASE, inferencePort=65536), "inferencePort", "between 1 and 65535"),
    ("port string", with_(BASE, inferencePort="80"), "inferencePort", "must be an integer"),
    ("port bool", with_(BASE, inferencePort=True), "inferencePort", "must be an integer"),
    (
        "no artifact",
        with_(BASE, containerImage=...),
        "containerImage",
        "one of containerImage, helmChart or models",
    ),
    (
        "helm with image",
        with_(HELM, containerImage="x"),
        "containerImage",
        "cannot be used together with helmChart",
    ),
    (
        "helm with args",
        with_(HELM, containerArgs="--x"),
        "containerArgs",
        "cannot be used together with helmChart",
    ),
    (
        "helm with env",
        with_(HELM, containerEnvironment=[{"key": "A", "value": "b"}]),
        "containerEnvironment",
        "cannot be used together with helmChart",
    ),
    (
        "helm without service",
        with_(HELM, helmChartServiceName=...),
        "helmChartServiceName",
        "is required with helmChart",
    ),
    (
        "service without helm",
        with_(BASE, helmChartServiceName="entrypoint"),
        "helmChartServiceName",
        "only allowed together with helmChart",
    ),
    (
        "service upper",
        with_(HELM, helmChartServiceName="Entry"),
        "helmChartServiceName",
        "DNS-1035",
    ),
    (
        "service digit first",
        with_(HELM, helmChartServiceName="1entry"),
        "helmChartServiceName",
        "DNS-1035",
    ),
    (
        "service too long",
        with_(HELM, helmChartServiceName="a" * 64),
        "helmChartServiceName",
        "DNS-1035",
    ),
    (
        "service trailing dash",
        with_(HELM, helmChartServiceName="entry-"),
        "helmChartServiceName",
        "DNS-1035",
    ),
    (
        "chart version dash",
        with_(HELM, helmChart="oci://reg.example.com/a/chart-v1-test.tgz"),
        "helmChart",
        "may not contain '-'",
    ),
    (
        "chart name underscore",
        with_(HELM, helmChart="oci://reg.example.com/a/my_chart-1.0.0.tgz"),
        "helmChart",
        "underscore",
    ),
    (
        "chart scheme",
        with_(HELM, helmChart="http://reg.example.com/a/chart-1.0.0.tgz"),
        "helmChart",
        "oci",
    ),
    (
        "chart no version",
        with_(HELM, helmChart="oci://reg.example.com/a/chart.tgz"),
        "helmChart",
        "version",
    ),
    ("health partial", with_(BASE, health={"protocol": "HTTP"}), "health.uri", "is required"),
    (
        "health protocol",
        with_(
            BASE,
            health={
                "protocol": "TCP",
                "uri": "/h",
                "port": 1,
                "timeout": "PT1S",
                "expectedStatusCode": 200,
            },
        ),
        "health.protocol",
        "HTTP, gRPC",
    ),
    (
        "health timeout",
        with_(
            BASE,
            health={
                "protocol": "HTTP",
                "uri": "/h",
                "port": 1,
                "timeout": "10s",
                "expectedStatusCode": 200,
            },
        ),
        "health.timeout",
        "ISO-8601",
    ),
    (
        "health code",
        with_(
            BASE,
            health={
                "protocol": "HTTP",
                "uri": "/h",
                "port": 1,
                "timeout": "PT1S",
                "expectedStatusCode": 600,
            },
        ),
        "health.expectedStatusCode",
        "between 100 and 599",
    ),
    (
        "health port",
        with_(
            BASE,
            health={
                "protocol": "HTTP",
                "uri": "/h",
                "port": 0,
                "timeout": "PT1S",
                "expectedStatusCode": 200,
            },
        ),
        "health.port",
        "between 1 and 65535",
    ),
    (
        "env reserved",
        with_(BASE, containerEnvironment=[{"key": "NVCF_X", "value": "1"}]),
        "containerEnvironment[0].key",
        "reserved",
    ),
    (
        "env duplicate",
        with_(BASE, containerEnvironment=[{"key": "A", "value": "1"}, {"key": "A", "value": "2"}]),
        "containerEnvironment[1].key",
        "more than once",
    ),
    (
        "env not list",
        with_(BASE, containerEnvironment={"A": "1"}),
        "containerEnvironment",
        "must be a list",
    ),
    ("models incomplete", with_(BASE, models=[{"name": "a"}]), "models[0].version", "is required"),
    ("resources not list", with_(BASE, resources="x"), "resources", "must be a list"),
    ("apiBodyFormat", with_(BASE, apiBodyFormat="XML"), "apiBodyFormat", "CUSTOM, PREDICT_V2"),
    ("functionType", with_(BASE, functionType="BATCH"), "functionType", "DEFAULT, STREAMING, LLM"),
    ("description long", with_(BASE, description="d" * 257), "description", "at most 256"),
    ("too many tags", with_(BASE, tags=[f"t{i}" for i in range(65)]), "tags", "at most 64"),
    ("tag long", with_(BASE, tags=["t" * 129]), "tags[0]", "at most 128"),
    ("tag charset", with_(BASE, tags=["a b"]), "tags[0]", "may contain only"),
    (
        "secret name",
        with_(BASE, secrets=[{"name": ".x", "value": "v"}]),
        "secrets[0].name",
        "must start",
    ),
    (
        "secret name long",
        with_(BASE, secrets=[{"name": "s" * 49, "value": "v"}]),
        "secrets[0].name",
        "at most 48",
    ),
    (
        "secret empty",
        with_(BASE, secrets=[{"name": "a", "value": ""}]),
        "secrets[0].value",
        "1 to 32768",
    ),
    (
        "secret huge",
        with_(BASE, secrets=[{"name": "a", "value": "x" * 32769}]),
        "secrets[0].value",
        "1 to 32768",
    ),
    (
        "secret dup",
        with_(BASE, secrets=[{"name": "a", "value": "1"}, {"name": "a", "value": "2"}]),
        "secrets[1].name",
        "more than once",
    ),
    (
        "secret number",
        with_(BASE, secrets=[{"name": "a", "value": 5}]),
        "secrets[0].value",
        "string or an object",
    ),
    (
        "rate pattern",
        with_(BASE, rateLimit={"rateLimit": "100/S"}),
        "rateLimit.rateLimit",
        "<count>-<unit>",
    ),
    (
        "rate count of 4,301 digits",
        with_(BASE, rateLimit={"rateLimit": "9" * 4301 + "-S"}),
        "rateLimit.rateLimit",
        "<count>-<unit>",
    ),
    (
        "rate count in other digits",
        with_(BASE, rateLimit={"rateLimit": "٣-S"}),
        "rateLimit.rateLimit",
        "<count>-<unit>",
    ),
    (
        "rate zero",
        with_(BASE, rateLimit={"rateLimit": "0-S"}),
        "rateLimit.rateLimit",
        "<count>-<unit>",
    ),
    (
        "rate unit twice",
        with_(BASE, rateLimit={"rateLimit": "1-S,2-S"}),
        "rateLimit.rateLimit",
        "more than once",
    ),
    ("rate missing", with_(BASE, rateLimit={}), "rateLimit", "at least one of rateLimit"),
    (
        "exempted without rate",
        with_(BASE, rateLimit={"perUserRate": "1-S", "exemptedNcaIds": ["a"]}),
        "rateLimit.exemptedNcaIds",
        "only with rateLimit",
    ),
    (
        "exempted and own rate",
        with_(
            BASE,
            rateLimit={"rateLimit": "1-S", "exemptedNcaIds": ["a"], "perNcaIdRate": {"a": "2-S"}},
        ),
        "rateLimit.perNcaIdRate",
        "exemptedNcaIds also lists (a)",
    ),
    (
        "per-account rate pattern",
        with_(BASE, rateLimit={"perNcaIdRate": {"acme": "5/S"}}),
        "rateLimit.perNcaIdRate.acme",
        "<count>-<unit>",
    ),
    (
        "per-account rates not an object",
        with_(BASE, rateLimit={"perNcaIdRate": ["acme"]}),
        "rateLimit.perNcaIdRate",
        "object of account id to rate",
    ),
    (
        "per-account rates over 32",
        with_(BASE, rateLimit={"perNcaIdRate": {f"a{i}": "1-S" for i in range(33)}}),
        "rateLimit.perNcaIdRate",
        "at most 32 accounts",
    ),
    (
        "exempted over 32",
        with_(BASE, rateLimit={"rateLimit": "1-S", "exemptedNcaIds": [str(i) for i in range(33)]}),
        "rateLimit.exemptedNcaIds",
        "at most 32 items",
    ),
    (
        "per-user rate unit twice",
        with_(BASE, rateLimit={"perUserRate": "1-H,2-H"}),
        "rateLimit.perUserRate",
        "more than once",
    ),
]


@pytest.mark.parametrize(
    ("case", "body", "field", "fragment"), FAILING, ids=[c[0] for c in FAILING]
)
def test_each_rule_rejects(case: str, body: dict[str, Any], field: str, fragment: str) -> None:
    errors = errors_of(body)
    assert any(f == field and fragment in m for f, m in errors), errors


def test_body_must_be_object() -> None:
    assert errors_of([1, 2]) == [("body", "must be a JSON object, got a list")]


def test_every_violation_is_listed_with_its_field() -> None:
    body = {
        "name": "bad name",
        "inferenceUrl": "http://x",
        "inferencePort": 0,
        "helmChart": "oci://reg.example.com/a/my_chart-1.0-rc1.tgz",
        "containerImage": "img",
        "tags": ["ok", "not ok"],
        "secrets": [{"name": "NVCF", "value": ""}],
    }
    fields = [f for f, _ in errors_of(body)]
    for expected in (
        "name",
        "inferenceUrl",
        "inferencePort",
        "containerImage",
        "helmChartServiceName",
        "helmChart",
        "tags[1]",
        "secrets[0].value",
    ):
        assert expected in fields
    assert fields.count("helmChart") == 2  # the underscore and the '-' in the version


def test_health_defaults_follow_the_grpc_rule() -> None:
    http = validate_create(with_(BASE, inferencePort=9000, healthUri="/ready"))
    assert http.health == {
        "protocol": "HTTP",
        "uri": "/ready",
        "port": 9000,
        "timeout": "PT10S",
        "expectedStatusCode": 200,
    }
    grpc = validate_create(with_(BASE, inferenceUrl="/gRPC"))
    assert grpc.health["protocol"] == "gRPC"
    assert grpc.health["uri"] == "/v2/health/ready"
    assert grpc.health["port"] == 8000


def test_defaults_and_normalisation() -> None:
    spec = validate_create(with_(BASE, apiBodyFormat="predict_v2", tags=["a", "a", "b"]))
    assert spec.api_body_format == "PREDICT_V2"
    assert spec.function_type == "DEFAULT"
    assert spec.description == "echo"
    assert spec.tags == ["a", "b"]


def test_secret_values_never_appear_in_errors() -> None:
    errors = errors_of(with_(BASE, secrets=[{"name": "a", "value": "TOPSECRET" * 4000}]))
    assert all("TOPSECRET" not in m for _, m in errors)


def test_metadata_update_rules() -> None:
    with pytest.raises(ValidationFailed) as info:
        validate_metadata_update({})
    assert info.value.errors[0].message.startswith("at least one of")
    with pytest.raises(ValidationFailed) as info:
        validate_metadata_update(
            {"tags": ["a b"], "description": "x" * 300, "rateLimit": {"rateLimit": "x"}}
        )
    assert [e.field for e in info.value.errors] == ["tags[0]", "description", "rateLimit.rateLimit"]
    upd = validate_metadata_update({"description": "new"})
    assert upd.description == "new" and upd.tags is None


@pytest.mark.parametrize("value", [True, "x", 3, {"key": "A"}])
def test_lists_of_the_wrong_json_kind_are_refused_not_crashed_on(value: Any) -> None:
    # the uniqueness pass once iterated whatever it found (a 500 for `true`)
    body = {**BASE, "containerEnvironment": value, "secrets": value}
    with pytest.raises(ValidationFailed) as caught:
        validate_create(body)
    fields = {e.field for e in caught.value.errors}
    assert {"containerEnvironment", "secrets"} <= fields


def test_utils_container_image_is_a_selector_or_an_allowed_image() -> None:
    base = {"name": "f", "inferenceUrl": "/x", "containerImage": "nvcr.io/a/b:1"}
    policy = UtilsImages(frozenset({"registry.example.com"}), "nvcf-server:latest")
    for given, used in (
        ("PYTHON", None),
        ("GO", None),
        ("registry.example.com/team/utils:2", "registry.example.com/team/utils:2"),
        ("nvcf-server:1.2", "nvcf-server:1.2"),  # another tag of the operator's own
        ("docker.io/library/nvcf-server", "docker.io/library/nvcf-server"),
    ):
        spec = validate_create({**base, "utilsContainerImage": given}, utils_images=policy)
        assert spec.utils_container_image == given
        assert utils_image(spec.utils_container_image) == used
    for given, fragment in (
        ("acme/nvcf-server:1", "registry 'docker.io' is not among"),
        ("elsewhere.example.org/u:1", "registry 'elsewhere.example.org' is not among"),
        ("UPPER/case", "neither PYTHON, GO nor an image reference"),
        ("", "must not be empty"),
    ):
        with pytest.raises(ValidationFailed) as caught:
            validate_create({**base, "utilsContainerImage": given}, utils_images=policy)
        [error] = caught.value.errors
        assert error.field == "utilsContainerImage" and fragment in error.message, error
    # without a policy (no operator image, no registries) only the selectors pass
    with pytest.raises(ValidationFailed):
        validate_create({**base, "utilsContainerImage": "registry.example.com/u:1"})
    assert image_repository("localhost:5000/u:2") == "localhost:5000/u"
    assert image_repository("reg.io/x@sha256:" + "a" * 64) == "reg.io/x"
