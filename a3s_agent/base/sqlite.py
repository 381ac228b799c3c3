"""SQLite plumbing shared by the stores (sessions, Agent Spaces): one file in WAL mode, its schema
migrated by PRAGMA user_version, commits synced as A3S_DURABILITY says, used off the event loop.

The connection lives on one dedicated thread (serial_thread.py) and each store operation runs there
as a single function: a transaction costs one hop from the event loop and back, where aiosqlite
(which this replaced) makes one per statement, four for a BEGIN/INSERT/UPDATE/COMMIT.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar

from .serial_thread import SerialThread

T = TypeVar("T")
Durability = Literal["full", "normal"]
DURABILITY_LEVELS: tuple[Durability, ...] = ("full", "normal")
_SYNCHRONOUS_NAMES = {0: "off", 1: "normal", 2: "full", 3: "extra"}  # PRAGMA synchronous's numbers


def connect(path: Path, migrations: Sequence[str], durability: Durability = "full") -> sqlite3.Connection:
    """A WAL-mode connection (for use on one thread at a time) with the schema migrated up.

    `durability` "full" (PRAGMA synchronous=FULL) syncs the log at every commit, so a commit that
    returned survives a power loss; "normal" syncs only at checkpoints: commits survive a crash of
    the process, but a power loss may drop the last ones (each commit is then cheaper).
    `migrations[n]` takes a database from version n to n + 1; PRAGMA user_version keeps the count."""
    if durability not in DURABILITY_LEVELS:
        raise ValueError(f"durability must be one of {DURABILITY_LEVELS}, not {durability!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={durability.upper()}")
    db.execute("PRAGMA foreign_keys=ON")
    (version,) = db.execute("PRAGMA user_version").fetchone()
    for number, script in enumerate(migrations[version:], start=version + 1):
        db.executescript(f"BEGIN; {script}; PRAGMA user_version={number}; COMMIT;")
    return db


def synchronous_level(db: sqlite3.Connection) -> str:
    """How the connection syncs commits, by PRAGMA synchronous's name: "full", "normal", ..."""
    (number,) = db.execute("PRAGMA synchronous").fetchone()
    return _SYNCHRONOUS_NAMES.get(number, str(number))


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN ... COMMIT, or ROLLBACK when the body raises."""
    db.execute("BEGIN")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


class Database:
    """One SQLite file (see `connect`) on its own thread, which serialises every operation."""

    def __init__(self, path: Path, migrations: Sequence[str], durability: Durability, name: str) -> None:
        self.path = path
        self._migrations = migrations
        self._durability = durability
        self._name = name  # names the thread, and the store in errors
        self._db: sqlite3.Connection | None = None
        self._thread: SerialThread | None = None

    async def open(self) -> str:
        """Connect (migrating the schema); returns how commits are synced, as `synchronous_level`."""
        self._thread = SerialThread(f"a3s-{self._name}")
        self._db = await self._thread.run(connect, self.path, self._migrations, self._durability)
        return await self.run(synchronous_level)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run fn with the connection on the database's thread."""
        if self._db is None or self._thread is None:
            raise RuntimeError(f"the {self._name} store is not open")
        return await self._thread.run(fn, self._db)

    async def close(self) -> None:
        if self._db is not None:
            await self.run(lambda db: db.close())
            self._db = None
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
