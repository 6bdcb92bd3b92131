"""Chart pulls from a real docker-registry using the Docker bearer-token flow (helm.md §1).

The registry (`auth: token`) answers `WWW-Authenticate: Bearer realm=…,service=…,scope=…`;
the token server of tests/support/registry.py checks basic credentials and signs the JWTs.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import count
from pathlib import Path

import pytest

from service.charts.fetch import ChartFetcher, RegistryCredential
from service.charts.url import parse_chart_url
from service.core.errors import BadGateway, BadRequest
from tests.support.charts import TOKEN_OUTSIDER, TOKEN_USER
from tests.support.registry import RegistryServer, TokenServer, push_chart, write_chart

pytestmark = pytest.mark.registry

MiB = 1024 * 1024
_names = count()
GOOD = RegistryCredential(*TOKEN_USER)
WRONG = RegistryCredential(TOKEN_USER[0], "wrong-password")
OUTSIDER = RegistryCredential(*TOKEN_OUTSIDER)


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def tokens_of(server: RegistryServer) -> TokenServer:
    assert server.token_server is not None
    return server.token_server


def make_fetcher(tmp_path: Path, server: RegistryServer) -> ChartFetcher:
    """A fetcher that may contact the registry and its token realm over plain HTTP."""
    hosts = {server.host, f"127.0.0.1:{tokens_of(server).port}"}
    return ChartFetcher(
        tmp_path / unique("cache"),
        allowlist=hosts,
        insecure=hosts,
        max_bytes=10 * MiB,
        max_unpacked_bytes=50 * MiB,
        timeout=10,
    )


def publish(server: RegistryServer, tmp_path: Path, name: str) -> tuple[str, str]:
    """Push chart `name` 1.0.0 with Helm (logging in through the token flow); (url, digest)."""
    src = write_chart(tmp_path / unique("src"), name, "1.0.0")
    digest = push_chart(server, src, "acme/charts", workdir=tmp_path / unique("push"))
    return f"oci://{server.host}/acme/charts/{name}-1.0.0.tgz", digest


async def test_right_credential_pulls_through_a_token(
    token_registry: RegistryServer, tmp_path: Path
) -> None:
    name = unique("token")
    url, digest = publish(token_registry, tmp_path, name)
    tokens = tokens_of(token_registry)
    seen = len(tokens.requests)

    fetched = await make_fetcher(tmp_path, token_registry).fetch(parse_chart_url(url), [GOOD])

    assert fetched.digest == digest
    assert fetched.archive_path.is_file()
    assert not fetched.cached
    scope = f"repository:acme/charts/{name}:pull"
    granted = (f"acme/charts/{name}", ("pull",))
    assert [(r.username, r.status, r.scopes, r.access) for r in tokens.requests[seen:]] == [
        (TOKEN_USER[0], 200, (scope,), (granted,))
    ]


async def test_wrong_missing_and_unauthorised_credentials_are_refused(
    token_registry: RegistryServer, tmp_path: Path
) -> None:
    url, _ = publish(token_registry, tmp_path, unique("refused"))
    ref = parse_chart_url(url)
    tokens = tokens_of(token_registry)

    for creds in ([WRONG], [], [OUTSIDER]):
        seen = len(tokens.requests)
        with pytest.raises(BadRequest) as info:
            await make_fetcher(tmp_path, token_registry).fetch(ref, creds)
        assert info.value.status == 400
        assert info.value.detail == f"no credential was valid to pull chart {url}"
        assert "wrong-password" not in repr(info.value) + str(info.value.errors)
        requests = tokens.requests[seen:]
        # Every attempt ends with an anonymous token that grants nothing.
        assert requests[-1].username is None
        assert requests[-1].status == 200
        assert requests[-1].access == ()
        if creds == [WRONG]:
            assert (requests[0].username, requests[0].status) == (TOKEN_USER[0], 401)
        if creds == [OUTSIDER]:
            assert (requests[0].username, requests[0].status) == (TOKEN_OUTSIDER[0], 200)
            assert requests[0].access == ()


async def test_wrong_then_right_credential(token_registry: RegistryServer, tmp_path: Path) -> None:
    url, digest = publish(token_registry, tmp_path, unique("mixed"))
    fetched = await make_fetcher(tmp_path, token_registry).fetch(
        parse_chart_url(url), [WRONG, GOOD]
    )
    assert fetched.digest == digest


async def test_token_realm_must_be_allowed_too(
    token_registry: RegistryServer, tmp_path: Path
) -> None:
    url, _ = publish(token_registry, tmp_path, unique("realm"))
    fetcher = ChartFetcher(
        tmp_path / "cache",
        allowlist={token_registry.host},
        insecure={token_registry.host},
        max_bytes=10 * MiB,
        max_unpacked_bytes=50 * MiB,
        timeout=10,
    )
    with pytest.raises(BadGateway) as info:
        await fetcher.fetch(parse_chart_url(url), [GOOD])
    assert f"Refused to contact http://127.0.0.1:{tokens_of(token_registry).port}" in (
        info.value.detail
    )


async def test_token_server_down_is_bad_gateway(
    start_token_registry: Callable[[], RegistryServer], tmp_path: Path
) -> None:
    server = start_token_registry()
    url, _ = publish(server, tmp_path, unique("down"))
    tokens = tokens_of(server)
    tokens.stop()

    for creds in ([GOOD], []):
        with pytest.raises(BadGateway) as info:
            await make_fetcher(tmp_path, server).fetch(parse_chart_url(url), creds)
        assert info.value.status == 502
        # the registry answered; its token server did not, and the message says which
        assert (
            f"Could not reach the token server 127.0.0.1:{tokens.port} of registry "
            f"{server.host} to pull chart {url}: "
        ) in info.value.detail
        assert "Connection refused" in info.value.detail
        assert GOOD.password not in info.value.detail


async def test_missing_tag_lists_the_tags_through_the_token_flow(
    token_registry: RegistryServer, tmp_path: Path
) -> None:
    name = unique("tags")
    publish(token_registry, tmp_path, name)
    url = f"oci://{token_registry.host}/acme/charts/{name}:1.0"
    tokens = tokens_of(token_registry)
    seen = len(tokens.requests)
    with pytest.raises(BadRequest) as info:
        await make_fetcher(tmp_path, token_registry).fetch(parse_chart_url(url), [GOOD])
    assert info.value.detail.endswith(
        f"has no tag or digest '1.0' in repository 'acme/charts/{name}'; its tags are: 1.0.0"
    )
    # the listing reused the token of the credential that reached the repository
    assert [(r.username, r.access) for r in tokens.requests[seen:]] == [
        (TOKEN_USER[0], ((f"acme/charts/{name}", ("pull",)),)),
        (None, ()),  # the anonymous manifest attempt, after the credential's 404
    ]
    listed = f'"GET /v2/acme/charts/{name}/tags/list?n=1000 HTTP/1.1" 200 '
    assert listed in token_registry.log_text()
