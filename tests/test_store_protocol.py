"""The store protocol (a3s_agent/core/store/protocol.py), one suite run against both stores: SQLite on a file
of the test's own, PostgreSQL on a database of the test's own on a real server (tests/postgres.py).
The tests at the end are PostgreSQL's alone: two replicas on one database."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from a3s_agent.base import sqlite as sqlite_base
from a3s_agent.base.errors import AlreadyExists, Unavailable
from a3s_agent.base.models import LLMConfig, Message, SessionConfig, SessionState, ToolCall, Usage
from a3s_agent.core.store import postgres_bounds, postgres_channel
from a3s_agent.core.store.a2a_tasks import A2aTaskRecord
from a3s_agent.core.store.channel_seal import ChannelSeal
from a3s_agent.core.store.events import EventBus, Filter
from a3s_agent.core.store.postgres_channel import (
    CONTROL_CHANNEL,
    HORIZON_EVERY_S,
    LISTENER_NAME,
    LOG_CHANNEL,
    NOTIFY_LIMIT,
    TEXT_LIMIT,
    control_payload,
    control_text,
    log_payloads,
)
from a3s_agent.core.store.postgres_schema import MIGRATIONS
from a3s_agent.core.store.postgres_store import CONTROL_KEPT_MS, PostgresStore
from a3s_agent.core.store.protocol import LeaseLost, LogEntry, StaleHeader, Store
from a3s_agent.core.store.session import Session, SessionSettings
from a3s_agent.core.store.sqlite_store import SqliteStore

from .conftest import WITHIN_S, eventually

LONG_TTL_MS = 60_000


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    opened: Store
    if request.param == "sqlite":
        opened = SqliteStore(tmp_path / "sessions.db")
    else:
        opened = PostgresStore(request.getfixturevalue("postgres_url"), "replica-a")
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture
async def replicas(postgres_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two replicas on one database."""
    a, b = PostgresStore(postgres_url, "replica-a"), PostgresStore(postgres_url, "replica-b")
    await asyncio.gather(a.open(), b.open())  # both migrate at once: one waits for the other
    yield a, b
    await asyncio.gather(a.close(), b.close())


def session(session_id: str, created_at: int = 1_000) -> Session:
    return Session(
        id=session_id,
        config=SessionConfig(
            name=f"name of {session_id}",
            workspace="/w",
            llm=LLMConfig(provider="openai", model="m", api_key="sk-secret"),
        ),
        created_at=created_at,
        updated_at=created_at,
        settings=SessionSettings(token_budget=5_000, skill_rules=["Bash(git *)"]),
    )


def entry(session_id: str, n: int = 0, timestamp: int = 1_000, fence: int | None = None) -> LogEntry:
    return LogEntry(session_id, "event", {"n": n, "text": f"entry {n}"}, timestamp, fence=fence)


async def seqs(store: Store, session_id: str) -> list[int]:
    return [e.seq for e in await store.read_log(session_id, 0, 1_000)]


# --- sessions and messages -----------------------------------------------------------------


async def test_sessions_are_created_listed_updated_and_deleted(store: Store) -> None:
    await store.create_session(session("b", created_at=2_000), [Message("system", "be brief")])
    await store.create_session(session("a", created_at=3_000), [])
    assert [s.id for s in await store.list_sessions()] == ["b", "a"]  # oldest first

    loaded = await store.load_session("b")
    assert loaded is not None
    assert loaded.config.name == "name of b" and loaded.config.llm is not None
    assert loaded.config.llm.api_key == ""  # the secret is never stored
    assert loaded.settings.token_budget == 5_000 and loaded.settings.skill_rules == ["Bash(git *)"]
    assert loaded.message_count == 1 and loaded.state == SessionState.ACTIVE
    assert await store.session_stamp("b") == 2_000
    assert await store.load_session("nope") is None and await store.session_stamp("nope") is None

    loaded.state, loaded.updated_at, loaded.config.name = SessionState.PAUSED, 2_500, "renamed"
    await store.update_session(loaded)
    again = await store.load_session("b")
    assert again is not None
    assert (again.state, again.updated_at, again.config.name) == (SessionState.PAUSED, 2_500, "renamed")
    assert await store.session_stamp("b") == 2_500

    assert await store.delete_session("b") is True
    assert await store.delete_session("b") is False
    assert [s.id for s in await store.list_sessions()] == ["a"]
    assert await store.load_messages("b") == []


async def test_a_header_written_from_a_header_the_store_no_longer_holds_is_refused(store: Store) -> None:
    """`since` names the header a change was made from: when another writer changed it meanwhile
    (or removed the session), StaleHeader, and neither the header nor its log entries are written."""
    await store.create_session(session("s", created_at=1_000), [])
    mine = await store.load_session("s")
    theirs = await store.load_session("s")
    assert mine is not None and theirs is not None
    theirs.updated_at, theirs.config.name = 1_100, "theirs"
    await store.update_session(theirs, since=1_000)
    mine.updated_at, mine.config.name = 1_200, "mine"
    with pytest.raises(StaleHeader):
        await store.update_session(mine, [entry("s", 1)], since=1_000)
    kept = await store.load_session("s")
    assert kept is not None and (kept.config.name, kept.updated_at) == ("theirs", 1_100)
    assert await seqs(store, "s") == []
    await store.update_session(mine, [entry("s", 1)], since=1_100)  # made again from theirs
    assert await store.session_stamp("s") == 1_200 and await seqs(store, "s") == [1]
    await store.delete_session("s")
    with pytest.raises(StaleHeader):
        await store.update_session(mine, since=1_200)


async def test_a_taken_id_is_refused_and_nothing_is_written(store: Store) -> None:
    await store.create_session(session("s"), [Message("user", "first")])
    late = entry("s")
    with pytest.raises(AlreadyExists, match="session 's' already exists"):
        await store.create_session(session("s", created_at=9_000), [Message("user", "second")], log=[late])
    assert [m.content for m in await store.load_messages("s")] == ["first"]
    assert late.seq == 0 and await store.log_bounds("s") == (0, 0)


async def test_messages_are_appended_archived_and_replaced(store: Store) -> None:
    hostile = "NUL \x00 inside, quotes ' \" and ; DROP TABLE messages; -- and ünïcödé ✓"
    call = ToolCall("call-1", "bash", '{"command": "ls"}')
    await store.create_session(session("s"), [Message("system", "sys")])
    await store.append_messages(
        "s",
        [
            Message("user", hostile),
            Message("assistant", "", tool_calls=[call]),
            Message("tool", "out", tool_call_id="call-1"),
        ],
        updated_at=1_500,
    )
    live = await store.load_messages("s")
    assert [m.content for m in live] == ["sys", hostile, "", "out"]
    assert live[2].tool_calls == [call] and live[3].tool_call_id == "call-1"
    assert await store.session_stamp("s") == 1_500

    await store.replace_history("s", [Message("user", "summary")], updated_at=1_600)
    assert [m.content for m in await store.load_messages("s")] == ["summary"]
    assert [m.content for m in await store.load_archived("s")] == ["sys", hostile, "", "out"]
    header = await store.load_session("s")
    assert header is not None and header.message_count == 1
    assert await store.session_stamp("s") == 1_600


async def test_usage_is_kept_in_every_field(store: Store) -> None:
    await store.create_session(session("s"), [])
    usage = Usage(
        prompt_tokens=100,
        completion_tokens=20,
        cache_read_tokens=30,
        cache_write_tokens=4,
        reasoning_tokens=5,
    )
    await store.append_messages("s", [Message("assistant", "hi")], updated_at=1_100, usage=usage)
    loaded = await store.load_session("s")
    assert loaded is not None and loaded.usage == usage

    loaded.usage = usage + Usage(prompt_tokens=2**40)  # past 32 bits
    await store.update_session(loaded)
    listed = await store.list_sessions()
    assert listed[0].usage.prompt_tokens == 100 + 2**40 and listed[0].usage.reasoning_tokens == 5


async def test_the_initialization_is_replaced_and_restored(store: Store) -> None:
    assert await store.load_initialization() is None
    await store.save_initialization({"agent": {"model": "m1"}})
    await store.save_initialization({"agent": {"model": "m2"}, "skills": ["a"]})
    assert await store.load_initialization() == {"agent": {"model": "m2"}, "skills": ["a"]}


# --- the event log -------------------------------------------------------------------------


async def test_log_entries_are_numbered_per_session_without_gaps(store: Store) -> None:
    created = entry("a", 0)
    await store.create_session(session("a"), [], log=[created])
    await store.create_session(session("b"), [])
    assert created.seq == 1 and created.id > 0

    batch = [entry("a", 1), entry("b", 1), entry("a", 2), entry("b", 2), entry("a", 3)]
    await store.append_log(batch)
    assert [(e.session_id, e.seq) for e in batch] == [("a", 2), ("b", 1), ("a", 3), ("b", 2), ("a", 4)]
    for session_id in ("a", "b"):
        ids = [e.id for e in batch if e.session_id == session_id]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert len({created.id, *(e.id for e in batch)}) == 6

    updated = entry("a", 4)
    header = await store.load_session("a")
    assert header is not None
    await store.update_session(header, log=[updated])
    appended = entry("a", 5)
    await store.append_messages("a", [Message("user", "hi")], updated_at=1_200, log=[appended])
    replaced = entry("a", 6)
    await store.replace_history("a", [Message("user", "short")], updated_at=1_300, log=[replaced])
    assert (updated.seq, appended.seq, replaced.seq) == (5, 6, 7)

    read = await store.read_log("a", 0, 100)
    assert [e.seq for e in read] == [1, 2, 3, 4, 5, 6, 7]
    assert [e.body["n"] for e in read] == [0, 1, 2, 3, 4, 5, 6]
    assert read[0] == LogEntry("a", "event", {"n": 0, "text": "entry 0"}, 1_000, seq=1, id=created.id)
    assert await seqs(store, "b") == [1, 2]


async def test_the_log_is_read_in_pages(store: Store) -> None:
    await store.create_session(session("a"), [])
    await store.create_session(session("b"), [])
    await store.append_log([entry(session_id, n) for n in range(10) for session_id in ("a", "b")])

    pages, after = [], 0
    while page := await store.read_log("a", after, 4):
        pages.append([e.seq for e in page])
        after = page[-1].seq
    assert pages == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]

    everything = await store.read_log_since(0, 1_000)
    assert len(everything) == 20 and [e.id for e in everything] == sorted(e.id for e in everything)
    middle = everything[7].id
    since = await store.read_log_since(middle, 5)
    assert [e.id for e in since] == [e.id for e in everything[8:13]]
    assert {e.session_id for e in since} == {"a", "b"}


async def test_log_bounds_and_pruning_by_age_and_count(store: Store) -> None:
    assert await store.log_bounds("a") == (0, 0)
    await store.create_session(session("a"), [])
    await store.create_session(session("b"), [])
    assert await store.log_bounds("a") == (0, 0)
    await store.append_log([entry("a", n, timestamp=1_000 + n) for n in range(10)])
    await store.append_log([entry("b", n, timestamp=5_000 + n) for n in range(3)])
    assert await store.log_bounds("a") == (1, 10)

    assert await store.prune_log(older_than=1_004, keep=100) == 4  # a's seqs 1-4 are older
    assert await store.log_bounds("a") == (5, 10)
    assert await store.prune_log(older_than=0, keep=2) == 4 + 1  # a keeps 9, 10; b keeps 2, 3
    assert await seqs(store, "a") == [9, 10] and await seqs(store, "b") == [2, 3]
    assert await store.prune_log(older_than=0, keep=2) == 0

    assert await store.prune_log(older_than=10_000, keep=100) == 4  # everything is older
    assert await store.log_bounds("a") == (0, 10)  # nothing retained, the numbering is kept
    later = entry("a", 11)
    await store.append_log([later])
    assert later.seq == 11 and await store.log_bounds("a") == (11, 11)


async def test_a_recreated_session_id_continues_the_numbering(store: Store) -> None:
    await store.create_session(session("s"), [], log=[entry("s", 0)])
    await store.append_log([entry("s", 1), entry("s", 2)])
    destroyed = entry("s", 3)
    assert await store.delete_session("s", log=[destroyed])
    assert destroyed.seq == 4
    orphan = entry("s", 4)  # an entry of the destroyed session, appended after it went
    await store.append_log([orphan])
    assert orphan.seq == 5

    recreated = entry("s", 5)
    await store.create_session(session("s"), [], log=[recreated])
    assert recreated.seq == 6
    assert await seqs(store, "s") == [1, 2, 3, 4, 5, 6]
    assert await store.log_bounds("s") == (1, 6)


# --- leases --------------------------------------------------------------------------------


async def test_a_subscriber_that_falls_behind_before_its_first_read_gets_no_earlier_entry(
    store: Store,
) -> None:
    """Subscribed without a cursor, its queue overflows before it reads: it reads the log from the
    first entry it missed, not the session's entries from before it subscribed."""
    bus = EventBus(store)
    await store.create_session(session("s"), [], log=[entry("s", n) for n in range(3)])
    subscription = await bus.subscribe(Filter(session_id="s"), size=2)
    for n in range(3, 8):
        bus.submit(entry("s", n))
    await bus.flush()
    reader = aiter(subscription)
    got = [await asyncio.wait_for(anext(reader), WITHIN_S) for _ in range(5)]
    assert [e.body["n"] for e in got] == [3, 4, 5, 6, 7]
    subscription.close()


async def test_a_lease_is_exclusive_until_it_expires_then_taken_over_with_a_larger_token(
    store: Store,
) -> None:
    await store.create_session(session("s"), [])
    held = await store.acquire_lease("s", "replica-a", "run-1", LONG_TTL_MS)
    assert held is not None and (held.session_id, held.owner, held.run_id) == ("s", "replica-a", "run-1")
    assert await store.acquire_lease("s", "replica-b", "run-2", LONG_TTL_MS) is None
    assert await store.lease_of("s") == held
    assert await store.expired_leases() == []

    renewed = await store.renew_lease(held, LONG_TTL_MS * 2)
    assert renewed is not None and renewed.token == held.token and renewed.expires_at > held.expires_at

    short = await store.acquire_lease("other", "replica-a", "run-3", 1)
    assert short is not None and short.token > held.token  # tokens grow across sessions
    await eventually(lambda: _contains(store.expired_leases(), short), "the 1 ms lease to expire")
    taken = await store.acquire_lease("other", "replica-b", "run-4", LONG_TTL_MS)
    assert taken is not None and taken.owner == "replica-b" and taken.token > short.token
    assert await store.renew_lease(short, LONG_TTL_MS) is None  # lost
    await store.release_lease(short)  # a lost lease's release leaves the new owner's alone
    assert await store.lease_of("other") == taken

    await store.release_lease(taken)
    assert await store.lease_of("other") is None
    assert await store.renew_lease(taken, LONG_TTL_MS) is None
    again = await store.acquire_lease("other", "replica-a", "run-5", LONG_TTL_MS)
    assert again is not None and again.token > taken.token


async def test_leases_left_by_an_ended_owner_expire_at_once_and_are_taken_over(store: Store) -> None:
    for session_id in ("a1", "a2", "b1"):
        await store.create_session(session(session_id), [])
    a1, a2 = [await store.acquire_lease(s, "replica-a", "run", LONG_TTL_MS) for s in ("a1", "a2")]
    b1 = await store.acquire_lease("b1", "replica-b", "run", LONG_TTL_MS)
    assert a1 is not None and a2 is not None and b1 is not None

    assert await store.expire_leases("replica-a") == 2
    assert sorted(lease.session_id for lease in await store.expired_leases()) == ["a1", "a2"]
    taken = await store.acquire_lease("a1", "replica-c", "run", LONG_TTL_MS)
    assert taken is not None and taken.token > b1.token
    assert await store.renew_lease(a1, LONG_TTL_MS) is None  # its old owner lost it
    assert await store.acquire_lease("b1", "replica-c", "run", LONG_TTL_MS) is None  # b's still holds

    assert await store.expire_leases(None) == 3  # every lease: a2's again, b1's and the new one
    assert await store.acquire_lease("b1", "replica-c", "run", LONG_TTL_MS) is not None


async def _contains(leases: Any, lease: Any) -> bool:
    return any(item.token == lease.token for item in await leases)


async def test_a_write_fenced_by_a_lost_lease_is_refused_and_writes_nothing(store: Store) -> None:
    await store.create_session(session("s"), [Message("user", "kept")])
    lost = await store.acquire_lease("s", "replica-a", "run-1", 1)
    assert lost is not None
    await eventually(lambda: _contains(store.expired_leases(), lost), "the lease to expire")
    current = await store.acquire_lease("s", "replica-b", "run-2", LONG_TTL_MS)
    assert current is not None

    header = await store.load_session("s")
    assert header is not None
    header.state, header.updated_at = SessionState.ERROR, 9_000
    refused = [entry("s", n, fence=lost.token) for n in range(3)]
    with pytest.raises(LeaseLost):
        await store.update_session(header, log=refused[:1], fence=lost.token)
    with pytest.raises(LeaseLost):
        await store.append_messages(
            "s",
            [Message("assistant", "stale")],
            9_000,
            Usage(prompt_tokens=1),
            log=refused[1:2],
            fence=lost.token,
        )
    with pytest.raises(LeaseLost):
        await store.replace_history("s", [], 9_000, log=refused[2:], fence=lost.token)
    assert [e.seq for e in refused] == [0, 0, 0]
    assert await store.log_bounds("s") == (0, 0)
    unchanged = await store.load_session("s")
    assert unchanged is not None
    assert (unchanged.state, unchanged.updated_at, unchanged.usage) == (SessionState.ACTIVE, 1_000, Usage())
    assert [m.content for m in await store.load_messages("s")] == ["kept"]

    accepted = entry("s", 9, fence=current.token)
    await store.append_messages(
        "s", [Message("assistant", "fresh")], 9_100, log=[accepted], fence=current.token
    )
    assert accepted.seq == 1
    assert [m.content for m in await store.load_messages("s")] == ["kept", "fresh"]

    await store.release_lease(current)
    with pytest.raises(LeaseLost):  # no lease at all
        await store.append_messages("s", [Message("assistant", "late")], 9_200, fence=current.token)


async def test_a_stale_fence_in_append_log_skips_only_that_session(store: Store) -> None:
    for session_id in ("a", "b", "c"):
        await store.create_session(session(session_id), [])
    stale = await store.acquire_lease("a", "replica-a", "run-1", 1)
    good = await store.acquire_lease("b", "replica-a", "run-2", LONG_TTL_MS)
    assert stale is not None and good is not None
    await eventually(lambda: _contains(store.expired_leases(), stale), "the lease to expire")
    assert await store.acquire_lease("a", "replica-b", "run-3", LONG_TTL_MS) is not None

    batch = [
        entry("a", 1, fence=stale.token),
        entry("b", 1, fence=good.token),
        entry("c", 1),
        entry("b", 2, fence=good.token),
    ]
    await store.append_log(batch)
    assert [e.seq for e in batch] == [0, 1, 1, 2]
    assert batch[0].id == 0
    assert await seqs(store, "a") == [] and await seqs(store, "b") == [1, 2] and await seqs(store, "c") == [1]


async def test_a_release_appends_the_runs_last_entries_in_its_transaction(store: Store) -> None:
    """A run ends in one write: its last events (the generation's end, the DONE chunk) and the
    release. A lost lease's release writes neither its entries nor touches the new owner's lease."""
    await store.create_session(session("s"), [])
    lost = await store.acquire_lease("s", "replica-a", "run-1", 1)
    assert lost is not None
    await eventually(lambda: _contains(store.expired_leases(), lost), "the lease to expire")
    current = await store.acquire_lease("s", "replica-b", "run-2", LONG_TTL_MS)
    assert current is not None

    late = [entry("s", 1, fence=lost.token)]
    await store.release_lease(lost, late)
    assert late[0].seq == 0 and await seqs(store, "s") == []
    assert await store.lease_of("s") == current

    last = [entry("s", 2, fence=current.token), entry("s", 3, fence=current.token)]
    await store.release_lease(current, last)
    assert [e.seq for e in last] == [1, 2] and all(e.id for e in last)
    assert await seqs(store, "s") == [1, 2]
    assert await store.lease_of("s") is None


# --- the channel ---------------------------------------------------------------------------


async def test_a_control_message_reaches_the_senders_own_listener(store: Store) -> None:
    controls: list[dict[str, Any]] = []
    await store.listen(lambda entries: None, controls.append)
    await store.send_control({"op": "cancel", "session_id": "s", "text": "ünï"})
    await eventually(
        lambda: controls == [{"op": "cancel", "session_id": "s", "text": "ünï"}], "the control message"
    )


# --- PostgreSQL only: replicas on one database ---------------------------------------------


def test_notifications_stay_under_the_limit_and_keep_the_order() -> None:
    # The second fits a payload alone, the third not: an entry's JSON is its text and under 100 bytes.
    sizes = [10, TEXT_LIMIT - 200, TEXT_LIMIT - 50, 20, 30, TEXT_LIMIT + 1_500, 40, *range(0, 3_000, 150)]
    entries = [
        LogEntry("s", "chunk", {"text": "x" * size}, 1_000, seq=n + 1, id=n + 1)
        for n, size in enumerate(sizes)
    ]
    seal = ChannelSeal(os.urandom(32))
    sealed = log_payloads(seal, "replica-a", 2**40, entries)
    assert all(len(payload.encode()) <= NOTIFY_LIMIT for payload in sealed)
    payloads = [opened[0] for opened in (seal.open(p, LOG_CHANNEL) for p in sealed) if opened]
    assert len(payloads) == len(sealed)
    seen: list[int] = []
    for payload in map(json.loads, payloads):
        assert payload["origin"] == "replica-a"
        seen += [item["seq"] for item in payload.get("entries", [])] + [
            seq for _, seq in payload.get("refs", [])
        ]
        assert [item["body"] for item in payload.get("entries", [])] == [
            entries[item["seq"] - 1].body for item in payload.get("entries", [])
        ]
    assert seen == list(range(1, len(sizes) + 1))
    refs = [seq for payload in map(json.loads, payloads) for _, seq in payload.get("refs", [])]
    assert refs == [3, 6]  # too big for a payload of their own
    assert len(payloads) < len(sizes)  # the small ones share payloads


def test_a_sealed_payload_opens_only_unchanged_on_its_channel_under_its_key() -> None:
    seal = ChannelSeal(os.urandom(32))
    payload = seal.seal('{"text": "ünï"}', LOG_CHANNEL)
    raw = base64.b64decode(payload)
    assert payload.isascii() and seal.open(payload, LOG_CHANNEL) == ('{"text": "ünï"}', raw[:12])
    assert seal.seal('{"text": "ünï"}', LOG_CHANNEL) != payload  # a fresh nonce each time
    for index in (0, 12, len(raw) - 1):  # the nonce, the ciphertext, the tag
        changed = bytearray(raw)
        changed[index] ^= 1
        assert seal.open(base64.b64encode(changed).decode(), LOG_CHANNEL) is None
    assert seal.open(payload, CONTROL_CHANNEL) is None
    assert ChannelSeal(os.urandom(32)).open(payload, LOG_CHANNEL) is None
    for junk in ("", "not base64!", base64.b64encode(b"short").decode()):
        assert seal.open(junk, LOG_CHANNEL) is None


async def test_a_failing_handler_or_a_foreign_notification_does_not_stop_the_listener(
    replicas: tuple[PostgresStore, PostgresStore], postgres_url: str
) -> None:
    a, b = replicas
    got: list[int] = []

    bodies: list[LogEntry] = []

    def on_entries(entries: list[LogEntry]) -> None:
        got.extend(e.seq for e in entries)
        bodies.extend(entries)
        raise RuntimeError("a handler's bug")

    await b.listen(on_entries, lambda message: None)
    await a.create_session(session("s"), [], log=[entry("s", 0)])
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as intruder:
        for payload in (
            "not JSON",
            "[1]",
            '{"entries": [{"seq": 1}]}',
            '{"entries": [1]}',
            '{"refs": [["s"]]}',
            '{"refs": [[1, "x"]]}',
            '{"entries": [{"session_id": "s", "kind": "k", "body": {},'
            ' "timestamp": 1, "seq": 1, "id": "x"}]}',
            '{"txid": 1, "entries": [{"session_id": "s", "kind": "k", "body": [], "timestamp": 1,'
            ' "seq": 5000, "id": 2}]}',
        ):
            await intruder.execute(
                "SELECT pg_notify('a3s_log', %s), pg_notify('a3s_control', %s)", (payload, payload)
            )
        # Well formed but not sealed: a hint at most. An entry that is not in the table is not
        # handed on; one that is comes as the table has it, whatever the notification said.
        forged = '{"origin": "x", "txid": 1, "entries": [{"session_id": "s", "kind": "k", "body": %s,'
        for body, seq in (("{}", 1000), ('{"forged": true}', 1)):
            await intruder.execute(
                "SELECT pg_notify('a3s_log', %s)",
                (forged % body + f' "timestamp": 1, "seq": {seq}, "id": 1}}]}}',),
            )
    await a.append_log([entry("s", 1)])
    # Entry 1 three times: its own notification, and two that named it (handed on again as the
    # table has it; subscribers skip what they had).
    await eventually(lambda: got == [1, 1, 1, 2], "the real entries despite the failures")
    assert [e.body for e in bodies] == [entry("s", 0).body] * 3 + [entry("s", 1).body]


async def test_replicas_see_each_others_entries_and_control_messages(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = replicas
    got: dict[str, list[LogEntry]] = {"a": [], "b": []}
    controls: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    await a.listen(got["a"].extend, controls["a"].append)
    await b.listen(got["b"].extend, controls["b"].append)

    await a.create_session(session("s"), [], log=[entry("s", 0)])
    big = LogEntry("s", "chunk", {"text": "x" * (NOTIFY_LIMIT * 2)}, 1_000)  # too big to go inline
    many = [LogEntry("s", "chunk", {"text": "é" * 50 * n}, 1_000) for n in range(1, 60)]  # several payloads
    await a.append_log([*many[:30], big, *many[30:]])
    await eventually(lambda: len(got["b"]) == 61, "b to get a's 61 entries")
    assert [e.seq for e in got["b"]] == list(range(1, 62))
    assert got["b"][31].body == big.body and got["b"][31].id == big.id
    assert got["b"] == await a.read_log("s", 0, 100)

    await b.append_log([entry("s", 100)])
    await eventually(lambda: [e.seq for e in got["a"]] == [62], "a to get b's entry")
    await b.send_control({"op": "pause", "session_id": "s"})
    await eventually(
        lambda: controls["a"] == controls["b"] == [{"op": "pause", "session_id": "s"}], "both controls"
    )
    assert [e.seq for e in got["a"]] == [62]  # its own entries are not handed back to a
    assert len(got["b"]) == 61

    # Too big for a notification: stored, and notified by reference; both get it whole.
    big_control = {"op": "inject", "text": "ÿ" * NOTIFY_LIMIT * 4}
    await a.send_control(big_control)
    await eventually(lambda: controls["a"][-1:] == controls["b"][-1:] == [big_control], "the big control")


@pytest.fixture
async def intruder(postgres_server: Any, postgres_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection as a role of its own with no privilege but the default CONNECT (a read-only
    reporting login, say)."""
    role = f"intruder_{os.urandom(4).hex()}"
    async with await psycopg.AsyncConnection.connect(postgres_server.get_uri(), autocommit=True) as admin:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        try:
            url = psycopg.conninfo.make_conninfo(postgres_url, user=role)
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                yield conn
        finally:
            await admin.execute(f"DROP OWNED BY {role}")
            await admin.execute(f"DROP ROLE {role}")


async def heard(conn: psycopg.AsyncConnection[Any], count: int) -> list[str]:
    """The payloads of the next `count` notifications on `conn`."""
    payloads: list[str] = []
    async with asyncio.timeout(WITHIN_S):
        async for notify in conn.notifies():
            payloads.append(notify.payload)
            if len(payloads) == count:
                return payloads
    return payloads


async def test_a_role_that_may_only_connect_can_neither_read_the_channel_nor_send_on_it(
    replicas: tuple[PostgresStore, PostgresStore],
    postgres_url: str,
    intruder: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LISTEN and NOTIFY take no privilege. The intruder hears only sealed payloads, cannot read
    the key nor a stored control message, and what it sends is not believed: a control message of
    its own (approving a tool call), two it captured and sends again (one by reference), one sealed
    long ago, a log payload moved to the control channel."""
    a, b = replicas
    controls: list[dict[str, Any]] = []
    await b.listen(lambda entries: None, controls.append)
    for table in ("channel_key", "control_messages"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await intruder.execute(f"SELECT * FROM {table}")
    await intruder.execute(f"LISTEN {LOG_CHANNEL}")
    await intruder.execute(f"LISTEN {CONTROL_CHANNEL}")

    await a.create_session(session("s"), [], log=[LogEntry("s", "event", {"text": "the secret plan"}, 1_000)])
    [log_payload] = await heard(intruder, 1)
    confirm = {"to": "replica-b", "from": "replica-a", "id": "r1", "action": "confirm", "session_id": "s"}
    await a.send_control(
        {**confirm, "args": {"tool_id": "t1", "approved": True, "reason": "the secret plan"}}
    )
    [control] = await heard(intruder, 1)
    await a.send_control({**confirm, "id": "r1-big", "args": {"reason": "the secret plan " * 1_000}})
    [big] = await heard(intruder, 1)  # by reference: the message is in control_messages
    await eventually(lambda: len(controls) == 2, "b to get a's control messages")
    assert all(
        "secret" not in payload and "confirm" not in payload for payload in (log_payload, control, big)
    )

    forged = json.dumps({**confirm, "id": "r2", "args": {"tool_id": "t2", "approved": True, "reason": ""}})
    seal = await the_seal(postgres_url)
    monkeypatch.setattr(postgres_channel, "now_ms", lambda: 1_000)  # sealed in 1970: long ago
    stale = control_payload(seal, control_text({**confirm, "id": "r3", "args": {}}))
    monkeypatch.undo()
    for payload in (forged, control, big, stale, log_payload):
        await intruder.execute("SELECT pg_notify(%s, %s)", (CONTROL_CHANNEL, payload))
    await a.send_control({**confirm, "id": "r4", "args": {}})  # after them: once it is here, they were heard
    await eventually(lambda: len(controls) == 3, "b to get a's last control message")
    assert [message["id"] for message in controls] == ["r1", "r1-big", "r4"]
    assert controls[0]["args"]["reason"] == "the secret plan"


async def test_a_stored_control_message_is_removed_once_no_listener_would_take_it(
    replicas: tuple[PostgresStore, PostgresStore], postgres_url: str
) -> None:
    a, _ = replicas
    big = {"op": "inject", "text": "y" * NOTIFY_LIMIT}
    await a.send_control(big)
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        # Sent long enough ago that its window has passed on every replica's clock.
        await conn.execute("UPDATE control_messages SET created_at = created_at - %s", (CONTROL_KEPT_MS,))
        await a.send_control(big)
        rows = await (await conn.execute("SELECT body FROM control_messages")).fetchall()
    assert len(rows) == 1 and json.loads(rows[0][0])["text"] == big["text"]


async def test_replicas_appending_to_one_session_at_once_leave_no_gap(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = replicas
    await a.create_session(session("s"), [])
    batches = [[entry("s", n), entry("s", n)] for n in range(40)]
    await asyncio.gather(*((a if n % 2 else b).append_log(batch) for n, batch in enumerate(batches)))
    assert await seqs(a, "s") == list(range(1, 81))
    assert await a.log_bounds("s") == (1, 80)


async def the_seal(url: str) -> ChannelSeal:
    """The replicas' seal, as a replica reads it."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        row = await (await conn.execute("SELECT key FROM channel_key")).fetchone()
    assert row is not None
    return ChannelSeal(bytes(row[0]))


async def first_entry_heard(a: PostgresStore, b: PostgresStore) -> list[LogEntry]:
    """b listening, and session "s" made on a with one entry, which b got: what b gets."""
    got: list[LogEntry] = []
    await b.listen(got.extend, lambda message: None)
    await a.create_session(session("s"), [], log=[entry("s", 0)])
    await eventually(lambda: len(got) == 1, "the first entry")
    return got


async def drop_listeners(admin: psycopg.AsyncConnection[Any], database: str) -> None:
    """End the listening connections on `database` as a network drop would, and let nobody connect
    to it again until ALLOW_CONNECTIONS is turned back on."""
    await admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
    await admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND application_name LIKE %s",
        (database, f"{LISTENER_NAME}%"),
    )


@dataclass
class Listening:
    """Two replicas on the tests' database, its name, and a superuser connection to its server."""

    a: PostgresStore
    b: PostgresStore
    database: str
    admin: psycopg.AsyncConnection[Any]


@pytest.fixture
async def listening(
    replicas: tuple[PostgresStore, PostgresStore], postgres_server: Any, postgres_url: str
) -> AsyncIterator[Listening]:
    """For the tests that cut the listeners off: connections are allowed again at the end."""
    database = str(psycopg.conninfo.conninfo_to_dict(postgres_url)["dbname"])
    async with await psycopg.AsyncConnection.connect(postgres_server.get_uri(), autocommit=True) as admin:
        try:
            yield Listening(*replicas, database, admin)
        finally:
            await admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")


async def test_the_listener_reconnects_and_delivers_what_was_appended_while_it_was_down(
    listening: Listening, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_channel, "HORIZON_EVERY_S", 0.1)  # the horizon passes the first entry
    a, b, admin = listening.a, listening.b, listening.admin
    got = await first_entry_heard(a, b)
    await asyncio.sleep(0.5)

    with caplog.at_level(logging.WARNING, logger="a3s_agent.core.store.postgres_channel"):
        await drop_listeners(admin, listening.database)
        await eventually(lambda: caplog.text.count("lost its connection") >= 2, "a failed reconnect")
        await a.append_log([entry("s", n) for n in range(1, 4)])  # on a's open connection
        assert len(got) == 1
    await admin.execute(f"ALTER DATABASE {listening.database} ALLOW_CONNECTIONS true")
    await eventually(lambda: [e.seq for e in got] == [1, 2, 3, 4], "every entry once, after the reconnect")
    await a.append_log([entry("s", 5)])
    await eventually(lambda: [e.seq for e in got] == [1, 2, 3, 4, 5], "entries after the reconnect")


@pytest.mark.parametrize("horizon_every_s", [HORIZON_EVERY_S, 0.1])
async def test_an_entry_committed_out_of_id_order_while_the_listener_was_down_is_delivered(
    listening: Listening,
    postgres_url: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    horizon_every_s: float,
) -> None:
    """Ids are handed out at insert, commits come in any order: an entry whose transaction began
    before the last entry b saw, and committed while b's listener was down, still reaches b, once,
    however often b's horizon moved meanwhile (every 0.1 s: several times)."""
    monkeypatch.setattr(postgres_channel, "HORIZON_EVERY_S", horizon_every_s)
    a, b, admin, database = listening.a, listening.b, listening.admin, listening.database
    got: list[LogEntry] = []
    await b.listen(got.extend, lambda message: None)
    await a.create_session(session("early"), [])
    await a.create_session(session("late"), [])

    # A writer still in its transaction, holding the smaller id.
    async with await psycopg.AsyncConnection.connect(postgres_url) as slow:
        await slow.execute("UPDATE sessions SET last_seq = 1 WHERE id = 'early'")
        await slow.execute(
            "INSERT INTO event_log (session_id, seq, kind, body, created_at, origin)"
            " VALUES ('early', 1, 'event', '{\"n\": 1}', 1000, 'replica-a')"
        )
        await a.append_log([entry("late", 2)])  # a larger id, committed first
        await eventually(lambda: [(e.session_id, e.seq) for e in got] == [("late", 1)], "the later id")
        await asyncio.sleep(0.5)  # at 0.1 s, b samples its horizon several times meanwhile
        with caplog.at_level(logging.WARNING, logger="a3s_agent.core.store.postgres_channel"):
            await drop_listeners(admin, database)
            await eventually(lambda: "lost its connection" in caplog.text, "b's listener down")
            await slow.commit()  # the earlier id, while nobody hears of it
        await admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")
    await eventually(
        lambda: sorted((e.session_id, e.seq) for e in got) == [("early", 1), ("late", 1)],
        "the earlier id after the reconnect",
    )


async def test_a_subscriber_to_every_session_that_fell_behind_gets_an_entry_committed_out_of_id_order(
    replicas: tuple[PostgresStore, PostgresStore], postgres_url: str
) -> None:
    """Its queue overflowed, and meanwhile an entry holding a smaller id than one it had already
    read committed: reading the log to catch up, it still gets that entry, and every other, once."""
    a, b = replicas
    bus = EventBus(b)
    await b.listen(bus.deliver, lambda message: None)
    await a.create_session(session("early"), [])
    await a.create_session(session("late"), [])
    behind = await bus.subscribe(Filter(), size=2)  # every session's events, a queue of two
    reader = aiter(behind)
    heard = await bus.subscribe(Filter())  # what b's listener has handed on so far
    heard_reader = aiter(heard)

    async def hear(expected: tuple[str, int]) -> None:
        """Until b's listener has handed on the entry `expected` (session, seq)."""
        while True:
            heard_entry = await asyncio.wait_for(anext(heard_reader), WITHIN_S)
            if (heard_entry.session_id, heard_entry.seq) == expected:
                return

    # A writer still in its transaction, holding the smaller id; it announces its entry as a
    # replica's write does, in the same transaction.
    async with await psycopg.AsyncConnection.connect(postgres_url) as slow:
        early = entry("early", 1)
        early.seq = 1
        await slow.execute("UPDATE sessions SET last_seq = 1 WHERE id = 'early'")
        cursor = await slow.execute(
            "INSERT INTO event_log (session_id, seq, kind, body, created_at, origin)"
            " VALUES ('early', 1, %s, %s, %s, 'replica-a') RETURNING id, txid",
            (early.kind, json.dumps(early.body), early.timestamp),
        )
        early.id, txid = await cursor.fetchone() or (0, 0)
        for payload in log_payloads(await the_seal(postgres_url), "replica-a", int(txid), [early]):
            await slow.execute("SELECT pg_notify(%s, %s)", (postgres_channel.LOG_CHANNEL, payload))
        await a.append_log([entry("late", 1)])  # a larger id, committed first
        first = await asyncio.wait_for(anext(reader), WITHIN_S)
        assert (first.session_id, first.seq) == ("late", 1)
        await a.append_log([entry("late", n) for n in range(2, 6)])  # more than its queue holds
        await hear(("late", 5))
        await slow.commit()  # the smaller id, while the subscriber is behind
        await hear(("early", 1))
    rest = [await asyncio.wait_for(anext(reader), WITHIN_S) for _ in range(5)]
    assert sorted((e.session_id, e.seq) for e in rest) == [("early", 1), *(("late", n) for n in range(2, 6))]
    behind.close()
    heard.close()


async def test_a_listening_connection_whose_server_stops_answering_is_replaced(
    listening: Listening, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A network that drops the connection without a word: the listener's periodic sample gets no
    answer, so it takes the connection as lost, listens on a new one and misses nothing."""
    monkeypatch.setattr(postgres_channel, "HORIZON_EVERY_S", 0.1)
    monkeypatch.setattr(postgres_channel, "ANSWER_WITHIN_S", 0.3)
    a, b = listening.a, listening.b
    got = await first_entry_heard(a, b)
    cursor = await listening.admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name LIKE %s",
        (listening.database, f"{LISTENER_NAME}%"),
    )
    [(frozen,)] = await cursor.fetchall()
    os.kill(frozen, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.WARNING, logger="a3s_agent.core.store.postgres_channel"):
            await eventually(lambda: "no answer within 0.3 s" in caplog.text, "the silence noticed")
        await a.append_log([entry("s", 1)])
        await eventually(lambda: [e.seq for e in got] == [1, 2], "an entry on the new connection")
    finally:
        os.kill(frozen, signal.SIGCONT)


async def test_replicas_starting_together_migrate_once(postgres_url: str) -> None:
    stores = [PostgresStore(postgres_url, f"replica-{n}") for n in range(3)]
    await asyncio.gather(*(s.open() for s in stores))
    await asyncio.gather(*(s.close() for s in stores))
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        rows = await (await conn.execute("SELECT version FROM a3s_schema")).fetchall()
    assert rows == [(len(MIGRATIONS),)]


async def test_durability_is_what_the_server_does(postgres_url: str) -> None:
    store = PostgresStore(postgres_url, "replica-a")
    await store.open()
    assert store.durability == "full"  # synchronous_commit on, fsync on: the server's defaults
    await store.close()
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute(f"ALTER DATABASE {conn.info.dbname} SET synchronous_commit = off")
    relaxed = PostgresStore(postgres_url, "replica-a")
    await relaxed.open()
    assert relaxed.durability == "normal"
    await relaxed.close()


async def test_a_write_stuck_behind_another_client_s_lock_fails_unavailable_then_the_store_goes_on(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another client holds the session's row (a replica frozen mid-transaction, say): the write
    gives up after statement_timeout with UNAVAILABLE, writes nothing, and the next one succeeds."""
    monkeypatch.setattr(postgres_bounds, "STATEMENT_TIMEOUT_MS", 300)
    store = PostgresStore(postgres_url, "replica-a")
    await store.open()
    try:
        await store.create_session(session("s"), [])
        async with await psycopg.AsyncConnection.connect(postgres_url) as intruder:
            await intruder.execute("SELECT id FROM sessions WHERE id = 's' FOR UPDATE")
            with pytest.raises(Unavailable, match=r"PostgreSQL store \(--store\) did not answer in time"):
                async with asyncio.timeout(10):
                    await store.append_messages("s", [Message(role="user", content="lost?")], 2_000)
            await intruder.rollback()
        await store.append_messages("s", [Message(role="user", content="kept")], 3_000)
        assert [m.content for m in await store.load_messages("s")] == ["kept"]
    finally:
        await store.close()


async def test_a_dropped_pooled_connection_fails_one_call_unavailable_naming_no_host_or_user(
    postgres_server: Any, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresStore(postgres_url, "replica-a")
    await store.open()
    try:
        await store.create_session(session("s"), [])
        database = psycopg.conninfo.conninfo_to_dict(postgres_url)
        async with await psycopg.AsyncConnection.connect(postgres_server.get_uri(), autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database["dbname"],),
            )
        failing = pytest.raises(Unavailable, match=r"store \(--store\) failed \(\w+; the server's log has")
        with (
            caplog.at_level(logging.WARNING, logger="a3s_agent.core.store.postgres_bounds"),
            failing as failed,
        ):
            await store.list_sessions()
        said = str(failed.value)
        for private in (database.get("host"), database.get("user"), database["dbname"]):
            assert not private or str(private) not in said
        assert "the PostgreSQL store (--store) failed: " in caplog.text  # the reason, for the operator
        assert [s.id for s in await store.list_sessions()] == ["s"]  # the pool replaced it
    finally:
        await store.close()


async def test_the_operator_s_statement_timeout_in_the_url_wins(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_bounds, "STATEMENT_TIMEOUT_MS", 600_000)  # ours would hang the test
    store = PostgresStore(
        psycopg.conninfo.make_conninfo(postgres_url, options="-c statement_timeout=300"), "r"
    )
    await store.open()
    try:
        await store.create_session(session("s"), [])
        async with await psycopg.AsyncConnection.connect(postgres_url) as intruder:
            await intruder.execute("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(Unavailable, match="statement_timeout"):
                async with asyncio.timeout(10):
                    await store.list_sessions()
    finally:
        await store.close()


async def test_destroying_a_session_ends_its_lease_so_its_run_is_fenced_off(store: Store) -> None:
    await store.create_session(session("s"), [])
    lease = await store.acquire_lease("s", "replica-a", "run-1", LONG_TTL_MS)
    assert lease is not None
    assert await store.delete_session("s")
    assert await store.lease_of("s") is None
    await store.create_session(session("s"), [])  # the same id again: the old run cannot write into it
    with pytest.raises(LeaseLost):
        await store.append_messages("s", [Message("assistant", "late")], 2_000, fence=lease.token)
    assert await store.load_messages("s") == []


def test_a_store_url_without_a_password_takes_pgpassword_which_the_server_then_withholds() -> None:
    from psycopg.conninfo import conninfo_to_dict

    from a3s_agent.config import ConfigError, settings_from

    env = {"A3S_STORE": "postgresql://agent@db:5432/a3s", "PGPASSWORD": "p w/@"}
    parsed = conninfo_to_dict(settings_from(env=env).store)
    assert (parsed["user"], parsed["password"], parsed["host"], parsed["dbname"]) == (
        "agent",
        "p w/@",
        "db",
        "a3s",
    )
    own = settings_from(env={**env, "A3S_STORE": "postgresql://agent:own@db/a3s"}).store
    assert conninfo_to_dict(own)["password"] == "own"  # the URL's own password wins
    with pytest.raises(ConfigError, match="postgresql://"):
        settings_from(env={"A3S_STORE": "mysql://db/a3s"})


def test_serve_with_an_unreachable_store_exits_naming_why_and_not_the_password(tmp_path: Path) -> None:
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = f"postgresql://agent:s3cret-pw@127.0.0.1:{port}/a3s"  # from the environment: not in ps
    command = [sys.executable, "-m", "a3s_agent", "serve", "--data-dir", str(tmp_path / "d")]
    ended = subprocess.run(
        [*command, "--listen", "127.0.0.1:0", "--http-listen", "off"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "A3S_STORE": store},
    )  # fmt: skip
    assert ended.returncode == 1
    assert "cannot reach the PostgreSQL store (--store)" in ended.stderr and "Traceback" not in ended.stderr
    assert "s3cret-pw" not in ended.stderr + ended.stdout


# --- A3S harness runs ----------------------------------------------------------------------


async def test_a_harness_run_is_reserved_once_then_saved_and_loaded(store: Store) -> None:
    first = {"prompt": "do it", "state": "created", "after_seq": 3}
    assert await store.load_harness_run("s1", "r1") is None
    results = await asyncio.gather(
        *(store.reserve_harness_run("s1", "r1", {**first, "n": n}) for n in range(5))
    )
    winners = [r for r in results if r is None]
    assert len(winners) == 1  # of concurrent reservations, one wins; the others get its record
    won = next(n for n, r in enumerate(results) if r is None)
    assert all(r == {**first, "n": won} for r in results if r is not None)
    await store.save_harness_run("s1", "r1", {**first, "state": "completed", "tree": None})
    assert await store.load_harness_run("s1", "r1") == {**first, "state": "completed", "tree": None}
    # The id is per session.
    assert await store.reserve_harness_run("s2", "r1", first) is None
    assert await store.load_harness_run("s2", "r1") == first
    assert (await store.load_harness_run("s1", "r1") or {})["state"] == "completed"


# --- SQLite: servers beside each other on one file -----------------------------------------------


async def test_a_write_waits_for_another_server_s_commit_on_the_same_file(tmp_path: Path) -> None:
    """Two servers on one data dir (an editor's `acp` beside `serve`): while the other holds the
    file's write lock, a lease taken here (a read, then writes) waits for it and then succeeds,
    rather than failing "database is locked" because the other committed after it read."""
    store = SqliteStore(tmp_path / "sessions.db")
    await store.open()
    try:
        await store.create_session(session("s"), [])
        await store.create_session(session("t"), [])
        other = sqlite3.connect(tmp_path / "sessions.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE sessions SET updated_at = updated_at + 1 WHERE id = 't'")
        taking = asyncio.create_task(store.acquire_lease("s", "replica-a", "run-1", LONG_TTL_MS))
        await asyncio.sleep(0.3)
        assert not taking.done()  # waiting for the other's lock
        other.execute("COMMIT")
        async with asyncio.timeout(WITHIN_S):
            lease = await taking
        assert lease is not None and lease.run_id == "run-1"
        other.close()
    finally:
        await store.close()


async def test_a_lock_held_past_the_timeout_fails_unavailable_then_the_store_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_base, "BUSY_TIMEOUT_S", 0.3)
    store = SqliteStore(tmp_path / "sessions.db")
    await store.open()
    try:
        await store.create_session(session("s"), [])
        other = sqlite3.connect(tmp_path / "sessions.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(Unavailable, match=r"sessions store's SQLite file stayed locked .* for 0.3 s"):
            await store.append_messages("s", [Message(role="user", content="lost?")], 2_000)
        other.execute("ROLLBACK")
        other.close()
        await store.append_messages("s", [Message(role="user", content="kept")], 3_000)
        assert [m.content for m in await store.load_messages("s")] == ["kept"]
    finally:
        await store.close()


async def test_servers_opening_a_new_file_together_migrate_it_once(tmp_path: Path) -> None:
    """Each store has its own connection and thread: as servers starting together on one data dir."""
    for attempt in range(5):
        stores = [SqliteStore(tmp_path / f"sessions-{attempt}.db") for _ in range(6)]
        await asyncio.gather(*(s.open() for s in stores))
        await stores[0].create_session(session("s"), [])
        assert [s.id for s in await stores[-1].list_sessions()] == ["s"]
        await asyncio.gather(*(s.close() for s in stores))


# --- the A2A face's tasks ------------------------------------------------------------------------


def a2a_task(
    task_id: str, *, owner: str = "alice", context: str = "c1", ended: bool = False, at: int = 1
) -> A2aTaskRecord:
    return A2aTaskRecord(task_id, owner, context, ended, at, f"{task_id} at {at}".encode())


async def test_a2a_tasks_are_kept_found_by_owner_and_context_and_an_ended_one_is_final(store: Store) -> None:
    table = store.a2a_tasks
    await table.save_a2a_task(a2a_task("t1", at=1), keep=10)
    await table.save_a2a_task(a2a_task("t2", context="c2", at=2), keep=10)
    await table.save_a2a_task(a2a_task("t3", owner="bob", at=3), keep=10)
    assert [r.id for r in await table.a2a_tasks_of("alice", "")] == ["t2", "t1"]  # newest first
    assert [r.id for r in await table.a2a_tasks_of("alice", "c1")] == ["t1"]
    await table.save_a2a_task(a2a_task("t1", ended=True, at=4), keep=10)
    await table.save_a2a_task(a2a_task("t1", at=5), keep=10)  # a late copy still going: not taken
    assert await table.load_a2a_task("t1") == a2a_task("t1", ended=True, at=4)
    await table.delete_a2a_task("t1")
    assert await table.load_a2a_task("t1") is None


async def test_past_the_bound_the_oldest_ended_a2a_tasks_go_and_none_still_going(store: Store) -> None:
    table = store.a2a_tasks
    await table.save_a2a_task(a2a_task("going", at=1), keep=2)
    await table.save_a2a_task(a2a_task("old", ended=True, at=2), keep=2)
    await table.save_a2a_task(a2a_task("new", ended=True, at=3), keep=2)
    assert {r.id for r in await table.a2a_tasks_of("alice", "")} == {"going", "new"}
    await table.save_a2a_task(a2a_task("also going", at=4), keep=2)
    await table.save_a2a_task(a2a_task("more going", at=5), keep=2)
    assert {r.id for r in await table.a2a_tasks_of("alice", "")} == {"going", "also going", "more going"}
