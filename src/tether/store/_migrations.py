"""Schema migrations of the run store: append a new list to MIGRATIONS, never edit an old one.

The DDL is plain SQL that SQLite and PostgreSQL both accept (TEXT, BIGINT, DOUBLE PRECISION)."""

from __future__ import annotations

import sqlalchemy as sa

MIGRATIONS: list[list[str]] = [
    [  # 1: runs, events, results, idempotency, audit
        """CREATE TABLE IF NOT EXISTS tether_runs (
            run_id TEXT PRIMARY KEY, agent TEXT NOT NULL, user_id TEXT, status TEXT NOT NULL,
            prompt TEXT NOT NULL DEFAULT '', stop_reason TEXT, error TEXT, answer TEXT,
            usage TEXT, steps BIGINT NOT NULL DEFAULT 0, pending TEXT, state TEXT, config TEXT,
            parent_run TEXT, created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS tether_runs_by_time ON tether_runs (created_at)",
        """CREATE TABLE IF NOT EXISTS tether_events (
            run_id TEXT NOT NULL, seq BIGINT NOT NULL, kind TEXT NOT NULL, step BIGINT NOT NULL,
            t DOUBLE PRECISION NOT NULL, duration DOUBLE PRECISION NOT NULL, data TEXT NOT NULL,
            PRIMARY KEY (run_id, seq))""",
        """CREATE TABLE IF NOT EXISTS tether_results (
            handle TEXT PRIMARY KEY, owner TEXT, body TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS tether_idempotency (
            key TEXT PRIMARY KEY, value TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS tether_audit (
            run_id TEXT NOT NULL, seq BIGINT NOT NULL, record TEXT NOT NULL, PRIMARY KEY (run_id, seq))""",
    ],
    [  # 2: streamed text (before the stored event `seq` it precedes), runs by user
        """CREATE TABLE IF NOT EXISTS tether_text_deltas (
            run_id TEXT NOT NULL, seq BIGINT NOT NULL, idx BIGINT NOT NULL, text TEXT NOT NULL,
            restart BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (run_id, seq, idx))""",
        "CREATE INDEX IF NOT EXISTS tether_runs_by_user ON tether_runs (user_id, created_at)",
    ],
    [  # 3: a run's findings beside its outcome (reading them no longer parses the whole stored state)
        "ALTER TABLE tether_runs ADD COLUMN findings TEXT",
    ],
]


def migrate(engine: sa.Engine) -> int:
    """Bring the schema up to the latest version; safe to run from several processes at once."""
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS tether_schema (version BIGINT NOT NULL)"))
        if engine.dialect.name == "postgresql":  # one migrator at a time
            conn.execute(sa.text("LOCK TABLE tether_schema IN EXCLUSIVE MODE"))
        row = conn.execute(sa.text("SELECT MAX(version) FROM tether_schema")).scalar()
        current = int(row or 0)
        for version in range(current + 1, len(MIGRATIONS) + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(sa.text(statement))
            conn.execute(sa.text("INSERT INTO tether_schema (version) VALUES (:v)"), {"v": version})
    return len(MIGRATIONS)
