"""Write docs/configuration.md from the settings model (the test suite fails when it is stale)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from service.core.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "configuration.md"
#: the modules the settings' fields are written in (service/core/settings.py composes them)
SOURCES = sorted((ROOT / "service" / "core").glob("settings*.py"))

HEADER = """# Configuration

Every setting of `nvcf-server`, read from environment variables prefixed `NVCF_` or from a
`.env` file in the working directory. Generated from `service/core/settings.py` by
`python scripts/export_settings_doc.py`; a test fails when this file is stale.

Durations are seconds (fractions allowed), sizes are bytes, comma lists are case-insensitive.
A bad value stops the server at start with a line naming the setting.
"""


def _default(field: FieldInfo) -> str:
    value: Any = field.default
    if value is PydanticUndefined or value is None:
        return "unset"
    if isinstance(value, frozenset):
        return ", ".join(sorted(value)) or "empty"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        mib = value // (1024 * 1024)
        return f"{value} ({mib // 1024} GiB)" if mib % 1024 == 0 else f"{value} ({mib} MiB)"
    return json.dumps(value) if isinstance(value, str) else str(value)


def _bounds(field: FieldInfo) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            bound = getattr(meta, attr, None)
            if bound is not None:
                parts.append(f"{sign} {bound}")
        pattern = getattr(meta, "pattern", None)
        if pattern is not None:
            parts.append(f"matches `{pattern}`")
    return "; ".join(parts)


def _sections() -> dict[str, str]:
    """Each field's section: the `# -- title` comment above it in the source."""
    sections: dict[str, str] = {}
    for source in SOURCES:
        title = "General"
        for line in source.read_text().splitlines():
            heading = re.match(r"\s+# -- (.+)", line)
            if heading:
                title = heading.group(1)[0].upper() + heading.group(1)[1:]
                continue
            name = re.match(r"    (\w+): ", line)
            if name and name.group(1) in Settings.model_fields:
                sections[name.group(1)] = title
    return sections


def render() -> str:
    sections = _sections()
    out = [HEADER]
    current = None
    for name, field in Settings.model_fields.items():
        section = sections.get(name, "General")
        if section != current:
            out += [f"\n## {section}\n", "| Setting | Default | Meaning |", "|---|---|---|"]
            current = section
        meaning = (field.description or "").replace("|", "\\|")
        bounds = _bounds(field)
        if bounds:
            meaning += f" ({bounds})"
        out.append(f"| `NVCF_{name.upper()}` | {_default(field)} | {meaning} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    TARGET.write_text(render())
    print(f"wrote {TARGET.relative_to(ROOT)}")
