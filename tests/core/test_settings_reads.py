"""Settings are read through the components, not module globals: only the composition
(`app.py`, `cli.py`) builds `Settings`, and no server module reads the environment when it is
imported (a module-level `os.environ`/`os.getenv`). The check is shown failing on a
deliberate violation."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "service"
#: where Settings are built: the composition (the client CLI has settings of its own)
BUILDERS = {"app.py", "cli.py"}
#: modules whose import writes a default into the environment (no setting is read), and why
ENVIRONMENT_DEFAULTS = {
    "__init__.py": "grpcio's GRPC_ENABLE_FORK_SUPPORT must be set before anything imports "
    "grpc, whose C core reads it once (its fork handler writes non-JSON lines to stderr)",
}


def _environment_read(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "os"
        and n.attr in ("environ", "getenv")
        for n in ast.walk(node)
    )


def offences(root: Path) -> list[str]:
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "client_cli":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Settings"
                and str(rel) not in BUILDERS
            ):
                found.append(f"{rel}:{node.lineno} builds Settings")
        for stmt in tree.body:  # module level: runs at import
            if str(rel) in ENVIRONMENT_DEFAULTS:
                continue
            if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and (
                _environment_read(stmt)
            ):
                found.append(f"{rel}:{stmt.lineno} reads the environment at import")
    return found


def test_settings_come_from_the_composition() -> None:
    assert offences(ROOT) == []


def test_a_deliberate_violation_is_seen(tmp_path: Path) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "thing.py").write_text(
        "import os\nfrom service.core.settings import Settings\n"
        "LIMIT = int(os.environ.get('X', '1'))\n"
        "def f():\n    return Settings(), os.environ.get('Y')\n"
    )
    assert offences(tmp_path) == [
        "core/thing.py:5 builds Settings",
        "core/thing.py:3 reads the environment at import",
    ]
