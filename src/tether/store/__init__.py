"""The run store: runs, step events, capped tool outputs, audit and idempotency records, in one
SQLite (default) or PostgreSQL database, with schema migrations. Durable runs write as they go;
an in-memory CLI run is written once, when it ended (no database on its per-step path)."""

from tether.store._sql import RunRow, RunStore, default_database_path, engine_url

__all__ = ["RunRow", "RunStore", "default_database_path", "engine_url"]
