"""No module under service/ is longer than `LIMIT` lines: a longer one holds more than one job
and is split along its seams (docs/architecture.md, "The domain order"). A module still to be
split is listed in `PENDING` with why, and leaves the list once it is split."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "service"

LIMIT = 650
#: modules over the limit still to be split: "path under service/" -> why. Each leaves when it
#: is split.
PENDING: dict[str, str] = {}


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def too_long(root: Path, limit: int = LIMIT) -> dict[str, int]:
    """Every module under `root` longer than `limit` lines -> its length."""
    return {
        path.relative_to(root).as_posix(): n
        for path in sorted(root.rglob("*.py"))
        if (n := lines(path)) > limit
    }


def test_no_module_is_too_long() -> None:
    over = too_long(ROOT)
    assert {m: n for m, n in over.items() if m not in PENDING} == {}
    # a module split (or gone) leaves PENDING
    assert sorted(set(PENDING) - set(over)) == []


def test_the_check_sees_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "long.py").write_text("x = 1\n" * 11)
    (tmp_path / "short.py").write_text("x = 1\n" * 10)
    assert too_long(tmp_path, limit=10) == {"a/long.py": 11}
