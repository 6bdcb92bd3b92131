"""Migration 0007 (deployment history): existing deployments, instances and timelines come
through the upgrade unchanged, the timeline no longer goes with its deployment row, and the
downgrade restores the cascade; on both databases."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text

from service.core import migrate

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _engine(database_url: str) -> Engine:
    engine = create_engine(migrate.sync_url(database_url))
    if engine.dialect.name == "sqlite":
        # as the app's connections do (service/core/db.py): the constraint is enforced

        @event.listens_for(engine, "connect")
        def _fk(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA foreign_keys=ON")

    return engine


def _insert_deployment(engine: Engine, events: int) -> str:
    dep, spec = str(uuid.uuid4()), str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO deployments (id, account_id, function_id, version_id, "
                "function_name, desired, feature_flags, generation, due_at, created_at, "
                "updated_at) VALUES (:id, 'acct', :fid, :vid, 'fn', 'deployed', '{}', 1, NULL, "
                ":at, :at)"
            ),
            {"id": dep, "fid": str(uuid.uuid4()), "vid": str(uuid.uuid4()), "at": T0},
        )
        conn.execute(
            text(
                "INSERT INTO deployment_specs (id, deployment_id, position, gpu, instance_type, "
                "backend, candidate_clusters, min_instances, max_instances, "
                "max_request_concurrency, preferred_order, objects) VALUES (:id, :dep, 0, "
                "'H100', 'NCP.GPU.H100_1x', 'group', '[]', 1, 1, 1, 1, '[]')"
            ),
            {"id": spec, "dep": dep},
        )
        conn.execute(
            text(
                "INSERT INTO instances (id, deployment_id, spec_id, account_id, desired, "
                "applied, phase, since, created_at, updated_at) VALUES (:id, :dep, :spec, "
                "'acct', 'absent', false, 'Failed', :at, :at, :at)"
            ),
            {"id": str(uuid.uuid4()), "dep": dep, "spec": spec, "at": T0},
        )
        for i in range(events):
            conn.execute(
                text(
                    "INSERT INTO deployment_events (deployment_id, at, kind, message) "
                    "VALUES (:dep, :at, 'status', :message)"
                ),
                {"dep": dep, "at": T0 + timedelta(seconds=i), "message": f"event {i}"},
            )
    return dep


def _events(engine: Engine) -> list[tuple[int, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, deployment_id, message FROM deployment_events ORDER BY id")
        ).all()
    return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]


def _count(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_upgrade_keeps_timelines_and_drops_the_cascade(database_url: str) -> None:
    migrate.downgrade(database_url, "0006")
    engine = _engine(database_url)
    try:
        first = _insert_deployment(engine, events=3)
        second = _insert_deployment(engine, events=2)
        before = _events(engine)
        assert len(before) == 5

        migrate.upgrade(database_url)
        assert _events(engine) == before  # ids, owners and messages as they were
        assert (_count(engine, "deployments"), _count(engine, "instances")) == (2, 2)
        with engine.connect() as conn:
            inspector = inspect(conn)
            assert inspector.get_foreign_keys("deployment_events") == []
            indexes = {i["name"] for i in inspector.get_indexes("deployment_history")}
            assert "ix_deployment_history_expires_at" in indexes
        assert _count(engine, "deployment_history") == 0

        # removing a deployment row leaves its timeline (the history keeps it)
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM deployments WHERE id = :id"), {"id": first})
        assert [e for e in _events(engine) if e[1] == first] == [e for e in before if e[1] == first]

        # downgrade: the orphaned timeline goes, the cascade is back
        migrate.downgrade(database_url, "0006")
        assert _events(engine) == [e for e in before if e[1] == second]
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM deployments WHERE id = :id"), {"id": second})
        assert _events(engine) == []
        migrate.upgrade(database_url)
    finally:
        engine.dispose()
