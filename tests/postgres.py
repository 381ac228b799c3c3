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


@pytest.fixture
def postgres_url(postgres_server: Any) -> Iterator[str]:
    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_server.get_uri(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield postgres_server.get_uri(name)
    with psycopg.connect(postgres_server.get_uri(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
