"""A real PostgreSQL server for the tests, from PyPI `pgserver` (its binaries bundled, in the test
extra): one per test session, started on first use, and a fresh database per test.

Fixtures (registered by tests/conftest.py): `postgres_server` (the server) and `postgres_url`
(a connection URL of a database of the test's own, dropped after it).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    pgserver = pytest.importorskip(
        "pgserver", reason="pgserver (the test extra: pip install -e '.[test]') runs the PostgreSQL tests"
    )
    # Not under pytest's basetemp: as root, pgserver runs the server as its own user, and every
    # pytest session that starts makes pytest-of-<user> private again, which would lock it out.
    parent = Path(tempfile.mkdtemp(prefix="a3s-postgres-"))
    try:
        server = pgserver.get_server(parent / "data", cleanup_mode="delete")
        yield server
        server.cleanup()
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@contextmanager
def fresh_database(server: Any, prefix: str = "t") -> Iterator[str]:
    """The URL of a new database on `server`, dropped (its connections closed) afterwards."""
    name = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(server.get_uri(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield server.get_uri(name)
    finally:
        with psycopg.connect(server.get_uri(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture
def postgres_url(postgres_server: Any) -> Iterator[str]:
    with fresh_database(postgres_server) as url:
        yield url
