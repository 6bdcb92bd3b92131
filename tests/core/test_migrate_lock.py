"""Replicas that start together on one PostgreSQL database each apply the migrations
(NVCF_AUTO_MIGRATE): one migrates, the others wait for it and find the schema at head."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psycopg
import pytest
from sqlalchemy import create_engine, text

from service.core import migrate
from tests.support.postgres import PostgresServer

UPGRADE = "import sys; from service.core import migrate; migrate.upgrade(sys.argv[1])"


def test_concurrent_upgrades_of_a_fresh_database_all_succeed(
    pg_server: PostgresServer | None,
) -> None:
    if pg_server is None:
        pytest.skip("PostgreSQL is not available on this machine")
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = pg_server.url(name)
    try:
        # separate processes, as replicas are (Alembic's context is one per process)
        replicas = [
            subprocess.Popen(
                [sys.executable, "-c", UPGRADE, url],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        outcomes = [(p.wait(timeout=120), p.communicate()[1][-2000:]) for p in replicas]
        assert [code for code, _ in outcomes] == [0, 0, 0], outcomes
        engine = create_engine(migrate.sync_url(url))
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
        engine.dispose()
        assert len(versions) == 1
    finally:
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
