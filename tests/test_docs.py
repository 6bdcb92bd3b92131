"""The docs name only what exists: every module path (`service/x/y.py`, `x/y.py` inside an
area, `service.x.y`) and every `NVCF_*` name in docs/ and the README is a file, a module or a
setting of this checkout, so a doc cannot go on describing code that was moved or removed."""

from __future__ import annotations

import re
from pathlib import Path

from service.core.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
SETTINGS = {f"NVCF_{name.upper()}" for name in Settings.model_fields}
#: where names read by other programs than the server are defined (the client CLI's, tests')
SOURCES = [*(ROOT / "service").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), ROOT / "Makefile"]


def _module_exists(dotted: str) -> bool:
    """`service.a.b` is a package or module, or a name in a module (`service.a.b.Name`)."""
    parts = dotted.split(".")
    path = ROOT.joinpath(*parts)
    return (
        path.is_dir() or path.with_suffix(".py").exists() or path.parent.with_suffix(".py").exists()
    )


def _path_exists(path: str) -> bool:
    """From the root (`service/x.py`, `scripts/x.py`), from `service/` (`core/http.py`), or
    inside an area (`logs/keep.py` for service/deployments/logs/keep.py)."""
    if (ROOT / path).exists() or (ROOT / "service" / path).exists():
        return True
    return any((area / path).exists() for area in (ROOT / "service").iterdir() if area.is_dir())


def missing_names(text: str, known_names: set[str]) -> list[str]:
    missing = []
    for match in re.finditer(r"(?<![\w.-])((?:[\w-]+/)+[\w-]+\.py)\b", text):
        if not _path_exists(match.group(1)):
            missing.append(match.group(1))
    for match in re.finditer(r"(?<![\w/.])service(?:\.\w+){2,}", text):  # not service.name
        if not _module_exists(match.group()):
            missing.append(match.group())
    for match in re.finditer(r"\bNVCF_[A-Z0-9_]*[A-Z0-9]_?", text):
        name = match.group()
        if name.endswith("_"):  # a family: NVCF_QUOTA_*
            if not any(s.startswith(name) for s in SETTINGS):
                missing.append(name)
        elif name not in SETTINGS and name not in known_names:
            missing.append(name)
    return missing


def test_every_module_path_and_setting_a_doc_names_exists() -> None:
    read_elsewhere = {
        name
        for source in SOURCES
        for name in re.findall(r"\bNVCF_[A-Z0-9_]+\b", source.read_text(errors="replace"))
    }
    found = {
        f"{doc.relative_to(ROOT)}: {name}"
        for doc in DOCS
        for name in missing_names(doc.read_text(), read_elsewhere)
    }
    assert sorted(found) == []


def test_the_check_sees_each_kind_of_name() -> None:
    text = (
        "`service/invocation/router.py`, `invocation/http.py`, `logs/keep.py`, `core/gone.py`, "
        "service.invocation.http.InvocationEntry, service.invocation.plane, "
        "`NVCF_INVOKE_ENABLED`, `NVCF_NO_SUCH_SETTING`, `NVCF_QUOTA_*`, `NVCF_NOPE_*`"
    )
    assert missing_names(text, set()) == [
        "service/invocation/router.py",
        "core/gone.py",
        "service.invocation.plane",
        "NVCF_NO_SUCH_SETTING",
        "NVCF_NOPE_",
    ]
