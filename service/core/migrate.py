"""Run Alembic migrations programmatically (the schema never comes from create_all)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config

ROOT = Path(__file__).resolve().parents[2]


def alembic_config(database_url: str) -> Config:
    # Alembic is imported by the commands that migrate only: a server that does not migrate,
    # and every test server process, is spared its import
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    cfg.attributes["configure_logging"] = False
    return cfg


def sync_url(database_url: str) -> str:
    """Alembic runs synchronously: same database, synchronous driver."""
    return database_url.replace("sqlite+aiosqlite://", "sqlite://", 1)


def upgrade(database_url: str, revision: str = "head") -> None:
    if database_url.startswith("sqlite"):
        path = database_url.split(":///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    from alembic import command

    command.upgrade(alembic_config(sync_url(database_url)), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(sync_url(database_url)), revision)
