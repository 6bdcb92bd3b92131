"""Write the OpenAPI document to openapi/openapi.json (the test suite fails when it is stale)."""

from __future__ import annotations

import json
from pathlib import Path

from service.app import create_app
from service.core.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "openapi" / "openapi.json"


def render() -> str:
    app = create_app(Settings(_env_file=None))  # type: ignore[call-arg]
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(render())
    print(f"wrote {TARGET.relative_to(ROOT)}")
