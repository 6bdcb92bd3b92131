"""Chart pulls against real local docker-registry servers (helm.md §1)."""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import json
import tarfile
import threading
import urllib.request
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path

import helm_python
import oras.provider
import pytest
import yaml

from service.charts.fetch import (
    HELM_CHART_LAYER,
    HELM_CONFIG,
    MAX_TAGS_SHOWN,
    ChartFetcher,
    RegistryCredential,
)
from service.charts.url import parse_chart_url
from service.core.errors import BadGateway, BadRequest
from tests.support.charts import REGISTRY_USER
from tests.support.registry import RegistryServer, push_chart, write_chart

pytestmark = pytest.mark.registry

MiB = 1024 * 1024
_names = count()
GOOD = RegistryCredential(*REGISTRY_USER)
WRONG = RegistryCredential("chart-puller", "wrong-password")


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def make_fetcher(tmp_path: Path, *servers: RegistryServer, **kwargs: int) -> ChartFetcher:
    hosts = {s.host for s in servers}
    return ChartFetcher(
        tmp_path / f"cache-{next(_names)}",
        allowlist=hosts,
        insecure=hosts,
        max_bytes=kwargs.pop("max_bytes", 10 * MiB),
        max_unpacked_bytes=kwargs.pop("max_unpacked_bytes", 50 * MiB),
        timeout=10,
    )


def publish(
    server: RegistryServer, tmp_path: Path, name: str, version: str = "1.0.0", **kw: str
) -> str:
    src = write_chart(tmp_path / unique("src"), name, version, **kw)
    return push_chart(server, src, "acme/charts", workdir=tmp_path / unique("push"))


def chart_yaml(archive: Path) -> dict[str, object]:
    with tarfile.open(archive, "r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/Chart.yaml"))
        stream = tar.extractfile(member)
        assert stream is not None
        data: dict[str, object] = yaml.safe_load(stream.read())
        return data


@pytest.mark.parametrize("form", ["file", "reference"])
async def test_pull_both_url_forms(
    anon_registry: RegistryServer, tmp_path: Path, form: str
) -> None:
    name = unique("form")
    digest = publish(anon_registry, tmp_path, name)
    url = (
        f"oci://{anon_registry.host}/acme/charts/{name}-1.0.0.tgz"
        if form == "file"
        else f"oci://{anon_registry.host}/acme/charts/{name}:1.0.0"
    )
    fetched = await make_fetcher(tmp_path, anon_registry).fetch(parse_chart_url(url), [])
    assert fetched.digest == digest
    assert fetched.archive_path.is_file()
    assert fetched.size == fetched.archive_path.stat().st_size
    assert chart_yaml(fetched.archive_path)["name"] == name
    assert not fetched.cached


async def test_auth_registry_right_wrong_and_mixed_credentials(
    auth_registry: RegistryServer, tmp_path: Path
) -> None:
    name = unique("auth")
    digest = publish(auth_registry, tmp_path, name)
    url = f"oci://{auth_registry.host}/acme/charts/{name}-1.0.0.tgz"
    ref = parse_chart_url(url)

    assert (await make_fetcher(tmp_path, auth_registry).fetch(ref, [GOOD])).digest == digest
    mixed = await make_fetcher(tmp_path, auth_registry).fetch(ref, [WRONG, GOOD])
    assert mixed.digest == digest

    for creds in ([WRONG], []):
        with pytest.raises(BadRequest) as info:
            await make_fetcher(tmp_path, auth_registry).fetch(ref, creds)
        assert info.value.detail == f"no credential was valid to pull chart {url}"
        assert "wrong-password" not in repr(info.value) + str(info.value.errors)
    assert "wrong-password" not in repr(WRONG)


async def test_missing_chart_and_missing_tag(anon_registry: RegistryServer, tmp_path: Path) -> None:
    """ "Not found" says what the repository has (the OCI tags list), when it may be listed."""
    name = unique("present")
    publish(anon_registry, tmp_path, name)
    fetcher = make_fetcher(tmp_path, anon_registry)
    absent = unique("absent")
    cases = {
        f"oci://{anon_registry.host}/acme/charts/{absent}-1.0.0.tgz": (
            f"registry {anon_registry.host} has no repository 'acme/charts/{absent}'"
        ),
        f"oci://{anon_registry.host}/acme/charts/{name}:9.9.9": (
            f"registry {anon_registry.host} has no tag or digest '9.9.9' in repository "
            f"'acme/charts/{name}'; its tags are: 1.0.0"
        ),
    }
    for url, message in cases.items():
        with pytest.raises(BadRequest) as info:
            await fetcher.fetch(parse_chart_url(url), [])
        assert info.value.detail == f"chart {url} not found: {message}"
        assert [e.message for e in info.value.errors] == [message]


async def test_missing_chart_with_credentials(
    auth_registry: RegistryServer, tmp_path: Path
) -> None:
    name = unique("listed")
    publish(auth_registry, tmp_path, name)
    url = f"oci://{auth_registry.host}/acme/charts/{name}:1.0"
    with pytest.raises(BadRequest) as info:
        await make_fetcher(tmp_path, auth_registry).fetch(parse_chart_url(url), [GOOD])
    # the tags are listed with the credential that reached the repository
    assert info.value.detail.startswith(f"chart {url} not found: ")
    assert info.value.detail.endswith("its tags are: 1.0.0")
    # anonymous access is refused: no credential was valid, and nothing is listed
    with pytest.raises(BadRequest) as info:
        await make_fetcher(tmp_path, auth_registry).fetch(parse_chart_url(url), [])
    assert info.value.detail == f"no credential was valid to pull chart {url}"


def retag(server: RegistryServer, repository: str, source: str, tags: list[str]) -> None:
    """Put the manifest of tag `source` under each of `tags` (OCI distribution API)."""
    accept = "application/vnd.oci.image.manifest.v1+json"
    base = f"http://{server.host}/v2/{repository}/manifests"
    request = urllib.request.Request(f"{base}/{source}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        manifest = response.read()
    for tag in tags:
        put = urllib.request.Request(
            f"{base}/{tag}", data=manifest, method="PUT", headers={"Content-Type": accept}
        )
        with urllib.request.urlopen(put, timeout=10) as response:
            assert response.status == 201


async def test_missing_tag_lists_a_bounded_number_of_the_closest_tags(
    anon_registry: RegistryServer, tmp_path: Path
) -> None:
    name = unique("many")
    publish(anon_registry, tmp_path, name)
    others = [f"0.{i}.0" for i in range(30)] + ["2.0.0", "2.0.1"]
    retag(anon_registry, f"acme/charts/{name}", "1.0.0", others)
    url = f"oci://{anon_registry.host}/acme/charts/{name}:2.0"
    with pytest.raises(BadRequest) as info:
        await make_fetcher(tmp_path, anon_registry).fetch(parse_chart_url(url), [])
    message = info.value.errors[0].message
    head, _, listed = message.partition(f"; {MAX_TAGS_SHOWN} of its 33 tags (the closest): ")
    assert head == (
        f"registry {anon_registry.host} has no tag or digest '2.0' in repository "
        f"'acme/charts/{name}'"
    )
    shown = listed.split(", ")
    assert len(shown) == MAX_TAGS_SHOWN
    assert {"2.0.0", "2.0.1"} <= set(shown)
    assert shown[-2:] == ["2.0.0", "2.0.1"]  # in version order
    assert shown[0].startswith("0.")


async def test_stopped_registry_is_bad_gateway_but_pinned_cache_still_serves(
    start_extra_registry: Callable[[], RegistryServer], tmp_path: Path
) -> None:
    server = start_extra_registry()
    name = unique("stopped")
    publish(server, tmp_path, name)
    ref = parse_chart_url(f"oci://{server.host}/acme/charts/{name}:1.0.0")
    fetcher = make_fetcher(tmp_path, server)
    first = await fetcher.fetch(ref, [])
    server.stop()

    with pytest.raises(BadGateway) as info:
        await fetcher.fetch(ref, [])
    assert server.host in info.value.detail
    assert "Connection refused" in info.value.detail

    # A pinned, cached digest needs no network at all.
    again = await fetcher.fetch(ref, [], digest=first.digest)
    assert again.cached
    assert again.archive_path == first.archive_path


async def test_loopback_registry_refused_unless_allowlisted(
    anon_registry: RegistryServer, tmp_path: Path
) -> None:
    name = unique("ssrf")
    publish(anon_registry, tmp_path, name)
    ref = parse_chart_url(f"oci://{anon_registry.host}/acme/charts/{name}:1.0.0")
    fetcher = ChartFetcher(
        tmp_path / "cache",
        allowlist=set(),
        insecure={anon_registry.host},
        max_bytes=10 * MiB,
        max_unpacked_bytes=50 * MiB,
    )
    log_before = len(anon_registry.log_text())
    with pytest.raises(BadRequest) as info:
        await fetcher.fetch(ref, [])
    assert "loopback address 127.0.0.1" in info.value.detail
    assert f"/acme/charts/{name}/" not in anon_registry.log_text()[log_before:]


async def test_plain_http_only_for_insecure_registries(
    anon_registry: RegistryServer, tmp_path: Path
) -> None:
    ref = parse_chart_url(f"oci://{anon_registry.host}/acme/charts/{unique('tls')}:1.0.0")
    fetcher = ChartFetcher(
        tmp_path / "cache",
        allowlist={anon_registry.host},
        insecure=set(),
        max_bytes=10 * MiB,
        max_unpacked_bytes=50 * MiB,
    )
    # The registry speaks plain HTTP only, so an HTTPS attempt fails at the TLS handshake; the
    # message says so and names the setting, not OpenSSL's WRONG_VERSION_NUMBER.
    with pytest.raises(BadGateway) as info:
        await fetcher.fetch(ref, [])
    assert info.value.detail == (
        f"Could not reach registry {anon_registry.host} to pull chart {ref.url}: "
        f"{anon_registry.host} seems to speak plain HTTP, not HTTPS (the TLS handshake was "
        "answered in plain text); if this registry is meant to be used over plain HTTP, the "
        "operator must list it in NVCF_INSECURE_REGISTRIES."
    )


async def test_cache_hit_does_not_download_again(
    anon_registry: RegistryServer, tmp_path: Path
) -> None:
    name = unique("cached")
    publish(anon_registry, tmp_path, name)
    ref = parse_chart_url(f"oci://{anon_registry.host}/acme/charts/{name}-1.0.0.tgz")
    fetcher = make_fetcher(tmp_path, anon_registry)
    first = await fetcher.fetch(ref, [])
    gets = anon_registry.blob_gets(first.layer_digest)
    second = await fetcher.fetch(ref, [])
    assert second.cached
    assert second.digest == first.digest
    assert second.archive_path == first.archive_path
    assert anon_registry.blob_gets(first.layer_digest) == gets


async def test_concurrent_fetches_pull_once(anon_registry: RegistryServer, tmp_path: Path) -> None:
    name = unique("concurrent")
    publish(anon_registry, tmp_path, name, description=f"unique {name}")
    ref = parse_chart_url(f"oci://{anon_registry.host}/acme/charts/{name}:1.0.0")
    fetcher = make_fetcher(tmp_path, anon_registry)
    results = await asyncio.gather(*(fetcher.fetch(ref, []) for _ in range(4)))
    layer = results[0].layer_digest
    assert {r.archive_path for r in results} == {results[0].archive_path}
    assert anon_registry.blob_gets(layer) == 1
    assert sum(not r.cached for r in results) == 1


async def test_digest_pinning_survives_tag_overwrite(
    anon_registry: RegistryServer, tmp_path: Path
) -> None:
    name = unique("pinned")
    old = publish(anon_registry, tmp_path, name, description="old content")
    new = publish(anon_registry, tmp_path, name, description="new content")
    assert old != new
    ref = parse_chart_url(f"oci://{anon_registry.host}/acme/charts/{name}-1.0.0.tgz")

    latest = await make_fetcher(tmp_path, anon_registry).fetch(ref, [])
    assert latest.digest == new
    assert chart_yaml(latest.archive_path)["description"] == "new content"

    pinned = await make_fetcher(tmp_path, anon_registry).fetch(ref, [], digest=old)
    assert pinned.digest == old
    assert not pinned.cached
    assert chart_yaml(pinned.archive_path)["description"] == "old content"


async def test_bad_pinned_digest(anon_registry: RegistryServer, tmp_path: Path) -> None:
    ref = parse_chart_url(f"oci://{anon_registry.host}/acme/charts/x:1.0.0")
    with pytest.raises(BadRequest, match="is not a sha256 manifest digest"):
        await make_fetcher(tmp_path, anon_registry).fetch(ref, [], digest="md5:abc")


async def test_oversized_layer_refused_before_download(
    anon_registry: RegistryServer, tmp_path: Path
) -> None:
    name = unique("big")
    publish(anon_registry, tmp_path, name)
    ref = parse_chart_url(f"oci://{anon_registry.host}/acme/charts/{name}:1.0.0")
    size_before = len(anon_registry.log_text())
    with pytest.raises(BadRequest) as info:
        await make_fetcher(tmp_path, anon_registry, max_bytes=100).fetch(ref, [])
    assert info.value.errors[0].rule == "archive-compressed-size"
    assert "/blobs/" not in anon_registry.log_text()[size_before:]


def push_artifact(
    server: RegistryServer,
    tmp_path: Path,
    name: str,
    payload: bytes,
    *,
    config_type: str = HELM_CONFIG,
) -> None:
    """Push raw bytes as a chart layer with oras-py (to serve hostile or non-chart content)."""
    blob = tmp_path / unique("blob")
    blob.write_bytes(payload)
    config = tmp_path / unique("config")
    config.write_text(json.dumps({"name": name, "version": "1.0.0"}))
    client = oras.provider.Registry(hostname=server.host, insecure=True)
    client.push(
        target=f"{server.host}/acme/charts/{name}:1.0.0",
        files=[f"{blob}:{HELM_CHART_LAYER}"],
        manifest_config=f"{config}:{config_type}",
        disable_path_validation=True,
    )


def tgz(entries: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for path, target in (symlinks or {}).items():
            info = tarfile.TarInfo(path)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return raw.getvalue()


async def test_hostile_archive_from_registry_rejected_and_not_cached(
    anon_registry: RegistryServer, tmp_path: Path
) -> None:
    name = unique("hostile")
    payload = tgz({f"{name}/Chart.yaml": b"name: x\n"}, {f"{name}/templates/x": "/etc/shadow"})
    push_artifact(anon_registry, tmp_path, name, payload)
    ref = parse_chart_url(f"oci://{anon_registry.host}/acme/charts/{name}:1.0.0")
    fetcher = make_fetcher(tmp_path, anon_registry)
    with pytest.raises(BadRequest) as info:
        await fetcher.fetch(ref, [])
    assert info.value.errors[0].rule == "archive-symlink"
    assert f"'{name}/templates/x'" in info.value.detail
    assert list((fetcher.cache.root / "blobs" / "sha256").iterdir()) == []


async def test_non_chart_artifact_rejected(anon_registry: RegistryServer, tmp_path: Path) -> None:
    name = unique("notchart")
    push_artifact(
        anon_registry,
        tmp_path,
        name,
        b"hello",
        config_type="application/vnd.unknown.config.v1+json",
    )
    ref = parse_chart_url(f"oci://{anon_registry.host}/acme/charts/{name}:1.0.0")
    with pytest.raises(BadRequest, match="is not a Helm chart: its config media type"):
        await make_fetcher(tmp_path, anon_registry).fetch(ref, [])


class _ArchiveHandler(http.server.BaseHTTPRequestHandler):
    """Serves one chart archive, a redirect to another host, and basic auth on /private/."""

    archive = b""

    def do_GET(self) -> None:
        if self.path.startswith("/moved/"):
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.2:9/x.tgz")
            self.end_headers()
            return
        if self.path.startswith("/private/") and self.headers.get("Authorization") != (
            "Basic " + base64.b64encode(b"u:p").decode()
        ):
            self.send_response(401)
            self.end_headers()
            return
        if not self.path.endswith("/demo-1.0.0.tgz"):
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.archive)))
        self.end_headers()
        self.wfile.write(self.archive)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def archive_server(tmp_path: Path) -> Iterator[str]:
    src = write_chart(tmp_path / "src", "demo", "1.0.0")
    _ArchiveHandler.archive = Path(helm_python.package(src, destination=tmp_path)).read_bytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ArchiveHandler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join()


def https_fetcher(tmp_path: Path, host: str) -> ChartFetcher:
    return ChartFetcher(
        tmp_path / unique("cache"),
        allowlist={host},
        insecure={host},
        max_bytes=10 * MiB,
        max_unpacked_bytes=50 * MiB,
    )


async def test_https_archive_form(archive_server: str, tmp_path: Path) -> None:
    fetcher = https_fetcher(tmp_path, archive_server)
    ref = parse_chart_url(f"https://{archive_server}/charts/demo-1.0.0.tgz")
    fetched = await fetcher.fetch(ref, [])
    assert chart_yaml(fetched.archive_path)["name"] == "demo"
    pinned = await fetcher.fetch(ref, [], digest=fetched.digest)
    assert pinned.cached

    private = parse_chart_url(f"https://{archive_server}/private/demo-1.0.0.tgz")
    ok = await fetcher.fetch(
        private, [RegistryCredential("u", "bad"), RegistryCredential("u", "p")]
    )
    assert ok.digest == fetched.digest
    with pytest.raises(BadRequest, match="no credential was valid"):
        await fetcher.fetch(private, [RegistryCredential("u", "bad")])
    with pytest.raises(BadRequest, match="not found"):
        await fetcher.fetch(parse_chart_url(f"https://{archive_server}/c/other-1.0.tgz"), [])


async def test_redirect_to_other_host_refused(archive_server: str, tmp_path: Path) -> None:
    ref = parse_chart_url(f"https://{archive_server}/moved/demo-1.0.0.tgz")
    with pytest.raises(BadGateway, match="redirects to other hosts or to plain HTTP are refused"):
        await https_fetcher(tmp_path, archive_server).fetch(ref, [])
