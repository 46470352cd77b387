"""The service's own tables (API keys, idempotent submissions, decided approvals, worker heartbeats),
beside the run
store in the same database, with their own migrations."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any

import sqlalchemy as sa

MIGRATIONS: list[list[str]] = [
    [  # 1
        """CREATE TABLE IF NOT EXISTS tether_api_keys (
            key_hash TEXT PRIMARY KEY, user_id TEXT NOT NULL, label TEXT, created_at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS tether_task_keys (
            user_id TEXT NOT NULL, key TEXT NOT NULL, body_hash TEXT NOT NULL, task_id TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (user_id, key))""",
        """CREATE TABLE IF NOT EXISTS tether_decisions (
            run_id TEXT NOT NULL, call_id TEXT NOT NULL, approved BIGINT NOT NULL, by_user TEXT NOT NULL,
            reason TEXT, created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (run_id, call_id))""",
        """CREATE TABLE IF NOT EXISTS tether_workers (
            executor_id TEXT PRIMARY KEY, beat_at DOUBLE PRECISION NOT NULL, started_at DOUBLE PRECISION NOT NULL)""",
    ],
]


def migrate(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS tether_service_schema (version BIGINT NOT NULL)"))
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text("LOCK TABLE tether_service_schema IN EXCLUSIVE MODE"))
        current = int(conn.execute(sa.text("SELECT MAX(version) FROM tether_service_schema")).scalar() or 0)
        for version in range(current + 1, len(MIGRATIONS) + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(sa.text(statement))
            conn.execute(sa.text("INSERT INTO tether_service_schema (version) VALUES (:v)"), {"v": version})


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ServiceTables:
    """API keys (only their hashes are stored), idempotency keys of submissions, decisions."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        migrate(engine)

    def add_key(self, user: str, label: str = "") -> str:
        """A new API key for `user`; returned once, never stored in clear."""
        key = "tk_" + secrets.token_urlsafe(24)
        with self.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO tether_api_keys (key_hash, user_id, label, created_at) "
                                 "VALUES (:h, :u, :l, :t)"), {"h": hash_key(key), "u": user, "l": label, "t": time.time()})
        return key

    def user_of(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(sa.text("SELECT user_id FROM tether_api_keys WHERE key_hash = :h"),
                                {"h": hash_key(key)}).scalar()

    def claim_submission(self, user: str, key: str, body: dict[str, Any], task_id: str) -> tuple[str, bool]:
        """(task id, same body) for an Idempotency-Key: the first claim wins, later ones get its task."""
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        with self.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO tether_task_keys (user_id, key, body_hash, task_id, created_at) "
                                 "VALUES (:u, :k, :b, :r, :t) ON CONFLICT DO NOTHING"),
                         {"u": user, "k": key, "b": digest, "r": task_id, "t": time.time()})
            row = conn.execute(sa.text("SELECT task_id, body_hash FROM tether_task_keys WHERE user_id = :u AND key = :k"),
                               {"u": user, "k": key}).one()
        return row[0], row[1] == digest

    def record_decision(self, run_id: str, call_id: str, approved: bool, by: str, reason: str) -> bool:
        """True for the first decision on this call; False when it was already decided."""
        with self.engine.begin() as conn:
            done = conn.execute(sa.text(
                "INSERT INTO tether_decisions (run_id, call_id, approved, by_user, reason, created_at) "
                "VALUES (:r, :c, :a, :b, :why, :t) ON CONFLICT DO NOTHING"),
                {"r": run_id, "c": call_id, "a": int(approved), "b": by, "why": reason, "t": time.time()})
            return bool(done.rowcount)

    def active_tasks(self, user: str, statuses: tuple[str, ...]) -> int:
        """How many of `user`'s runs are in one of `statuses` (one COUNT query, not a fetch of their rows)."""
        marks = ", ".join(f":s{i}" for i in range(len(statuses)))
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM tether_runs WHERE user_id = :u AND status IN "
                                            f"({marks})"), {"u": user, **{f"s{i}": s for i, s in enumerate(statuses)}}
                                    ).scalar() or 0)

    def beat(self, executor_id: str) -> None:
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO tether_workers (executor_id, beat_at, started_at) VALUES (:e, :t, :t) "
                                 "ON CONFLICT (executor_id) DO UPDATE SET beat_at = :t"), {"e": executor_id, "t": now})

    def silent_workers(self, older_than: float, me: str) -> list[str]:
        """Workers whose last heartbeat is older than `older_than` seconds (they are taken off the list)."""
        cutoff = time.time() - older_than
        with self.engine.begin() as conn:
            dead = [r[0] for r in conn.execute(sa.text(
                "SELECT executor_id FROM tether_workers WHERE beat_at < :c AND executor_id != :me"),
                {"c": cutoff, "me": me})]
            for executor_id in dead:
                conn.execute(sa.text("DELETE FROM tether_workers WHERE executor_id = :e AND beat_at < :c"),
                             {"e": executor_id, "c": cutoff})
        return dead

    def forget_decision(self, run_id: str, call_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM tether_decisions WHERE run_id = :r AND call_id = :c"),
                         {"r": run_id, "c": call_id})
