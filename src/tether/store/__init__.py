"""The run store: runs, step events, capped tool outputs, audit and idempotency records, in one
SQLite (default) or PostgreSQL database, with schema migrations. Used by durable runs only: the
in-memory path keeps no database on its hot path."""

from tether.store._sql import RunRow, RunStore, default_database_path, engine_url

__all__ = ["RunRow", "RunStore", "default_database_path", "engine_url"]
