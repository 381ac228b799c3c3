"""Provider entries on PostgreSQL (core/store/providers.py), in the session store's database: its
tables are a migration of postgres_schema.py, its statements run on that store's pooled connections."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from psycopg import AsyncConnection
from psycopg.errors import UniqueViolation

from ...base.errors import AlreadyExists
from ...base.providers import DefaultModel
from .providers import COLUMNS, ProviderRecord, record_of

SCHEMA = """
    CREATE TABLE providers (
        name TEXT PRIMARY KEY,
        base_url TEXT NOT NULL,
        models TEXT NOT NULL,
        api_key TEXT NOT NULL,
        key_url TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        seq BIGSERIAL NOT NULL  -- the order entries were added in, for entries added at one time
    );
    REVOKE ALL ON providers FROM PUBLIC;
    CREATE TABLE default_model (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        provider TEXT NOT NULL REFERENCES providers(name) ON DELETE CASCADE,
        model TEXT NOT NULL,
        updated_at BIGINT NOT NULL
    );
"""

Connect = Callable[[], AbstractAsyncContextManager[AsyncConnection[Any]]]


class PostgresProviders:
    def __init__(self, connection: Connect) -> None:
        self._connection = connection

    async def providers(self) -> tuple[list[ProviderRecord], DefaultModel | None]:
        async with self._connection() as conn:
            rows = await (await conn.execute(f"SELECT {COLUMNS} FROM providers ORDER BY seq")).fetchall()
            default = await (
                await conn.execute("SELECT provider, model FROM default_model WHERE id = 1")
            ).fetchone()
        return [record_of(row) for row in rows], None if default is None else DefaultModel(*default)

    async def add_provider(self, record: ProviderRecord) -> None:
        try:
            async with self._connection() as conn:
                await conn.execute(
                    f"INSERT INTO providers ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)", record.row()
                )
        except UniqueViolation:
            raise AlreadyExists(f"a provider named {record.name!r} exists already") from None

    async def save_provider(self, record: ProviderRecord) -> bool:
        name, base_url, models, api_key, key_url, _, updated_at = record.row()
        async with self._connection() as conn:
            done = await conn.execute(
                "UPDATE providers SET base_url = %s, models = %s, api_key = %s, key_url = %s, updated_at = %s"
                " WHERE name = %s",
                (base_url, models, api_key, key_url, updated_at, name),
            )
        return done.rowcount == 1

    async def remove_provider(self, name: str) -> bool:
        async with self._connection() as conn:  # the default naming it goes with it (ON DELETE CASCADE)
            done = await conn.execute("DELETE FROM providers WHERE name = %s", (name,))
        return done.rowcount == 1

    async def set_default_model(self, default: DefaultModel, now: int) -> bool:
        async with self._connection() as conn, conn.transaction():
            found = await (
                await conn.execute("SELECT 1 FROM providers WHERE name = %s FOR SHARE", (default.provider,))
            ).fetchone()
            if found is None:
                return False
            await conn.execute(
                "INSERT INTO default_model (id, provider, model, updated_at) VALUES (1, %s, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET provider = excluded.provider, model = excluded.model,"
                " updated_at = excluded.updated_at",
                (default.provider, default.model, now),
            )
        return True
