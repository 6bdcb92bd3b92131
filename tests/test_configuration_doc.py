"""docs/configuration.md must match the settings model (regenerate with
`python scripts/export_settings_doc.py`), and every setting must say what it means."""

from __future__ import annotations

from pathlib import Path

from service.core.settings import Settings
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_committed_configuration_doc_is_current() -> None:
    module = load_script("export_settings_doc")
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == module.render(), (
        "docs/configuration.md is stale: run `python scripts/export_settings_doc.py`"
    )


def test_every_setting_is_described_and_listed() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for name, field in Settings.model_fields.items():
        assert field.description, f"NVCF_{name.upper()} has no description"
        assert f"`NVCF_{name.upper()}`" in text
