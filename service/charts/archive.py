"""Chart archive safety checks (helm.md §1.4), run before anything else reads an archive."""

from __future__ import annotations

import gzip
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Protocol

from service.core.errors import BadRequest, FieldError

DEFAULT_MAX_FILES = 1000
_CHUNK = 64 * 1024


class _TooLarge(Exception):
    pass


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _CountingReader:
    """Decompressed stream that stops once more than `limit` bytes have been produced."""

    def __init__(self, raw: _Readable, limit: int) -> None:
        self._raw = raw
        self._limit = limit
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        # Never read more than one byte past the limit, however much the caller asks for.
        budget = self._limit + 1 - self.count
        if size < 0 or size > budget:
            size = max(budget, 0)
        data = self._raw.read(size)
        self.count += len(data)
        if self.count > self._limit:
            raise _TooLarge
        return data


def _reject(rule: str, message: str, source: str, entry: str | None = None) -> BadRequest:
    detail = f"Chart archive {source} was rejected ({rule}): {message}"
    return BadRequest(
        detail=detail,
        errors=[FieldError(field="helmChart", message=message, rule=rule, object=entry)],
    )


def _entry_problem(member: tarfile.TarInfo) -> tuple[str, str] | None:
    name = member.name
    if not name or name.startswith("/") or name.startswith("\\") or ":" in name.split("/")[0]:
        return "archive-absolute-path", f"entry '{name}' has an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "archive-parent-path", f"entry '{name}' contains '..'"
    if member.issym():
        return "archive-symlink", f"entry '{name}' is a symbolic link to '{member.linkname}'"
    if member.islnk():
        return "archive-hardlink", f"entry '{name}' is a hard link to '{member.linkname}'"
    if member.ischr() or member.isblk():
        return "archive-device", f"entry '{name}' is a device file"
    if member.isfifo():
        return "archive-device", f"entry '{name}' is a FIFO"
    if not (member.isreg() or member.isdir()):
        return "archive-entry-type", f"entry '{name}' is not a regular file or directory"
    return None


def check_archive(
    path: Path,
    max_bytes: int,
    max_unpacked_bytes: int,
    *,
    max_files: int = DEFAULT_MAX_FILES,
    source: str | None = None,
) -> None:
    """Raise BadRequest naming the rule and entry if the chart archive at `path` is unsafe.

    Streams the archive once; the uncompressed size is counted as it is produced, so neither
    tar headers nor the gzip trailer are trusted.
    """
    where = f"'{source}'" if source else f"'{path.name}'"
    size = path.stat().st_size
    if size > max_bytes:
        raise _reject(
            "archive-compressed-size",
            f"the compressed archive is {size} bytes, more than the limit of {max_bytes} bytes",
            where,
        )
    with path.open("rb") as raw:
        if raw.read(2) != b"\x1f\x8b":
            raise _reject("archive-format", "the archive is not gzip-compressed", where)
        raw.seek(0)
        counter = _CountingReader(gzip.GzipFile(fileobj=raw, mode="rb"), max_unpacked_bytes)
        entries = 0
        top: str | None = None
        has_chart_yaml = False
        current = "(archive header)"
        try:
            with tarfile.open(fileobj=counter, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    current = member.name
                    entries += 1
                    if entries > max_files:
                        raise _reject(
                            "archive-file-count",
                            f"the archive has more than {max_files} entries",
                            where,
                            member.name,
                        )
                    problem = _entry_problem(member)
                    if problem is not None:
                        raise _reject(problem[0], problem[1], where, member.name)
                    parts = [p for p in PurePosixPath(member.name).parts if p != "."]
                    if not parts:
                        continue
                    if top is None:
                        top = parts[0]
                    if parts[0] != top or (len(parts) == 1 and member.isreg()):
                        raise _reject(
                            "archive-layout",
                            f"entry '{member.name}' is outside the single top-level chart "
                            f"directory '{top}/'",
                            where,
                            member.name,
                        )
                    if member.isreg():
                        if parts[1:] == ["Chart.yaml"]:
                            has_chart_yaml = True
                        stream = tar.extractfile(member)
                        if stream is not None:
                            while stream.read(_CHUNK):
                                pass
        except _TooLarge:
            raise _reject(
                "archive-unpacked-size",
                f"the archive unpacks to more than the limit of {max_unpacked_bytes} bytes "
                f"(while reading entry '{current}')",
                where,
                current,
            ) from None
        except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError) as exc:
            raise _reject(
                "archive-format", f"the archive is not a valid gzip tar archive: {exc}", where
            ) from None
    if top is None:
        raise _reject("archive-layout", "the archive is empty", where)
    if not has_chart_yaml:
        raise _reject(
            "archive-layout",
            f"the top-level directory '{top}/' has no Chart.yaml",
            where,
            f"{top}/Chart.yaml",
        )
