"""Every SQL statement of a domain with a repository lives in its `repository.py` (Polar's
shape, docs/architecture.md "Where each kind of code lives"): no other module of the package
builds a statement (`select`, `insert`, `update`, `delete` from SQLAlchemy) or runs one on a
session (`execute`, `scalar`, `scalars`, `get`, `delete`). Services and routers call the
repository's functions; `session.add` and `flush` (the unit of work) stay with the use case.
A few modules hold statements by design, each declared with its reason (`STATEMENTS`). The
check is shown failing on a deliberate violation.

Each table belongs to one package (its `models.py`); a module of another package reads or writes
it only through that package's functions: it names the table in no SQL statement (builders,
joins, clauses, loader options, `session.get`) and creates none of its rows. Shown failing on a
deliberate violation too."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "service"
#: packages whose SQL is all in their repository.py (or a module declared in `STATEMENTS`)
PACKAGES = (
    "auth",
    "functions",
    "registry",
    "metering",
    "deployments",
    "assets",
    "tasks",
    "invocation",
)
#: modules (or folders, ending in "/") that hold statements by design: path -> why
STATEMENTS: dict[str, str] = {
    "deployments/transitions/": "the one writer of deployment, instance and version state: "
    "each transition's guarded UPDATE (compare-and-set on the phase) is the transition "
    "(tests/deployments/test_single_writer.py)",
    "deployments/reconcile/store.py": "the reconciler's store: what is due, lease claims and "
    "bulk renewals, statements shaped by the pass that runs them (a pass with nothing due "
    "costs two index probes)",
    "deployments/autoscaler/store.py": "the autoscaler's store: its readings, row locks and "
    "compare-and-set memory, shaped by the reading that runs them",
    "deployments/timeseries/store.py": "the sampler's store: one grouped count of Running "
    "instances per sampling period, beside the counters it reads",
    "deployments/load_signal.py": "the load signal's store: the replicas' reports (upserts in "
    "the session's dialect) and their sum, the one module the invocation plane writes through",
    "deployments/canary_figures.py": "the canary figures' store: each replica's rows of a "
    "release's step (only their owner writes them) and their sum, the one module the "
    "invocation plane reports its measurements through",
    "invocation/store.py": "the invocation plane's store (`RequestStore`): every statement of "
    "its polled requests and replica heartbeats, on the sessions the store is built with",
}
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


def _declared(relative: str, declared: Collection[str]) -> bool:
    return any(relative == d or (d.endswith("/") and relative.startswith(d)) for d in declared)


def outside_repositories(
    root: Path, packages: tuple[str, ...], declared: Collection[str] = ()
) -> list[str]:
    """Every statement of `packages` outside their repository.py and the `declared` modules,
    as "package/sub/file.py:line what"."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if path.name == "repository.py" or _declared(relative, declared):
                continue
            found += [f"{relative.rpartition('/')[0]}/{hit}" for hit in statements(path)]
    return found


def test_sql_lives_in_the_repositories() -> None:
    assert outside_repositories(ROOT, PACKAGES, STATEMENTS.keys()) == []


def test_each_declared_module_holds_statements() -> None:
    """A declaration outlives no module: each names statements still there."""
    stale = [
        d
        for d in STATEMENTS
        if not any(
            statements(p)
            for p in ([ROOT / d] if not d.endswith("/") else sorted((ROOT / d).rglob("*.py")))
            if p.exists()
        )
    ]
    assert stale == []


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
    (package / "stores").mkdir()
    (package / "stores" / "cache.py").write_text("async def h(session):\n    session.get(A, 1)\n")
    (package / "stores" / "log.py").write_text("async def k(session):\n    session.scalar(q)\n")
    assert outside_repositories(tmp_path, ("things",), {"things/stores/cache.py"}) == [
        "things/service.py:1 imports select",
        "things/service.py:4 session.get",
        "things/stores/log.py:2 session.scalar",
    ]
    assert outside_repositories(tmp_path, ("things",), {"things/stores/"}) == [
        "things/service.py:1 imports select",
        "things/service.py:4 session.get",
    ]


#: calls whose arguments are part of an SQL statement (builders, clauses, loader options,
#: `session.get`): a table named in them is read or written by the statement
SQL_CALLS = BUILDERS | {
    "aliased",
    "exists",
    "join",
    "outerjoin",
    "select_from",
    "where",
    "filter",
    "filter_by",
    "having",
    "order_by",
    "group_by",
    "values",
    "returning",
    "on_conflict_do_update",
    "on_conflict_do_nothing",
    "with_only_columns",
    "add_columns",
    "get",
    "selectinload",
    "joinedload",
    "contains_eager",
}


def table_owners(root: Path) -> dict[str, str]:
    """ORM class name -> the package whose `models.py` declares it (a class with a
    `__tablename__`)."""
    owners: dict[str, str] = {}
    for path in sorted(root.rglob("models.py")):
        parts = path.relative_to(root).parts
        if len(parts) < 2:
            continue  # service/models.py: the composition's list of every table
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            if isinstance(node, ast.ClassDef) and any(
                isinstance(s, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__tablename__" for t in s.targets)
                for s in node.body
            ):
                owners[node.name] = parts[0]
    return owners


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def foreign_tables(path: Path, package: str, owners: dict[str, str]) -> list[str]:
    """Where `path` (a module of `package`) names another package's table in an SQL statement
    or creates one of its rows: "file:line Model (owner)". The table is named through an
    import of it (`from service.functions.models import FunctionVersion as V`) or of its
    module (`from service.functions import models`, `import service.functions.models as m`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    foreign: dict[str, str] = {}  # local name -> the model it is bound to
    modules: set[str] = set()  # local names of another package's models module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            owner = node.module.split(".")[1] if node.module.startswith("service.") else None
            if owner is None or owner == package:
                continue
            for alias in node.names:
                if node.module.endswith(".models") and owners.get(alias.name) == owner:
                    foreign[alias.asname or alias.name] = alias.name
                elif alias.name == "models":
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "service" and parts[-1] == "models" and parts[1] != package:
                    modules.add(alias.asname or alias.name)

    def model(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return foreign.get(node.id)
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) in modules:
            return node.attr if node.attr in owners else None
        return None

    if not foreign and not modules:
        return []
    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if (created := model(node.func)) is not None:
            found.add((node.lineno, created))  # a row created: an insert
        if _callee(node) not in SQL_CALLS:
            continue
        for argument in [*node.args, *(k.value for k in node.keywords)]:
            for name in ast.walk(argument):
                if isinstance(name, ast.expr) and (named := model(name)) is not None:
                    found.add((name.lineno, named))
    return [f"{path.name}:{line} {model} ({owners[model]})" for line, model in sorted(found)]


def cross_package_tables(root: Path) -> list[str]:
    """Every use of a package's table by a module of another package, as
    "package/sub/file.py:line Model (owner)"."""
    owners = table_owners(root)
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if len(relative.parts) < 2:
            continue  # the composition (app.py, models.py, ...) sees every package
        for hit in foreign_tables(path, relative.parts[0], owners):
            found.append(f"{relative.parent}/{hit}")
    return found


#: uses of another package's table kept by design: "package/file.py Model (owner)" -> why
DECLARED: dict[str, str] = {
    # deployments' transitions are the one writer of a version's status, a state derived from
    # its deployments (tests/deployments/test_single_writer.py: only that package sets it)
    "deployments/transitions/status.py FunctionVersion (functions)": "the status writer",
    "deployments/transitions/deployment.py FunctionVersion (functions)": "the status writer",
}
#: uses still to be moved into the owner's repository (none left)
KNOWN: set[str] = set()


def _where(hit: str) -> str:
    """ "pkg/file.py:12 Model (owner)" as KNOWN spells it: "pkg/file.py Model (owner)"."""
    where, _, what = hit.partition(" ")
    return f"{where.rpartition(':')[0]} {what}"


def test_tables_are_used_through_their_package() -> None:
    found = cross_package_tables(ROOT)
    assert [h for h in found if _where(h) not in KNOWN | DECLARED.keys()] == []
    # an exception removed from the code is removed from the lists too
    assert (KNOWN | DECLARED.keys()) - {_where(h) for h in found} == set()


def test_another_package_s_table_in_a_statement_is_seen(tmp_path: Path) -> None:
    service = tmp_path / "service"
    files = {
        "functions/__init__.py": "",
        "functions/models.py": (
            "class Base: ...\n\nclass Version(Base):\n    __tablename__ = 'versions'\n\n"
            "class Kind: ...\n"
        ),
        "functions/repository.py": "from service.functions.models import Version\n"
        "def f(): return select(Version)\n",
        "deployments/__init__.py": "",
        "deployments/views.py": (
            "from service.functions.models import Kind, Version as V\n\n"
            "def typed(v: V, k: Kind) -> V: return v\n\n"
            "async def reads(session, ids):\n"
            "    stmt = select(D.id).join(V, V.id == D.version_id)\n"
            "    stmt = stmt.where(V.status == 'ACTIVE')\n"
            "    one = await session.get(V, ids[0])\n"
            "    session.add(V(id=1))\n"
            "    return select(Kind)\n"
        ),
        "deployments/counts.py": (
            "import service.functions.models\n"
            "import service.functions.models as fm\n"
            "from service.functions import models\n\n"
            "def n(v: models.Version):\n"
            "    a = select(models.Version.id)\n"
            "    b = update(fm.Version).values(status='x')\n"
            "    return a, b, delete(service.functions.models.Version)\n"
        ),
    }
    for name, text in files.items():
        path = service / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert cross_package_tables(service) == [
        "deployments/counts.py:6 Version (functions)",
        "deployments/counts.py:7 Version (functions)",
        "deployments/counts.py:8 Version (functions)",
        "deployments/views.py:6 Version (functions)",
        "deployments/views.py:7 Version (functions)",
        "deployments/views.py:8 Version (functions)",
        "deployments/views.py:9 Version (functions)",
    ]
