"""Archive safety rules (helm.md §1.4) on hand-built hostile archives."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from service.charts.archive import check_archive
from service.core.errors import BadRequest

MiB = 1024 * 1024
CHART_YAML = b"apiVersion: v2\nname: demo\nversion: 1.0.0\n"


def _entry(name: str, data: bytes = b"", **attrs: object) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    if info.type != tarfile.REGTYPE:
        info.size = 0
    return info, data


def build(path: Path, entries: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    path.write_bytes(gzip.compress(buf.getvalue()))
    return path


def good_entries() -> list[tuple[tarfile.TarInfo, bytes]]:
    return [
        _entry("demo/Chart.yaml", CHART_YAML),
        _entry("demo/values.yaml", b"a: 1\n"),
        _entry("demo/templates", type=tarfile.DIRTYPE, mode=0o755),
        _entry("demo/templates/svc.yaml", b"kind: Service\n"),
    ]


def check(path: Path, **limits: int) -> None:
    check_archive(
        path,
        limits.pop("max_bytes", 10 * MiB),
        limits.pop("max_unpacked_bytes", 50 * MiB),
        source="oci://reg/demo-1.0.0.tgz",
        **limits,
    )


def test_good_archive_passes(tmp_path: Path) -> None:
    check(build(tmp_path / "ok.tgz", good_entries()))


HOSTILE = [
    ("archive-parent-path", "contains '..'", "demo/../../evil", [_entry("demo/../../evil", b"x")]),
    ("archive-parent-path", "contains '..'", "../evil", [_entry("../evil", b"x")]),
    ("archive-absolute-path", "absolute path", "/etc/cron.d/x", [_entry("/etc/cron.d/x", b"x")]),
    (
        "archive-symlink",
        "symbolic link to '/etc/passwd'",
        "demo/templates/link",
        [_entry("demo/templates/link", type=tarfile.SYMTYPE, linkname="/etc/passwd")],
    ),
    (
        "archive-hardlink",
        "hard link to 'demo/Chart.yaml'",
        "demo/hard",
        [_entry("demo/hard", type=tarfile.LNKTYPE, linkname="demo/Chart.yaml")],
    ),
    (
        "archive-device",
        "device file",
        "demo/null",
        [_entry("demo/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)],
    ),
    ("archive-device", "is a FIFO", "demo/pipe", [_entry("demo/pipe", type=tarfile.FIFOTYPE)]),
    (
        "archive-layout",
        "outside the single top-level chart directory 'demo/'",
        "other/x.yaml",
        [_entry("other/x.yaml", b"x")],
    ),
    (
        "archive-layout",
        "outside the single top-level chart directory",
        "README.md",
        [_entry("README.md", b"x")],
    ),
]


@pytest.mark.parametrize(
    ("rule", "needle", "entry", "extra"), HOSTILE, ids=[h[0] + ":" + h[2] for h in HOSTILE]
)
def test_hostile_entries_rejected(
    tmp_path: Path,
    rule: str,
    needle: str,
    entry: str,
    extra: list[tuple[tarfile.TarInfo, bytes]],
) -> None:
    archive = build(tmp_path / "bad.tgz", good_entries() + extra)
    with pytest.raises(BadRequest) as info:
        check(archive)
    err = info.value
    assert err.errors[0].rule == rule
    assert err.errors[0].object == entry
    assert needle in err.detail
    assert f"({rule})" in err.detail
    assert "oci://reg/demo-1.0.0.tgz" in err.detail


def test_oversized_compressed_archive_rejected(tmp_path: Path) -> None:
    archive = build(tmp_path / "big.tgz", good_entries())
    with pytest.raises(BadRequest) as info:
        check(archive, max_bytes=64)
    assert info.value.errors[0].rule == "archive-compressed-size"
    assert "more than the limit of 64 bytes" in info.value.detail


def test_gzip_bomb_rejected_while_streaming(tmp_path: Path) -> None:
    # 20 MiB of zeros compresses to ~20 KiB; the 1 MiB unpacked limit must stop it.
    bomb = [*good_entries(), _entry("demo/zeros.bin", b"\0" * (20 * MiB))]
    archive = build(tmp_path / "bomb.tgz", bomb)
    assert archive.stat().st_size < 100 * 1024
    with pytest.raises(BadRequest) as info:
        check(archive, max_unpacked_bytes=MiB)
    assert info.value.errors[0].rule == "archive-unpacked-size"
    assert "demo/zeros.bin" in info.value.detail


def test_too_many_files_rejected(tmp_path: Path) -> None:
    many = good_entries() + [_entry(f"demo/files/f{i}.txt", b"x") for i in range(20)]
    archive = build(tmp_path / "many.tgz", many)
    with pytest.raises(BadRequest) as info:
        check(archive, max_files=10)
    assert info.value.errors[0].rule == "archive-file-count"
    assert "more than 10 entries" in info.value.detail


def test_missing_chart_yaml_rejected(tmp_path: Path) -> None:
    archive = build(tmp_path / "nochart.tgz", [_entry("demo/values.yaml", b"a: 1\n")])
    with pytest.raises(BadRequest, match=r"has no Chart\.yaml"):
        check(archive)


def test_empty_archive_rejected(tmp_path: Path) -> None:
    archive = build(tmp_path / "empty.tgz", [])
    with pytest.raises(BadRequest, match="the archive is empty"):
        check(archive)


def test_not_gzip_rejected(tmp_path: Path) -> None:
    archive = tmp_path / "plain.tar"
    archive.write_bytes(b"not gzip at all")
    with pytest.raises(BadRequest, match="not gzip-compressed"):
        check(archive)


def test_gzip_but_not_tar_rejected(tmp_path: Path) -> None:
    archive = tmp_path / "text.tgz"
    archive.write_bytes(gzip.compress(b"hello world, this is not a tar archive" * 20))
    with pytest.raises(BadRequest, match="not a valid gzip tar archive"):
        check(archive)


def test_truncated_gzip_rejected(tmp_path: Path) -> None:
    archive = build(tmp_path / "ok.tgz", good_entries())
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadRequest, match="not a valid gzip tar archive"):
        check(archive)
