"""The service's own tables (API keys, idempotent submissions, decided approvals, worker heartbeats,
submission counts, console sessions), beside the run store in the same database, with their own migrations."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any

import sqlalchemy as sa

from tether._errors import InvalidInput

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
    [  # 2: submissions per user and minute, shared by every API process on the database
        """CREATE TABLE IF NOT EXISTS tether_submission_counts (
            user_id TEXT NOT NULL, minute BIGINT NOT NULL, n BIGINT NOT NULL, PRIMARY KEY (user_id, minute))""",
    ],
    [  # 3: the service's secrets (the stream tokens' signing key), shared by every API process
        "CREATE TABLE IF NOT EXISTS tether_service_secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ],
    [  # 4: the web console's sessions: only the session id's hash is stored; each is tied to the key it
       # logged in with, so revoking the key ends the session
        """CREATE TABLE IF NOT EXISTS tether_console_sessions (
            session_hash TEXT PRIMARY KEY, key_hash TEXT NOT NULL, csrf TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL)""",
    ],
]


STALE_CLAIM_SECONDS = 60.0
KEY_ID_CHARS = 12  # how much of a key's hash `tether keys list` shows as its id


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


def key_id(key: str, chars: int = KEY_ID_CHARS) -> str:
    """A key's id: the start of its hash (what `tether keys list` shows; a stream token carries more)."""
    return hash_key(key)[:chars]


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

    def keys(self, user: str | None = None) -> list[tuple[str, str, str, float]]:
        """(key id, user, label, created_at) of every key, or of `user`'s; the id is the start of the
        key's hash (the key itself is not stored)."""
        where, args = ("WHERE user_id = :u", {"u": user}) if user is not None else ("", {})
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(f"SELECT key_hash, user_id, label, created_at FROM tether_api_keys {where} "
                                        "ORDER BY created_at"), args).all()
        return [(h[:KEY_ID_CHARS], u, label or "", float(t)) for h, u, label, t in rows]

    def revoke(self, key_or_id: str) -> tuple[str, str]:
        """Delete one key, given itself or its id (as `keys` shows it, or a longer start of its hash);
        (key id, user). ValueError when it names no key or more than one."""
        if key_or_id.startswith("tk_"):
            prefix = hash_key(key_or_id)
        elif len(key_or_id) >= 8 and all(c in "0123456789abcdef" for c in key_or_id):
            prefix = key_or_id
        else:
            raise InvalidInput(f"{key_or_id!r} is neither a key (tk_...) nor a key id (8 or more hex digits; "
                             "`tether keys list` shows them)")
        with self.engine.begin() as conn:
            found = self._keys_from(conn, prefix)
            if len(found) != 1:
                raise InvalidInput(f"no key with id {key_or_id!r}" if not found else
                                 f"{len(found)} keys start with {key_or_id!r}: give more of the id")
            conn.execute(sa.text("DELETE FROM tether_api_keys WHERE key_hash = :h"), {"h": found[0][0]})
        return found[0][0][:KEY_ID_CHARS], found[0][1]

    @staticmethod
    def _keys_from(conn: sa.Connection, prefix: str) -> list[Any]:
        """(key_hash, user_id) of the keys whose hash starts with `prefix` (hex digits only)."""
        return list(conn.execute(sa.text("SELECT key_hash, user_id FROM tether_api_keys WHERE key_hash LIKE :p"),
                                 {"p": prefix + "%"}).all())

    def secret(self, name: str) -> bytes:
        """The service's secret `name`, made on first use (the first process to ask wins)."""
        with self.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO tether_service_secrets (name, value) VALUES (:n, :v) ON CONFLICT DO NOTHING"),
                         {"n": name, "v": secrets.token_hex(32)})
            return bytes.fromhex(conn.execute(sa.text("SELECT value FROM tether_service_secrets WHERE name = :n"),
                                              {"n": name}).scalar_one())

    def key_owner(self, key_id: str) -> str | None:
        """The user of the key whose hash starts with `key_id`; None once it is revoked."""
        with self.engine.connect() as conn:
            found = self._keys_from(conn, key_id)
        return found[0][1] if len(found) == 1 else None

    def open_session(self, key: str, ttl_seconds: float) -> tuple[str, str] | None:
        """A console session for a valid API key: (session id, CSRF token); None for an unknown key.
        The session id is returned once; only its hash is stored."""
        session, csrf, now = secrets.token_urlsafe(32), secrets.token_urlsafe(24), time.time()
        with self.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM tether_console_sessions WHERE expires_at <= :t"), {"t": now})
            if conn.execute(sa.text("SELECT 1 FROM tether_api_keys WHERE key_hash = :h"),
                            {"h": hash_key(key)}).first() is None:
                return None
            conn.execute(sa.text("INSERT INTO tether_console_sessions (session_hash, key_hash, csrf, created_at, "
                                 "expires_at) VALUES (:s, :k, :c, :t, :e)"),
                         {"s": hash_key(session), "k": hash_key(key), "c": csrf, "t": now, "e": now + ttl_seconds})
        return session, csrf

    def session(self, session: str) -> tuple[str, str] | None:
        """(user, CSRF token) of a live session; None once it expired, was closed or its key revoked."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.text(
                "SELECT k.user_id, s.csrf FROM tether_console_sessions s JOIN tether_api_keys k "
                "ON k.key_hash = s.key_hash WHERE s.session_hash = :s AND s.expires_at > :t"),
                {"s": hash_key(session), "t": time.time()}).first()
        return (str(row[0]), str(row[1])) if row is not None else None

    def close_session(self, session: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM tether_console_sessions WHERE session_hash = :s"),
                         {"s": hash_key(session)})

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    def user_of(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(sa.text("SELECT user_id FROM tether_api_keys WHERE key_hash = :h"),
                                {"h": hash_key(key)}).scalar()

    def claim_submission(self, user: str, key: str, body: dict[str, Any], task_id: str) -> tuple[str, bool, bool]:
        """(task id, same body, task exists) for an Idempotency-Key: the first claim wins, later ones
        get its task. A claim whose task was never created (its request died midway) is taken over
        after STALE_CLAIM_SECONDS."""
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        now = time.time()
        params = {"u": user, "k": key, "b": digest, "r": task_id, "t": now}
        with self.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO tether_task_keys (user_id, key, body_hash, task_id, created_at) "
                                 "VALUES (:u, :k, :b, :r, :t) ON CONFLICT DO NOTHING"), params)
            conn.execute(sa.text(
                "UPDATE tether_task_keys SET body_hash = :b, task_id = :r, created_at = :t WHERE user_id = :u AND key = :k"
                " AND created_at < :stale AND task_id NOT IN (SELECT run_id FROM tether_runs)"),
                {**params, "stale": now - STALE_CLAIM_SECONDS})
            row = conn.execute(sa.text(
                "SELECT k.task_id, k.body_hash, r.run_id FROM tether_task_keys k LEFT JOIN tether_runs r "
                "ON r.run_id = k.task_id WHERE k.user_id = :u AND k.key = :k"), params).one()
        return row[0], row[1] == digest, row[2] is not None

    def release_submission(self, user: str, key: str, task_id: str) -> None:
        """Give up this request's claim on an Idempotency-Key (its task was not created)."""
        with self.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM tether_task_keys WHERE user_id = :u AND key = :k AND task_id = :r"),
                         {"u": user, "k": key, "r": task_id})

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

    def _db_now(self) -> str:
        """The database's clock in epoch seconds, as SQL: workers on several machines beat and are
        judged by one clock, so a skewed machine clock cannot make a live worker look dead."""
        if self.engine.dialect.name == "postgresql":
            return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
        return "((julianday('now') - 2440587.5) * 86400.0)"

    def beat(self, executor_id: str) -> None:
        now = self._db_now()
        with self.engine.begin() as conn:
            conn.execute(sa.text(f"INSERT INTO tether_workers (executor_id, beat_at, started_at) VALUES (:e, {now}, "
                                 f"{now}) ON CONFLICT (executor_id) DO UPDATE SET beat_at = {now}"), {"e": executor_id})

    def silent_workers(self, older_than: float, me: str) -> list[str]:
        """Workers whose last heartbeat is older than `older_than` seconds by the database's clock
        (they are taken off the list)."""
        with self.engine.begin() as conn:
            cutoff = conn.execute(sa.text(f"SELECT {self._db_now()} - :o"), {"o": older_than}).scalar()
            dead = [r[0] for r in conn.execute(sa.text(
                "SELECT executor_id FROM tether_workers WHERE beat_at < :c AND executor_id != :me"),
                {"c": cutoff, "me": me})]
            for executor_id in dead:
                conn.execute(sa.text("DELETE FROM tether_workers WHERE executor_id = :e AND beat_at < :c"),
                             {"e": executor_id, "c": cutoff})
        return dead

    def take_submission(self, user: str, per_minute: int, now: float | None = None) -> float | None:
        """Count one submission of `user` against `per_minute`, across every API process on this
        database; None when it may go ahead, else the seconds to wait (a refused one is not counted).

        A sliding minute, estimated from two fixed ones: the last minute's count weighted by how much
        of it the sliding window still covers, plus this minute's (no burst of 2x at a boundary)."""
        now = time.time() if now is None else now
        minute, into = int(now // 60), (now % 60) / 60
        key = {"u": user, "m": minute}
        with self.engine.begin() as conn:  # the UPDATE holds the row: concurrent takers queue up
            new = conn.execute(sa.text("INSERT INTO tether_submission_counts (user_id, minute, n) VALUES (:u, :m, 0) "
                                       "ON CONFLICT DO NOTHING"), key).rowcount
            if new:
                conn.execute(sa.text("DELETE FROM tether_submission_counts WHERE user_id = :u AND minute < :m - 1"), key)
            conn.execute(sa.text("UPDATE tether_submission_counts SET n = n + 1 WHERE user_id = :u AND minute = :m"), key)
            counts = dict(conn.execute(sa.text("SELECT minute, n FROM tether_submission_counts WHERE user_id = :u "
                                               "AND minute >= :m - 1"), key).all())
            current, previous = int(counts.get(minute, 0)), int(counts.get(minute - 1, 0))
            if previous * (1 - into) + current <= per_minute:
                return None
            conn.execute(sa.text("UPDATE tether_submission_counts SET n = n - 1 WHERE user_id = :u AND minute = :m"), key)
        if current > per_minute or previous == 0:
            return 60 * (1 - into)  # this minute alone is over: wait for the next
        # `current` counts this one: the previous minute's share must fall to (limit - current)
        return max(0.0, 60 * (1 - (per_minute - current) / previous - into))

    def forget_decision(self, run_id: str, call_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM tether_decisions WHERE run_id = :r AND call_id = :c"),
                         {"r": run_id, "c": call_id})
