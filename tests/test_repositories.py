"""Every SQL statement of a domain with a repository lives in its `repository.py` (Polar's
shape, docs/architecture.md "Where each kind of code lives"): no other module of the package
builds a statement (`select`, `insert`, `update`, `delete` from SQLAlchemy) or runs one on a
session (`execute`, `scalar`, `scalars`, `get`, `delete`). Services and routers call the
repository's functions; `session.add` and `flush` (the unit of work) stay with the use case.
The check is shown failing on a deliberate violation."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "service"
#: packages whose SQL is all in their repository.py
PACKAGES = ("auth", "functions", "registry")
BUILDERS = {"select", "insert", "update", "delete"}
RUNNERS = {"execute", "scalar", "scalars", "get", "delete", "stream"}


def statements(path: Path) -> list[str]:
    """Where `path` builds or runs an SQL statement: "file:line what"."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            for alias in node.names:
                if alias.name in BUILDERS:
                    found.append(f"{path.name}:{node.lineno} imports {alias.name}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in RUNNERS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "session"
        ):
            found.append(f"{path.name}:{node.lineno} session.{node.func.attr}")
    return found


def outside_repositories(root: Path, packages: tuple[str, ...]) -> list[str]:
    return [
        f"{package}/{hit}"
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
        if path.name != "repository.py"
        for hit in statements(path)
    ]


def test_sql_lives_in_the_repositories() -> None:
    assert outside_repositories(ROOT, PACKAGES) == []


def test_a_statement_outside_the_repository_is_seen(tmp_path: Path) -> None:
    package = tmp_path / "things"
    package.mkdir()
    (package / "repository.py").write_text(
        "from sqlalchemy import select\n\nasync def f(session):\n    await session.execute(x)\n"
    )
    (package / "service.py").write_text(
        "from sqlalchemy import func, select\n\n"
        "async def g(session):\n    await session.get(A, 1)\n    session.add(a)\n"
    )
    assert outside_repositories(tmp_path, ("things",)) == [
        "things/service.py:1 imports select",
        "things/service.py:4 session.get",
    ]
