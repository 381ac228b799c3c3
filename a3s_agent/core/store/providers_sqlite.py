"""Provider entries on SQLite (core/store/providers.py), in the session store's file: its tables are
a migration of sqlite_store.py, its statements run on that store's connection."""

from __future__ import annotations

import sqlite3

from ...base.errors import AlreadyExists
from ...base.providers import DefaultModel
from ...base.sqlite import Database, transaction
from .providers import COLUMNS, ProviderRecord, record_of

SCHEMA = """
    CREATE TABLE providers (
        name TEXT PRIMARY KEY,
        base_url TEXT NOT NULL,
        models TEXT NOT NULL,
        api_key TEXT NOT NULL,
        key_url TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE TABLE default_model (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        provider TEXT NOT NULL REFERENCES providers(name) ON DELETE CASCADE,
        model TEXT NOT NULL,
        updated_at INTEGER NOT NULL
    )
"""


class SqliteProviders:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def providers(self) -> tuple[list[ProviderRecord], DefaultModel | None]:
        def read(db: sqlite3.Connection) -> tuple[list[ProviderRecord], DefaultModel | None]:
            rows = db.execute(f"SELECT {COLUMNS} FROM providers ORDER BY created_at, rowid").fetchall()
            default = db.execute("SELECT provider, model FROM default_model WHERE id = 1").fetchone()
            return [record_of(row) for row in rows], None if default is None else DefaultModel(*default)

        return await self._db.run(read)

    async def add_provider(self, record: ProviderRecord) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.execute(f"INSERT INTO providers ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", record.row())

        try:
            await self._db.run(write)
        except sqlite3.IntegrityError:
            raise AlreadyExists(f"a provider named {record.name!r} exists already") from None

    async def save_provider(self, record: ProviderRecord) -> bool:
        name, base_url, models, api_key, key_url, _, updated_at = record.row()

        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                return bool(
                    db.execute(
                        "UPDATE providers SET base_url = ?, models = ?, api_key = ?, key_url = ?, updated_at = ?"
                        " WHERE name = ?",
                        (base_url, models, api_key, key_url, updated_at, name),
                    ).rowcount
                )

        return await self._db.run(write)

    async def remove_provider(self, name: str) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):  # the default naming it goes with it (ON DELETE CASCADE)
                return bool(db.execute("DELETE FROM providers WHERE name = ?", (name,)).rowcount)

        return await self._db.run(write)

    async def set_default_model(self, default: DefaultModel, now: int) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                if (
                    db.execute("SELECT 1 FROM providers WHERE name = ?", (default.provider,)).fetchone()
                    is None
                ):
                    return False
                db.execute(
                    "INSERT INTO default_model (id, provider, model, updated_at) VALUES (1, ?, ?, ?)"
                    " ON CONFLICT (id) DO UPDATE SET provider = excluded.provider, model = excluded.model,"
                    " updated_at = excluded.updated_at",
                    (default.provider, default.model, now),
                )
                return True

        return await self._db.run(write)
