"""A real PostgreSQL server for the tests, from PyPI `pgserver` (its binaries bundled, in the test
extra): one per test session, started on first use, and a fresh database per test.

Fixtures (registered by tests/conftest.py): `postgres_server` (the server), `postgres_url`
(a connection URL of a database of the test's own, dropped after it) and `settings_for` (a
test's server settings on SQLite, then on PostgreSQL).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from a3s_agent.config import Settings

from .conftest import agent_settings


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


@pytest.fixture(params=["sqlite", "postgresql"])
def settings_for(
    request: pytest.FixtureRequest, workspace: Path, tmp_path: Path
) -> Callable[[str], Settings]:
    """Settings of a server (named, so that two are replicas) on the store under test."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else ""

    def settings(name: str = "a") -> Settings:
        return replace(
            agent_settings(workspace, tmp_path / f"data-{name if url else 'a'}"), store=url, replica_id=name
        )

    return settings
