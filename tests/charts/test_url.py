"""Table-driven tests of helmChart URL parsing (api.md §2.2) and the SSRF host guard."""

from __future__ import annotations

import socket
from collections.abc import Sequence

import pytest

from service.charts import netguard
from service.charts.url import (
    ChartRef,
    ChartUrlError,
    check_host,
    forbidden_reason,
    parse_chart_url,
    redact_url,
)
from service.core.errors import BadGateway, BadRequest

VALID = [
    # file-name form
    (
        "oci://reg.example.com/acme/charts/inference-test-1.0.0.tgz",
        (
            "oci",
            "reg.example.com",
            "reg.example.com",
            None,
            "acme/charts/inference-test",
            "inference-test",
            "1.0.0",
        ),
    ),
    # plain OCI reference form
    (
        "oci://reg.example.com:5000/acme/inference-test:1.0.0",
        (
            "oci",
            "reg.example.com:5000",
            "reg.example.com",
            5000,
            "acme/inference-test",
            "inference-test",
            "1.0.0",
        ),
    ),
    # https archive form
    (
        "https://charts.example.com/stable/mychart-2.1.tgz",
        (
            "https",
            "charts.example.com",
            "charts.example.com",
            None,
            "stable/mychart",
            "mychart",
            "2.1",
        ),
    ),
    # v-prefixed single-number version
    (
        "oci://reg.example.com/my-chart-v1.tgz",
        ("oci", "reg.example.com", "reg.example.com", None, "my-chart", "my-chart", "v1"),
    ),
    # digits inside the name: split at the LAST part starting with a digit
    (
        "oci://reg.example.com/a/chart-2-1.0.tgz",
        ("oci", "reg.example.com", "reg.example.com", None, "a/chart-2", "chart-2", "1.0"),
    ),
    # host is lowercased, IPv4 and IPv6 literals
    (
        "oci://REG.Example.COM/x/c:1",
        ("oci", "reg.example.com", "reg.example.com", None, "x/c", "c", "1"),
    ),
    (
        "oci://127.0.0.1:5000/c-0.1.0.tgz",
        ("oci", "127.0.0.1:5000", "127.0.0.1", 5000, "c", "c", "0.1.0"),
    ),
    (
        "oci://[::1]:5000/team/c:1.2.3",
        ("oci", "[::1]:5000", "::1", 5000, "team/c", "c", "1.2.3"),
    ),
    # OCI repository components may contain '.', '_' and '-'
    (
        "oci://reg.example.com/my_org/sub.dir/c:1.0",
        ("oci", "reg.example.com", "reg.example.com", None, "my_org/sub.dir/c", "c", "1.0"),
    ),
]


@pytest.mark.parametrize(("url", "expected"), VALID, ids=[u for u, _ in VALID])
def test_valid_urls(url: str, expected: tuple[object, ...]) -> None:
    ref = parse_chart_url(url)
    assert (
        ref.scheme,
        ref.host,
        ref.hostname,
        ref.port,
        ref.repository,
        ref.name,
        ref.version,
    ) == expected
    assert ref.url == url


def test_oci_reference_translates_file_name_form() -> None:
    ref = parse_chart_url("oci://reg.example.com/acme/charts/inference-test-1.0.0.tgz")
    assert (ref.host, ref.repository, ref.version) == (
        "reg.example.com",
        "acme/charts/inference-test",
        "1.0.0",
    )
    ref = parse_chart_url("oci://127.0.0.1:5000/a/c:v2")
    assert (ref.host, ref.repository, ref.version) == ("127.0.0.1:5000", "a/c", "v2")


INVALID = [
    # (url, substring expected in one of the messages)
    ("", "is empty"),
    ("reg.example.com/a/c-1.0.0.tgz", "has no scheme"),
    ("http://reg.example.com/a/c-1.0.0.tgz", "Scheme 'http'"),
    ("ftp://reg.example.com/a/c-1.0.0.tgz", "only 'oci' and 'https'"),
    ("oci://user:s3cret@reg.example.com/a/c-1.0.0.tgz", "user information"),
    ("oci://reg.example.com/a/c-1.0.0.tgz?x=1", "query string"),
    ("oci://reg.example.com/a/c-1.0.0.tgz#frag", "fragment"),
    ("oci://reg.example.com:99999/a/c:1.0", "Port '99999'"),
    ("oci://reg.example.com:abc/a/c:1.0", "Port 'abc'"),
    ("oci://reg.example.com:²/a/c:1.0", "Port '²'"),
    ("oci://reg.example.com:٤٤٣/a/c:1.0", "Port '٤٤٣'"),
    ("oci://reg.example.com:+443/a/c:1.0", "Port '+443'"),
    ("oci://reg.example.com:" + "4" * 2000 + "/a/c:1.0", "Port '444444444444…'"),
    ("oci://bad_host.example.com/a/c:1.0", "not a valid host name"),
    ("oci:///a/c:1.0", "no registry host"),
    ("oci://reg.example.com", "no chart path"),
    ("oci://reg.example.com/", "no chart path"),
    ("oci://reg.example.com/a//c:1.0", "empty, '.' or '..' segment"),
    ("oci://reg.example.com/a/../c:1.0", "empty, '.' or '..' segment"),
    ("oci://reg.example.com/Acme/c:1.0", "Repository path segment 'Acme'"),
    ("oci://reg.example.com/a/c", "must end with '<name>-<version>.tgz' or '<name>:<version>'"),
    ("https://reg.example.com/a/c:1.0", "must end with '<name>-<version>.tgz' for an https"),
    ("oci://reg.example.com/a/c@sha256:" + "0" * 64, "uses a digest"),
    ("oci://reg.example.com/a/:1.0", "no chart name before ':'"),
    ("oci://reg.example.com/a/c:", "no version after ':'"),
    ("oci://reg.example.com/a/chart.tgz", "has no version"),
    ("oci://reg.example.com/a/1.0.0.tgz", "has no chart name"),
    ("oci://reg.example.com/a/my_chart-1.0.0.tgz", "underscores are not allowed"),
    ("oci://reg.example.com/a/MyChart:1.0.0", "must be lowercase"),
    ("oci://reg.example.com/a/chart.x:1.0.0", "must match ^[a-z0-9]"),
    ("oci://reg.example.com/a/-chart:1.0.0", "must match ^[a-z0-9]"),
    ("oci://reg.example.com/a/my-chart-v1-test.tgz", "may not contain '-'"),
    ("oci://reg.example.com/a/c:1.0.0-rc1", "may not contain '-'"),
    ("oci://reg.example.com/a/c:1.0.0.0", "one to three dot-separated numbers"),
    ("oci://reg.example.com/a/c:latest", "one to three dot-separated numbers"),
    ("oci://reg.example.com/a/c:1.0+build", "one to three dot-separated numbers"),
    ("oci://reg.example.com/a/c:١.٠", "one to three dot-separated numbers"),
    ("oci://reg.example.com/a/c-١.٠.tgz", "has no version"),
    ("oci://reg.example.com/a/c-1.0 .tgz", "whitespace"),
    ("oci://[::1/a/c:1.0", "cannot be parsed"),
    ("oci://reg.example.com/" + "a" * 2100 + "/c:1.0", "at most 2048"),
]


@pytest.mark.parametrize(("url", "needle"), INVALID, ids=[u[:60] for u, _ in INVALID])
def test_invalid_urls(url: str, needle: str) -> None:
    with pytest.raises(ChartUrlError) as info:
        parse_chart_url(url)
    messages = info.value.messages
    assert any(needle in m for m in messages), messages
    assert all(m.endswith(".") for m in messages)
    assert "s3cret" not in str(info.value)


def test_version_dash_message_names_value_and_reason() -> None:
    with pytest.raises(ChartUrlError) as info:
        parse_chart_url("oci://reg.example.com/a/my-chart-v1-test.tgz")
    (message,) = info.value.messages
    assert "'v1-test'" in message
    assert "separates the chart name from the version" in message


def test_every_problem_is_reported() -> None:
    with pytest.raises(ChartUrlError) as info:
        parse_chart_url("http://reg.example.com/Acme/my_chart-1.0-rc.tgz?a=b")
    text = " | ".join(info.value.messages)
    for needle in ("Scheme 'http'", "query string", "'Acme'", "underscores", "may not contain"):
        assert needle in text
    assert len(info.value.messages) == 5
    assert [e.field for e in info.value.field_errors()] == ["helmChart"] * 5


def test_redact_url_hides_userinfo() -> None:
    assert redact_url("oci://u:pw@reg/a/c:1") == "oci://***@reg/a/c:1"
    assert redact_url("oci://reg/a/c:1") == "oci://reg/a/c:1"


# --- SSRF guard -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "carrier-grade NAT (100.64.0.0/10)"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "private"),  # reserved class E; Python classes it as private too
        ("::ffff:127.0.0.1", "loopback"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_forbidden_reason(address: str, reason: str | None) -> None:
    assert forbidden_reason(address) == reason


def substitute_resolve(monkeypatch: pytest.MonkeyPatch, answer: Sequence[str] | Exception) -> None:
    """Substitute netguard.resolve, the one name lookup: fixed answers, or an error raised."""

    def resolve(hostname: str, port: int) -> list[str]:
        if isinstance(answer, Exception):
            raise answer
        return list(answer)

    monkeypatch.setattr(netguard, "resolve", resolve)


async def test_check_host_refuses_loopback() -> None:
    ref = parse_chart_url("oci://127.0.0.1:5000/a/c:1.0")
    with pytest.raises(BadRequest) as info:
        await check_host(ref, allowlist=set())
    assert "loopback address 127.0.0.1" in info.value.detail
    assert "NVCF_REGISTRY_ALLOWLIST" in info.value.detail


async def test_check_host_localhost_name_resolves_to_loopback() -> None:
    ref = parse_chart_url("oci://localhost:5000/a/c:1.0")
    with pytest.raises(BadRequest, match="loopback"):
        await check_host(ref, allowlist={"localhost:6000"})


async def test_check_host_allowlisted_by_host_port_or_hostname() -> None:
    ref = parse_chart_url("oci://127.0.0.1:5000/a/c:1.0")
    assert await check_host(ref, allowlist={"127.0.0.1:5000"}) == []
    assert await check_host(ref, allowlist={"127.0.0.1"}) == []
    with pytest.raises(BadRequest):
        await check_host(ref, allowlist={"127.0.0.1:5001"})


async def test_check_host_refuses_if_any_answer_is_private(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    substitute_resolve(monkeypatch, ["8.8.8.8", "10.0.0.5"])
    ref = parse_chart_url("oci://reg.example.com/a/c:1.0")
    with pytest.raises(BadRequest, match=r"private address 10\.0\.0\.5"):
        await check_host(ref, allowlist=set())


async def test_check_host_accepts_public_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    substitute_resolve(monkeypatch, ["8.8.8.8"])
    ref = parse_chart_url("oci://reg.example.com/a/c:1.0")
    got = await check_host(ref, allowlist=set())
    assert got == ["8.8.8.8"]


async def test_check_host_unresolvable_is_bad_request(monkeypatch: pytest.MonkeyPatch) -> None:
    substitute_resolve(monkeypatch, socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    ref = parse_chart_url("oci://nothing.invalid/a/c:1.0")
    with pytest.raises(BadRequest, match="does not resolve"):
        await check_host(ref, allowlist=set())


async def test_check_host_resolver_failure_is_bad_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    error = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    substitute_resolve(monkeypatch, error)
    ref = parse_chart_url("oci://reg.example.com/a/c:1.0")
    with pytest.raises(BadGateway, match="Temporary failure"):
        await check_host(ref, allowlist=set())


def test_chart_ref_is_frozen() -> None:
    ref = parse_chart_url("oci://reg.example.com/a/c:1.0")
    assert isinstance(ref, ChartRef)
    with pytest.raises(AttributeError):
        ref.version = "2"  # type: ignore[misc]
