"""SQLite plumbing shared by the stores (sessions, Agent Spaces): one file in WAL mode, its schema
migrated by PRAGMA user_version, commits synced as A3S_DURABILITY says, used off the event loop.

The connection lives on one dedicated thread (serial_thread.py) and each store operation runs there
as a single function: a transaction costs one hop from the event loop and back, where aiosqlite
(which this replaced) makes one per statement, four for a BEGIN/INSERT/UPDATE/COMMIT.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar

from .errors import Unavailable
from .serial_thread import SerialThread

T = TypeVar("T")
Durability = Literal["full", "normal"]
DURABILITY_LEVELS: tuple[Durability, ...] = ("full", "normal")
_SYNCHRONOUS_NAMES = {0: "off", 1: "normal", 2: "full", 3: "extra"}  # PRAGMA synchronous's numbers
BUSY_TIMEOUT_S = 5.0
"""How long a write waits for another process on the same file (a server beside this one) to
release its write lock before it fails UNAVAILABLE."""


def connect(path: Path, migrations: Sequence[str], durability: Durability = "full") -> sqlite3.Connection:
    """A WAL-mode connection (for use on one thread at a time) with the schema migrated up.

    `durability` "full" (PRAGMA synchronous=FULL) syncs the log at every commit, so a commit that
    returned survives a power loss; "normal" syncs only at checkpoints: commits survive a crash of
    the process, but a power loss may drop the last ones (each commit is then cheaper).
    `migrations[n]` takes a database from version n to n + 1; PRAGMA user_version keeps the count."""
    if durability not in DURABILITY_LEVELS:
        raise ValueError(f"durability must be one of {DURABILITY_LEVELS}, not {durability!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    _use_wal(db)
    db.execute(f"PRAGMA synchronous={durability.upper()}")
    db.execute("PRAGMA foreign_keys=ON")
    _migrate(db, migrations)
    return db


def _use_wal(db: sqlite3.Connection) -> None:
    """Put the file in WAL mode (it stays so). A new file's switch fails at once, without waiting,
    while another process has it open too (servers starting together): it is tried again, for as
    long as a write would wait."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _migrate(db: sqlite3.Connection, migrations: Sequence[str]) -> None:
    """Apply the migrations the file lacks, one transaction each. A server starting beside another
    on the same file may find a step it was about to take done meanwhile: it goes on from there."""
    while (version := _user_version(db)) < len(migrations):
        try:
            db.executescript(
                f"BEGIN IMMEDIATE; {migrations[version]}; PRAGMA user_version={version + 1}; COMMIT;"
            )
        except sqlite3.OperationalError:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if _user_version(db) == version:
                raise


def _user_version(db: sqlite3.Connection) -> int:
    (version,) = db.execute("PRAGMA user_version").fetchone()
    return int(version)


def synchronous_level(db: sqlite3.Connection) -> str:
    """How the connection syncs commits, by PRAGMA synchronous's name: "full", "normal", ..."""
    (number,) = db.execute("PRAGMA synchronous").fetchone()
    return _SYNCHRONOUS_NAMES.get(number, str(number))


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK when the body raises.

    IMMEDIATE takes the write lock at the start, waiting (the connection's timeout) while another
    process holds it. A deferred BEGIN would read first and, if another server on the same file
    committed meanwhile, fail "database is locked" at its first write without waiting at all."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


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
        try:
            return await self._thread.run(fn, self._db)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            raise Unavailable(
                f"the {self._name} store's SQLite file stayed locked by another process for"
                f" {BUSY_TIMEOUT_S:g} s: try again"
            ) from exc

    async def close(self) -> None:
        if self._db is not None:
            await self.run(lambda db: db.close())
            self._db = None
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
