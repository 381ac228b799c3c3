"""Bounds on every wait for PostgreSQL: a stuck database, or another replica's transaction stuck
holding a lock, fails the call with UNAVAILABLE instead of hanging it (and the pooled connection
it holds, until the pool runs dry).

- connecting: libpq's connect_timeout (CONNECT_TIMEOUT_S, postgres_schema.py);
- a statement: `statement_timeout`;
- a transaction left idle while it holds its locks (a replica frozen mid-transaction):
  `idle_in_transaction_session_timeout`, after which the database ends that connection;
- a free pooled connection: the pool's own timeout.

The two settings are the server's defaults unless the operator set them (in the URL's `options`,
or as the role's or the database's defaults), which win; the log's retention, which no call waits
for, runs under RETENTION_TIMEOUT_MS.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from psycopg import AsyncConnection, OperationalError
from psycopg.errors import QueryCanceled
from psycopg_pool import AsyncConnectionPool

from ...base.errors import Unavailable

C = TypeVar("C", bound=AsyncConnection[Any])
log = logging.getLogger(__name__)

STATEMENT_TIMEOUT_MS = 30_000
IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
RETENTION_TIMEOUT_MS = 600_000
"""The event log's retention (a DELETE over the whole log, in the background) has this bound instead."""


async def bound_waits(conn: AsyncConnection[Any]) -> None:
    """A pool's `configure`: the timeouts above on a new connection whose settings have none."""
    await conn.execute(
        "SELECT set_config(name, value, false) FROM (VALUES ('statement_timeout', %s),"
        " ('idle_in_transaction_session_timeout', %s)) AS bound (name, value)"
        " WHERE current_setting(name) = '0'",
        (f"{STATEMENT_TIMEOUT_MS}ms", f"{IDLE_IN_TRANSACTION_TIMEOUT_MS}ms"),
    )
    if not conn.autocommit:
        await conn.commit()  # a pool takes back only connections outside a transaction


@asynccontextmanager
async def pooled(pool: AsyncConnectionPool[C], store: str) -> AsyncIterator[C]:
    """A connection of `pool` (see psycopg_pool for its transaction); what fails on the database,
    in the block too, raises Unavailable: worth trying again, `store` first."""
    try:
        async with pool.connection() as conn:
            yield conn
    except QueryCanceled as exc:
        raise Unavailable(f"{store} did not answer in time (statement_timeout): {exc}") from exc
    except OperationalError as exc:
        # The driver's words may name the database's host and user: they go to the log, not the caller.
        log.warning("%s failed: %s", store, exc)
        raise Unavailable(f"{store} failed ({type(exc).__name__}; the server's log has the reason)") from exc
