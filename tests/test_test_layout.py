"""Shared test helpers live in tests/support/, fixtures in the nearest conftest.py: no test file
imports from a test module (`test_*.py`) or from a conftest, so each test module can be moved,
renamed or deleted without breaking another, and pytest alone decides which fixtures apply."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_test_module(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return last == "conftest" or last.startswith("test_")


def forbidden_imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) of every import of a test module or conftest in the file,
    relative imports and `from tests.x import conftest` included."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            modules = [base] + [f"{base.rstrip('.')}.{a.name}" for a in node.names]
        else:
            continue
        found.extend((m, node.lineno) for m in modules if _is_test_module(m))
    return found


def test_no_test_file_imports_a_test_module_or_conftest() -> None:
    offending = sorted(
        f"{path.relative_to(TESTS.parent)}:{line} imports {module}"
        for path in TESTS.rglob("*.py")
        for module, line in forbidden_imports(path)
    )
    assert offending == []


def test_the_check_sees_every_form_of_such_import(tmp_path: Path) -> None:
    sample = tmp_path / "test_m.py"
    sample.write_text(
        "from tests.deployments.test_e2e import eventually\n"
        "from tests.conftest import AppClient\n"
        "from tests.charts import conftest as chart_fixtures\n"
        "import tests.core.test_http\n"
        "from .test_reconciler import Harness\n"
        "from . import conftest\n"
        "from tests.support.e2e import eventually\n"
        "from service.deployments import transitions\n"
    )
    assert forbidden_imports(sample) == [
        ("tests.deployments.test_e2e", 1),
        ("tests.conftest", 2),
        ("tests.charts.conftest", 3),
        ("tests.core.test_http", 4),
        (".test_reconciler", 5),
        (".conftest", 6),
    ]
