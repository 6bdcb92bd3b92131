"""The declared order of the packages (docs/architecture.md, "The domain order"): a package
imports only packages before it in `ORDER`, so no two packages import each other, and no module
takes part in an import circle. `core` knows no domain; `health` is pure over `core`; `backends`
speak to clusters knowing only `core` and `health`; the domains follow, each above those it
uses; the composition (`app.py` and what only it reads) comes last. Where a lower domain must
cause work in a higher one it publishes an event (core/events.py) that the composition
subscribes to.

Inside a package the same holds one level down: its parts (each sub-package taken whole, and
each module of the package itself) take part in no circle, so that every sub-package can be read
as a unit above those it uses.

The `nvcf` client (`client_cli`) stands apart: it imports nothing of the server, and nothing
of the server imports it. The web console reads everything through the public API."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "service"

#: lowest first: each may import only those before it (TYPE_CHECKING imports included)
ORDER = [
    "core",
    "health",
    "backends",
    "auth",
    "ngc",
    "registry",
    "clusters",
    "metering",
    "charts",
    "observability",
    "functions",
    "deployments",
    "assets",
    "tasks",
    "invocation",
    "llm",
    "accounts",
    # the composition: the app's metric families, its typed state, the table list for
    # migrations, the lifespan, the application factory and the command line
    "telemetry",
    "state",
    "models",
    "lifespan",
    "app",
    "cli",
]
#: outside the order: package -> the packages it may import
APART: dict[str, set[str]] = {
    # the `nvcf` client speaks the REST API only: it imports nothing of the server
    "client_cli": set(),
    # the web console reads everything through the public API, like any other client
    "console": {"core"},
}
#: what the composition mounts besides the order: the console's pages
MOUNTS: dict[str, set[str]] = {"app": {"console"}}
#: imports against the order still to be removed: "file -> package"
KNOWN: set[str] = set()
#: module circles still to be broken
KNOWN_CIRCLES: list[list[str]] = []
#: packages whose parts still import each other in a circle -> why it stays for now
KNOWN_PART_CIRCLES: dict[str, str] = {}


def allowed(package: str) -> set[str]:
    if package in APART:
        return APART[package] | {package}
    return set(ORDER[: ORDER.index(package) + 1]) | MOUNTS.get(package, set())


def imported_packages(path: Path, root: Path = ROOT) -> set[tuple[str, int]]:
    """(service sub-package, line) of every `service.*` import in the file, TYPE_CHECKING ones
    included: a type-only import still couples the modules."""
    return {(name.split(".")[1], line) for name, line in imported_modules(path, root)}


def dotted(path: Path, root: Path) -> str:
    """The module a file under `root` (a `service` tree) is: `service.a.b`, `service.a` for
    `a/__init__.py`."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, root: Path = ROOT) -> set[tuple[str, int]]:
    """(dotted name, line) of every `service.*` import in the file under `root`, relative ones
    resolved: `from service.a import b` (or `from . import b` in service/a/) gives `service.a.b`
    (whether b is a module or a name in service.a: see `module_of`)."""
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {(a.name, node.lineno) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = dotted(path, root)
                if path.name != "__init__.py":
                    package = package.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            found |= {(f"{base}.{a.name}", node.lineno) for a in node.names}
    return {(n, line) for n, line in found if n.startswith("service.") and n.count(".") >= 1}


def package_of(path: Path, root: Path) -> str:
    return path.relative_to(root).parts[0].removesuffix(".py")


def violations(root: Path) -> list[str]:
    """Every import against the order under `root` (a `service` tree), as "file:line -> pkg"."""
    found = []
    for path in sorted(root.rglob("*.py")):
        package = package_of(path, root)
        for target, line in imported_packages(path, root):
            if target not in allowed(package):
                found.append(f"{path.relative_to(root.parent)}:{line} -> {target}")
    return found


def modules(root: Path) -> dict[str, Path]:
    return {dotted(path, root): path for path in root.rglob("*.py")}


def module_of(name: str, known: Iterable[str]) -> str | None:
    """The module `name` (from `imported_modules`) denotes: itself, or the module it is a name
    of."""
    names = set(known)
    if name in names:
        return name
    parent = name.rpartition(".")[0]
    return parent if parent in names else None


def _packages_run_first(target: str, importer: str, known: Iterable[str]) -> list[str]:
    """The packages whose `__init__` importing `target` runs first: its enclosing packages,
    but those of the importer (already running when it imports)."""
    names = set(known)
    parts = target.split(".")
    enclosing = {".".join(parts[:i]) for i in range(1, len(parts))}
    mine = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 2)}
    return sorted(p for p in enclosing - mine if p in names)


def module_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules under `root` its imports run (TYPE_CHECKING imports included)."""
    mods = modules(root)
    return {
        m: {
            t
            for name, _ in imported_modules(p, root)
            if (target := module_of(name, mods)) is not None
            for t in (target, *_packages_run_first(target, m, mods))
            if t != m
        }
        for m, p in mods.items()
    }


def circles(root: Path) -> list[list[str]]:
    """The import circles between modules under `root` (strongly connected components of more
    than one module; TYPE_CHECKING imports included)."""
    return strongly_connected(module_graph(root))


def part_circles(root: Path) -> dict[str, list[list[str]]]:
    """package -> the circles between its parts (a sub-package taken whole, a module of the
    package itself), for every package under `root` that has any."""
    graph = module_graph(root)
    packages = {dotted(p, root) for p in root.rglob("__init__.py")}
    found: dict[str, list[list[str]]] = {}
    for package in sorted(packages):
        depth = package.count(".") + 2

        def part(module: str, depth: int = depth, package: str = package) -> str | None:
            inside = module.startswith(f"{package}.")
            return ".".join(module.split(".")[:depth]) if inside else None

        parts: dict[str, set[str]] = {}
        for module, targets in graph.items():
            if (mine := part(module)) is not None:
                edges = parts.setdefault(mine, set())
                edges |= {p for t in targets if (p := part(t)) is not None and p != mine}
        if circle := strongly_connected(parts):
            found[package] = circle
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node, each sorted, in order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, set())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_every_package_has_its_place() -> None:
    placed = set(ORDER) | set(APART)
    everything = {package_of(p, ROOT) for p in ROOT.rglob("*.py") if p != ROOT / "__init__.py"}
    unplaced = sorted(everything - placed)
    assert unplaced == []


def _known_as(violation: str) -> str:
    """ "service/a/b.py:12 -> pkg" as KNOWN spells it: "service/a/b.py -> pkg"."""
    where, _, target = violation.partition(" -> ")
    return f"{where.rpartition(':')[0]} -> {target}"


def test_imports_follow_the_order() -> None:
    found = violations(ROOT)
    assert [v for v in found if _known_as(v) not in KNOWN] == []
    # an exception removed from the code is removed from KNOWN too
    assert KNOWN - {_known_as(v) for v in found} == set()


def test_no_module_circle() -> None:
    assert circles(ROOT) == KNOWN_CIRCLES


def test_no_circle_between_the_parts_of_a_package() -> None:
    """Within each package, its sub-packages and its own modules are ordered as the packages
    are: a sub-package is used whole, from above."""
    assert set(part_circles(ROOT)) == set(KNOWN_PART_CIRCLES)


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
    assert imported_packages(sample, tmp_path) == {("auth", 3), ("functions", 4)}


def test_a_relative_import_is_read(tmp_path: Path) -> None:
    """`from . import x` and `from ..a import b` couple modules as absolute imports do."""
    service = _tree(
        tmp_path,
        {
            "functions/__init__.py": "",
            "functions/secrets.py": "from . import models\nfrom ..deployments import service\n",
            "functions/models.py": "",
            "deployments/__init__.py": "from .service import y\n",
            "deployments/service.py": "from service.functions.secrets import s\n",
        },
    )
    assert imported_modules(service / "functions" / "secrets.py", service) == {
        ("service.functions.models", 1),
        ("service.deployments.service", 2),
    }
    assert violations(service) == ["service/functions/secrets.py:2 -> deployments"]
    assert circles(service) == [
        ["service.deployments", "service.deployments.service", "service.functions.secrets"]
    ]


def _tree(root: Path, files: dict[str, str]) -> Path:
    service = root / "service"
    for name, text in files.items():
        path = service / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return service


def test_a_deliberate_violation_fails(tmp_path: Path) -> None:
    """A lower domain importing a higher one is reported, with the file and line."""
    service = _tree(
        tmp_path,
        {
            "functions/__init__.py": "",
            "functions/secrets.py": "import uuid\nfrom service.deployments.service import x\n",
            "deployments/__init__.py": "",
            "deployments/service.py": "from service.functions.secrets import y\n",
        },
    )
    assert violations(service) == ["service/functions/secrets.py:2 -> deployments"]


@pytest.mark.parametrize(
    ("a", "b", "circle"),
    [
        (
            "from service.charts.render import r\n",
            "from service.charts import helm_engine\n",
            [["service.charts.helm_engine", "service.charts.render"]],
        ),
        ("from service.charts.render import r\n", "import json\n", []),
    ],
)
def test_a_module_circle_is_seen(tmp_path: Path, a: str, b: str, circle: list[list[str]]) -> None:
    service = _tree(
        tmp_path,
        {"charts/__init__.py": "", "charts/helm_engine.py": a, "charts/render.py": b},
    )
    assert circles(service) == circle


def test_a_circle_through_a_package_init_is_seen(tmp_path: Path) -> None:
    """Importing a submodule runs its package's `__init__` first: a re-export there closes a
    circle no import line names (deployments.metrics → autoscale.policy runs autoscale's
    `__init__`, which imported autoscale.loop, which imports deployments.metrics)."""
    service = _tree(
        tmp_path,
        {
            "deployments/__init__.py": "",
            "deployments/metrics.py": "from service.deployments.autoscale.policy import P\n",
            "deployments/autoscale/__init__.py": (
                "from service.deployments.autoscale.loop import L\n"
            ),
            "deployments/autoscale/policy.py": "P = 1\n",
            "deployments/autoscale/loop.py": "from service.deployments.metrics import M\n",
        },
    )
    assert circles(service) == [
        [
            "service.deployments.autoscale",
            "service.deployments.autoscale.loop",
            "service.deployments.metrics",
        ]
    ]


def test_a_circle_between_sub_packages_is_seen(tmp_path: Path) -> None:
    """Two sub-packages using each other through different modules: no module circle, but
    neither can be read without the other (the `backends/logs` ⇄ `backends/simulated` of
    issue 42)."""
    service = _tree(
        tmp_path,
        {
            "backends/__init__.py": "",
            "backends/logs/__init__.py": "",
            "backends/logs/simulated.py": "from service.backends.simulated.model import M\n",
            "backends/simulated/__init__.py": "",
            "backends/simulated/model.py": "",
            "backends/simulated/adapter.py": "from .. import logs\nfrom ..logs import simulated\n",
        },
    )
    assert circles(service) == []
    assert part_circles(service) == {
        "service.backends": [["service.backends.logs", "service.backends.simulated"]]
    }


#: the modules that read the application's state: the composition (and its lifespan), which
#: builds it and declares its types, and core's `Component`, the typed read every `deps.py`
#: goes through
STATE_READERS = {"app.py", "lifespan.py", "state.py", "core/components.py"}


def app_state_reads(root: Path) -> list[str]:
    """Where a module outside `STATE_READERS` reads the application's state (`app.state`,
    `request.app.state`, `self.app.state`, an ASGI middleware's `scope["app"].state`, ...):
    "file:line"."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() in STATE_READERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "state" and _is_app(node.value):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def _is_app(owner: ast.expr) -> bool:
    """`app`, `x.app`, `x["app"]` or `x.get("app")`: an expression naming the application."""
    if isinstance(owner, ast.Name):
        return owner.id == "app"
    if isinstance(owner, ast.Attribute):
        return owner.attr == "app"
    if isinstance(owner, ast.Subscript):
        key: ast.expr | None = owner.slice
    elif isinstance(owner, ast.Call) and ast.unparse(owner.func).endswith(".get"):
        key = owner.args[0] if owner.args else None
    else:
        return False
    return isinstance(key, ast.Constant) and key.value == "app"


def test_only_the_composition_reads_the_application_state() -> None:
    """Routes take components as dependencies (each package's `deps.py`); no module reaches
    into `app.state` itself."""
    assert app_state_reads(ROOT) == []


def test_a_read_of_the_application_state_is_seen(tmp_path: Path) -> None:
    service = _tree(
        tmp_path,
        {
            "app.py": "app.state.settings = s\n",
            "core/components.py": "x = connection.app.state\n",
            "deployments/router.py": (
                "def f(request):\n    s = request.app.state.timeseries\n"
                "    return getattr(request.app.state, 'x', None), request.state.principal\n"
            ),
            "functions/read_cache.py": (
                "async def __call__(self, scope, receive, send):\n"
                "    state = scope['app'].state\n"
                "    return scope['state'], scope.get('app').state\n"
            ),
            "telemetry.py": "state = app.state\n",
        },
    )
    assert app_state_reads(service) == [
        "service/deployments/router.py:2",
        "service/deployments/router.py:3",
        "service/functions/read_cache.py:2",
        "service/functions/read_cache.py:3",
        "service/telemetry.py:1",
    ]


def components(root: Path) -> dict[str, str]:
    """Every `Component[T]("name")` declared under `root`: name -> T as written."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Subscript)
                and ast.unparse(node.func.value) == "Component"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found[str(node.args[0].value)] = ast.unparse(node.func.slice)
    return found


def test_each_component_is_read_with_the_type_the_state_declares() -> None:
    """A `Component` names an attribute of `service.state.AppState`, with its declared type."""
    declared = {
        name: ast.unparse(node.annotation)
        for node in ast.walk(ast.parse((ROOT / "state.py").read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "AppState"
        for node in node.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        for name in [node.target.id]
    }
    read = components(ROOT)
    assert read  # the check sees them
    assert {n: t for n, t in read.items() if declared.get(n) != t} == {}
