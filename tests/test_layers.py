"""The dependency direction of the packages (docs/architecture.md): lower layers never import
higher ones. `core` knows no domain; `health` is pure over `core`; `backends` speak to clusters
knowing only `core` and `health`. The domain packages (auth, functions, charts, clusters,
registry, deployments) sit above them. The `nvcf` client (`client_cli`) stands apart: it
imports nothing of the server, and nothing of the server imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "service"
#: package -> the service packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "health": {"core"},
    "backends": {"core", "health"},
    # the `nvcf` client speaks the REST API only: it imports nothing of the server
    "client_cli": set(),
    # the web console reads everything through the public API, like any other client
    "console": {"core"},
}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    """(service sub-package, line) of every `service.*` import in the file, TYPE_CHECKING ones
    included: a type-only import still couples the modules."""
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "service" and len(parts) > 1:
                found.add((parts[1], node.lineno))
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_lower_layers_import_no_higher_package(package: str) -> None:
    allowed = ALLOWED[package] | {package}
    offending = sorted(
        f"{path.relative_to(ROOT.parent)}:{line} imports service.{target}"
        for path in (ROOT / package).rglob("*.py")
        for target, line in imported_packages(path)
        if target not in allowed
    )
    assert offending == []


def test_no_server_package_imports_the_client() -> None:
    """The server's import graph never reaches the `nvcf` client (service/client_cli/)."""
    offending = sorted(
        f"{path.relative_to(ROOT.parent)}:{line}"
        for path in ROOT.rglob("*.py")
        if "client_cli" not in path.relative_to(ROOT).parts
        for target, line in imported_packages(path)
        if target == "client_cli"
    )
    assert offending == []


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from service.auth.deps import Session\nimport service.functions.models\n"
    )
    assert imported_packages(sample) == {("auth", 3), ("functions", 4)}
