"""A fresh PostgreSQL database per test, from the server `.ci/run` starts ($TETHER_TEST_POSTGRES).

Without the variable the Postgres tests are skipped, except under CI=true, where they fail: CI
must prove the Postgres path, not silently leave it out."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest


def fresh_postgres_database(env: str = "TETHER_TEST_POSTGRES") -> Iterator[str]:
    """A new database on the server `$env` names (TETHER_TEST_PGVECTOR: the one with pgvector), dropped after."""
    url = os.environ.get(env)
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{env} is not set: .ci/run must start PostgreSQL for these tests")
        pytest.skip(f"{env} (a postgresql:// URL) is not set")
    import psycopg

    name = f"tether_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
