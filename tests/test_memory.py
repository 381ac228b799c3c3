"""The memory group (a3s-string-dialect.md 4.6) over a real grpc.aio channel with the later
dialect's stubs, on SQLite and PostgreSQL: memories kept per workspace (working ones per session),
ranked search, stats, clearing, deleting, summaries by the session's model, secrets refused, bad
input named, and memories outliving the server and shared by replicas."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from a3s_agent.base.memories import MemoryScope, MemoryStats
from a3s_agent.config import Settings
from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, text

from .conftest import LiveServer, agent_settings, initialize, running, subscribed

Stub = later_grpc.CodeAgentServiceStub
DAY_MS = 86_400_000
EPISODIC, SEMANTIC, PROCEDURAL, WORKING = (
    later.MEMORY_TYPE_EPISODIC,
    later.MEMORY_TYPE_SEMANTIC,
    later.MEMORY_TYPE_PROCEDURAL,
    later.MEMORY_TYPE_WORKING,
)


@asynccontextmanager
async def serving(settings: Settings, fake: FakeLLM | None = None) -> AsyncIterator[tuple[LiveServer, Stub]]:
    async with running(settings) as live:
        if fake is not None:
            await initialize(live, fake)
        yield live, later_grpc.CodeAgentServiceStub(live.channel)


async def a_session(live: LiveServer, workspace: Path | None = None) -> str:
    config = pb.SessionConfig(workspace=str(workspace)) if workspace is not None else pb.SessionConfig()
    return (await live.stub.CreateSession(pb.CreateSessionRequest(config=config))).session_id


async def store(
    stub: Stub,
    session_id: str,
    content: str,
    memory_type: later.MemoryType = SEMANTIC,
    importance: float = 0.5,
    tags: tuple[str, ...] = (),
    **fields: Any,
) -> str:
    item = later.MemoryItem(
        content=content, memory_type=memory_type, importance=importance, tags=tags, **fields
    )
    reply = await stub.StoreMemory(later.StoreMemoryRequest(session_id=session_id, memory=item))
    assert reply.success and reply.memory_id
    return reply.memory_id


async def search(
    stub: Stub, session_id: str, query: str | None = None, **fields: Any
) -> later.SearchMemoriesResponse:
    return await stub.SearchMemories(
        later.SearchMemoriesRequest(session_id=session_id, query=query, **fields)
    )


async def stats(stub: Stub, session_id: str) -> tuple[int, int, int]:
    got = (await stub.GetMemoryStats(later.GetMemoryStatsRequest(session_id=session_id))).stats
    return got.long_term_count, got.short_term_count, got.working_count


async def failure(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


# --- what the TypeScript SDK's live tests and examples do ------------------------------------


async def test_store_retrieve_search_count_and_clear(settings_for: Callable[[str], Settings]) -> None:
    async with serving(settings_for("a")) as (live, stub):
        session_id = await a_session(live)
        prefers = await store(
            stub,
            session_id,
            "User prefers TypeScript over JavaScript",
            EPISODIC,
            0.8,
            ("preference", "language"),
        )
        react = await store(
            stub,
            session_id,
            "Project uses React and Next.js",
            SEMANTIC,
            0.9,
            ("tech-stack",),
            metadata={"project": "web"},
        )
        working = await store(stub, session_id, "Currently editing src/app.tsx", WORKING, 0.4)
        await store(
            stub, session_id, "User is working on authentication feature", EPISODIC, 0.7, ("task", "auth")
        )
        await store(stub, session_id, "Authentication uses JWT tokens", SEMANTIC, 0.8, ("tech", "auth"))

        got = (
            await stub.RetrieveMemory(later.RetrieveMemoryRequest(session_id=session_id, memory_id=react))
        ).memory
        assert (got.id, got.content, got.memory_type, list(got.tags)) == (
            react, "Project uses React and Next.js", SEMANTIC, ["tech-stack"],
        )  # fmt: skip
        assert abs(got.importance - 0.9) < 1e-6 and dict(got.metadata) == {"project": "web"}
        assert (
            got.access_count == 1 and got.HasField("last_accessed") and got.last_accessed >= got.timestamp > 0
        )
        again = (
            await stub.RetrieveMemory(later.RetrieveMemoryRequest(session_id=session_id, memory_id=react))
        ).memory
        assert again.access_count == 2

        found = await search(stub, session_id, "authenticate")  # stemmed: authentication matches
        assert [m.content for m in found.memories] == [
            "Authentication uses JWT tokens",  # as relevant, more important
            "User is working on authentication feature",
        ]
        assert found.total_count == 2
        tagged = await search(stub, session_id, tags=["language", "tech-stack"])
        assert {m.id for m in tagged.memories} == {prefers, react}
        important = await search(stub, session_id, min_importance=0.85)
        assert [m.id for m in important.memories] == [react]
        assert (await search(stub, session_id, "nothing like this")).total_count == 0
        everything = await search(stub, session_id, limit=2)
        assert len(everything.memories) == 2 and everything.total_count == 5
        assert everything.memories[0].id == react  # no query: importance, then recency

        assert await stats(stub, session_id) == (4, 4, 1)  # working memories are not long-term
        cleared = await stub.ClearMemories(
            later.ClearMemoriesRequest(session_id=session_id, clear_working=True)
        )
        assert cleared.success and cleared.cleared_count == 1
        gone = await stub.RetrieveMemory(
            later.RetrieveMemoryRequest(session_id=session_id, memory_id=working)
        )
        assert not gone.HasField("memory")
        cleared = await stub.ClearMemories(
            later.ClearMemoriesRequest(session_id=session_id, clear_short_term=True)
        )
        assert cleared.cleared_count == 4
        assert await stats(stub, session_id) == (4, 0, 0)  # out of short-term memory, still long-term
        assert (await search(stub, session_id, "React")).total_count == 1

        deleted = await stub.DeleteMemory(later.DeleteMemoryRequest(session_id=session_id, memory_id=prefers))
        assert deleted.success
        again_deleted = await stub.DeleteMemory(
            later.DeleteMemoryRequest(session_id=session_id, memory_id=prefers)
        )
        assert not again_deleted.success
        cleared = await stub.ClearMemories(
            later.ClearMemoriesRequest(session_id=session_id, clear_long_term=True)
        )
        assert cleared.cleared_count == 3 and await stats(stub, session_id) == (0, 0, 0)

        kinds = [
            (e.body["message"], e.body["data"])
            for e in await live.runtime.store.read_log(session_id, 0, 1000)
            if e.body.get("message", "").startswith("memor")
        ]
        stored = [data for message, data in kinds if message == "memory_stored"]
        assert [d["memory_type"] for d in stored] == [
            "episodic",
            "semantic",
            "working",
            "episodic",
            "semantic",
        ]
        assert stored[0]["tags"] == json.dumps(["preference", "language"]) and "content" not in stored[0]
        assert {message for message, _ in kinds} == {
            "memory_stored", "memory_recalled", "memories_searched", "memory_cleared",
        }  # fmt: skip


async def test_subscribers_see_memory_events_as_their_dialect_names_them(
    workspace: Path, tmp_path: Path
) -> None:
    async with serving(agent_settings(workspace, tmp_path / "data")) as (live, _):
        session_id = await a_session(live)
        node = grpc.aio.insecure_channel(
            live.address,
            options=[("grpc.use_local_subchannel_pool", 1), ("grpc.primary_user_agent", "grpc-node-js/1.9")],
        )  # a connection of its own, with the TypeScript SDK's user-agent: the later dialect
        async with node:
            stub = later_grpc.CodeAgentServiceStub(node)
            wanted = ["EVENT_TYPE_MEMORY_STORED", "memory_cleared"]
            later_events = stub.SubscribeEvents(
                later.SubscribeEventsRequest(session_id=session_id, event_types=wanted)
            )
            box_events = live.stub.SubscribeEvents(pb.SubscribeEventsRequest(session_id=session_id))
            await subscribed(live, 2)
            memory_id = await store(
                stub, session_id, "Releases are tagged vX.Y.Z", PROCEDURAL, 0.7, ("release",)
            )
            await search(stub, session_id, "release")
            await stub.ClearMemories(later.ClearMemoriesRequest(session_id=session_id, clear_short_term=True))
            stored, cleared = [await asyncio.wait_for(later_events.read(), 10) for _ in range(2)]
            assert (stored.type, stored.message) == (
                later.AgentEvent.EVENT_TYPE_MEMORY_STORED,
                "memory_stored",
            )
            assert stored.data["memory_id"] == memory_id and stored.data["memory_type"] == "procedural"
            assert json.loads(stored.data["tags"]) == ["release"] and stored.data["importance"] == "0.7"
            assert (cleared.type, cleared.data["tier"], cleared.data["count"]) == (
                later.AgentEvent.EVENT_TYPE_MEMORY_CLEARED, "short_term", "1",
            )  # fmt: skip
            box = [await asyncio.wait_for(box_events.read(), 10) for _ in range(3)]
            assert [(e.type, e.message) for e in box] == [
                (pb.AgentEvent.EVENT_TYPE_INFO, "memory_stored"),
                (pb.AgentEvent.EVENT_TYPE_INFO, "memories_searched"),
                (pb.AgentEvent.EVENT_TYPE_INFO, "memory_cleared"),
            ]
            assert box[1].data["result_count"] == "1" and box[1].data["query"] == "release"
            for call in (later_events, box_events):
                call.cancel()


# --- scope, durability, replicas ---------------------------------------------------------------


async def test_a_workspace_shares_its_memories_a_working_memory_stays_with_its_session(
    settings_for: Callable[[str], Settings], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "workspace" / "other"
    elsewhere.mkdir()
    async with serving(settings_for("a")) as (live, stub):
        first, second, apart = await a_session(live), await a_session(live), await a_session(live, elsewhere)
        shared = await store(stub, first, "The build runs with make ci", PROCEDURAL, 0.6, ("build",))
        private = await store(stub, first, "Halfway through renaming Foo to Bar", WORKING, 0.9)

        assert [m.id for m in (await search(stub, second, "make")).memories] == [shared]
        assert (await search(stub, second, "renaming")).total_count == 0
        hidden = await stub.RetrieveMemory(later.RetrieveMemoryRequest(session_id=second, memory_id=private))
        assert not hidden.HasField("memory")
        assert not (
            await stub.DeleteMemory(later.DeleteMemoryRequest(session_id=second, memory_id=private))
        ).success
        assert await stats(stub, second) == (1, 0, 0)  # shared, but not stored by this session
        assert await stats(stub, apart) == (0, 0, 0)  # another workspace sees nothing of them
        assert (await search(stub, apart, "make")).total_count == 0
        assert not (
            await stub.DeleteMemory(later.DeleteMemoryRequest(session_id=apart, memory_id=shared))
        ).success

        await live.stub.DestroySession(pb.DestroySessionRequest(session_id=first))
        assert await stats(stub, second) == (1, 0, 0)  # the shared memory outlives the session
        assert [m.id for m in (await search(stub, second)).memories] == [shared]
        # Its working memory went with it, and it has no short-term memory left.
        scope = MemoryScope(str(live.workspace.resolve()), first)
        assert await live.runtime.store.memories.stats(scope) == MemoryStats(1, 0, 0)


async def test_memories_outlive_the_server_and_replicas_share_them(
    settings_for: Callable[[str], Settings],
) -> None:
    async with serving(settings_for("a")) as (live, stub):
        session_id = await a_session(live)
        kept = await store(
            stub, session_id, "Deploys go through the staging cluster first", SEMANTIC, 0.7, ("deploy",)
        )
        working = await store(stub, session_id, "Checking the staging logs", WORKING)
        if live.runtime.store.shared:  # a replica on the same database sees them at once
            async with serving(settings_for("b")) as (_, replica):
                found = await search(replica, session_id, "staging")
                assert [m.id for m in found.memories] == [kept, working]
                assert await stats(replica, session_id) == (1, 1, 1)
    async with serving(settings_for("a")) as (live, stub):  # started again on the same store
        found = await search(stub, session_id, "staging cluster")
        assert [m.id for m in found.memories] == [kept, working]
        assert await stats(stub, session_id) == (1, 1, 1)


async def test_search_ranks_by_text_importance_and_recency(settings_for: Callable[[str], Settings]) -> None:
    async with serving(settings_for("a")) as (live, stub):
        session_id = await a_session(live)
        now = int(time.time() * 1000)
        old = await store(
            stub, session_id, "Run pytest with -x", PROCEDURAL, 0.6, timestamp=now - 120 * DAY_MS
        )
        new = await store(stub, session_id, "Run pytest with -q", PROCEDURAL, 0.6)
        minor = await store(stub, session_id, "Run pytest with --lf", PROCEDURAL, 0.1)
        both = await store(stub, session_id, "pytest and coverage: run pytest --cov", PROCEDURAL, 0.6)
        others = [
            await store(stub, session_id, f"note {n} about something else", EPISODIC, 0.9) for n in range(3)
        ]

        found = await search(stub, session_id, "pytest coverage")
        assert found.memories[0].id == both  # the only one with both words
        assert [m.id for m in found.memories[1:]] == [new, old, minor]  # same text: importance, recency
        assert found.total_count == 4
        assert found.memories[2].timestamp == now - 120 * DAY_MS
        top = await search(stub, session_id, limit=3)  # no query: importance then recency
        assert [m.id for m in top.memories] == list(reversed(others)) and top.total_count == 7
        recent = await search(stub, session_id, recent_only=True, limit=2)
        assert [m.id for m in recent.memories] == [others[2], others[1]]  # newest first


HOSTILE_QUERIES = [
    'content:pytest OR "unclosed', "NEAR(pytest coverage, 2)", "pytest*", "-pytest ^coverage",
    "pytest') OR 1=1 --", "pytest & !coverage | (:*", "{content}: pytest", "\x00 pytest \u202e",
]  # fmt: skip


async def test_query_text_is_words_never_query_syntax(settings_for: Callable[[str], Settings]) -> None:
    async with serving(settings_for("a")) as (live, stub):
        session_id = await a_session(live)
        pytest_id = await store(stub, session_id, "Run pytest with coverage", PROCEDURAL)
        await store(stub, session_id, "Unrelated note about colours", EPISODIC)
        for query in HOSTILE_QUERIES:
            found = await search(stub, session_id, query)
            assert [m.id for m in found.memories] == [pytest_id], query
        assert (await search(stub, session_id, "!!! ... ???")).total_count == 0  # no word: no match
        assert (await search(stub, session_id, "the and of")).total_count == 0  # only common words


async def test_a_working_memory_is_bounded_and_a_workspace_too(
    settings_for: Callable[[str], Settings],
) -> None:
    async with serving(replace(settings_for("a"), max_memories=3)) as (live, stub):
        session_id = await a_session(live)
        kept = [await store(stub, session_id, f"step {n}", WORKING, n / 20) for n in range(12)]
        assert await stats(stub, session_id) == (0, 0, 10)  # the two least important made room
        assert {m.id for m in (await search(stub, session_id, limit=20)).memories} == set(kept[2:])
        facts = [await store(stub, session_id, f"fact {n}") for n in range(3)]
        one_more = later.StoreMemoryRequest(
            session_id=session_id, memory=later.MemoryItem(content="one more")
        )
        full = await failure(stub.StoreMemory(one_more))
        assert full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "holds its maximum of 3 memories" in (full.details() or "")
        assert await stats(stub, session_id) == (3, 3, 10)
        await stub.DeleteMemory(later.DeleteMemoryRequest(session_id=session_id, memory_id=facts[0]))
        await stub.StoreMemory(one_more)  # a deleted one made room, a working one does not count
        await stub.ClearMemories(later.ClearMemoriesRequest(session_id=session_id, clear_long_term=True))
        assert [await store(stub, session_id, f"again {n}") for n in range(3)]
        assert (await failure(stub.StoreMemory(one_more))).code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# --- summaries ----------------------------------------------------------------------------------


async def test_the_session_model_summarizes_memories_into_a_new_one(
    settings_for: Callable[[str], Settings], fake: FakeLLM
) -> None:
    async with serving(settings_for("a"), fake) as (live, stub):
        session_id = await a_session(live)
        await store(stub, session_id, "Tests run with pytest -q", PROCEDURAL, 0.6, ("testing",))
        await store(stub, session_id, "CI fails without the lint step", EPISODIC, 0.8, ("testing",))
        await store(stub, session_id, "The user likes short answers", SEMANTIC, 0.9, ("style",))
        fake.script(text("Run pytest -q and lint before pushing; the key is sk-abcdefghijklmnopqrstuvwx."))
        done = await stub.SummarizeMemories(
            later.SummarizeMemoriesRequest(session_id=session_id, tags=["testing"])
        )
        assert done.memory_count == 2 and done.stored and done.summary_memory_id
        assert done.summary == "Run pytest -q and lint before pushing; the key is [redacted]."
        prompt = fake.requests[-1].messages
        listed = prompt[-1]["content"]
        assert "Tests run with pytest -q" in listed and "CI fails without the lint step" in listed
        assert "short answers" not in listed and "not instructions" in prompt[0]["content"]
        kept = (
            await stub.RetrieveMemory(
                later.RetrieveMemoryRequest(session_id=session_id, memory_id=done.summary_memory_id)
            )
        ).memory
        assert kept.content == done.summary and list(kept.tags) == ["summary", "testing"]
        assert kept.memory_type == SEMANTIC and abs(kept.importance - 0.8) < 1e-6
        assert live.runtime.sessions.get(session_id).usage.total_tokens > 0  # billed as any model turn

        none = await stub.SummarizeMemories(
            later.SummarizeMemoriesRequest(session_id=session_id, tags=["absent"])
        )
        assert (none.memory_count, none.stored, none.summary) == (0, False, "")


async def test_summarizing_without_a_model_says_what_to_configure(
    settings_for: Callable[[str], Settings],
) -> None:
    async with serving(settings_for("a")) as (live, stub):
        session_id = await a_session(live)
        await store(stub, session_id, "Something worth condensing")
        refused = await failure(stub.SummarizeMemories(later.SummarizeMemoriesRequest(session_id=session_id)))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "A3S_LLM_MODEL" in (refused.details() or "")


# --- secrets and bad input ------------------------------------------------------------------------


SECRETS = {
    "content": later.MemoryItem(content="The OpenAI key is sk-proj-abcdefghijklmnopqrstuvwxyz0123"),
    "aws": later.MemoryItem(content="use AKIAIOSFODNN7EXAMPLE for uploads"),
    "assigned": later.MemoryItem(content="login with DB_PASSWORD=hunter2hunter2"),
    "metadata": later.MemoryItem(content="deploy notes", metadata={"github_token": "ghp_" + "a" * 36}),
    "tag": later.MemoryItem(content="deploy notes", tags=["Bearer abcdefghijklmnopqrstuvwxyz"]),
    "url": later.MemoryItem(content="the database is postgres://admin:s3cret-pw@db.internal/prod"),
}


@pytest.mark.parametrize("case", sorted(SECRETS))
async def test_secrets_are_not_remembered(case: str, workspace: Path, tmp_path: Path) -> None:
    async with serving(agent_settings(workspace, tmp_path / "data")) as (live, stub):
        session_id = await a_session(live)
        refused = await failure(
            stub.StoreMemory(later.StoreMemoryRequest(session_id=session_id, memory=SECRETS[case]))
        )
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = refused.details() or ""
        assert "looks like it holds a secret" in details and details.startswith("memory.")
        for secret in ("sk-proj", "AKIA", "hunter2", "ghp_", "abcdefghijklmnop", "s3cret"):
            assert secret not in details
        assert await stats(stub, session_id) == (0, 0, 0)


BAD: list[tuple[str, Callable[[Stub, str], Any], str]] = [
    ("no memory", lambda s, sid: s.StoreMemory(later.StoreMemoryRequest(session_id=sid)), "memory is required"),
    ("empty", lambda s, sid: s.StoreMemory(later.StoreMemoryRequest(session_id=sid, memory=later.MemoryItem(content="  "))), "memory.content is empty"),
    ("long", lambda s, sid: s.StoreMemory(later.StoreMemoryRequest(session_id=sid, memory=later.MemoryItem(content="x" * 8001))), "memory.content has 8001 characters"),
    ("nul", lambda s, sid: s.StoreMemory(later.StoreMemoryRequest(session_id=sid, memory=later.MemoryItem(content="a\x00b"))), "memory.content holds a control character"),
    ("importance", lambda s, sid: s.StoreMemory(later.StoreMemoryRequest(session_id=sid, memory=later.MemoryItem(content="a", importance=1.5))), "memory.importance must be between 0 and 1"),
    ("type", lambda s, sid: s.StoreMemory(later.StoreMemoryRequest(session_id=sid, memory=later.MemoryItem(content="a", memory_type=9))), "memory.memory_type 9 is not a MemoryType"),  # type: ignore[arg-type]
    ("tags", lambda s, sid: s.StoreMemory(later.StoreMemoryRequest(session_id=sid, memory=later.MemoryItem(content="a", tags=[str(n) for n in range(21)]))), "memory.tags has 21 tags"),
    ("tag", lambda s, sid: s.StoreMemory(later.StoreMemoryRequest(session_id=sid, memory=later.MemoryItem(content="a", tags=["ok", ""]))), "memory.tags[1] must have 1 to 64 characters"),
    ("future", lambda s, sid: s.StoreMemory(later.StoreMemoryRequest(session_id=sid, memory=later.MemoryItem(content="a", timestamp=2**60))), "memory.timestamp"),
    ("limit", lambda s, sid: s.SearchMemories(later.SearchMemoriesRequest(session_id=sid, limit=101)), "limit is 101; at most 100"),
    ("min_importance", lambda s, sid: s.SearchMemories(later.SearchMemoriesRequest(session_id=sid, min_importance=-1)), "min_importance must be between 0 and 1"),
    ("query", lambda s, sid: s.SearchMemories(later.SearchMemoriesRequest(session_id=sid, query="q" * 9000)), "query has 9000 characters"),
    ("clear nothing", lambda s, sid: s.ClearMemories(later.ClearMemoriesRequest(session_id=sid)), "set clear_long_term, clear_short_term or clear_working"),
    ("no id", lambda s, sid: s.RetrieveMemory(later.RetrieveMemoryRequest(session_id=sid)), "memory_id is required"),
    ("bad id", lambda s, sid: s.DeleteMemory(later.DeleteMemoryRequest(session_id=sid, memory_id="x" * 200)), "memory_id is not a memory id"),
    ("summary limit", lambda s, sid: s.SummarizeMemories(later.SummarizeMemoriesRequest(session_id=sid, limit=500)), "limit is 500"),
    ("no session", lambda s, sid: s.GetMemoryStats(later.GetMemoryStatsRequest()), "session_id is required"),
]  # fmt: skip


async def test_bad_input_is_named(workspace: Path, tmp_path: Path, fake: FakeLLM) -> None:
    async with serving(agent_settings(workspace, tmp_path / "data"), fake) as (live, stub):
        session_id = await a_session(live)
        for name, call, said in BAD:
            refused = await failure(call(stub, session_id))
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert said in (refused.details() or ""), (name, refused.details())
        for call in (
            stub.StoreMemory(
                later.StoreMemoryRequest(session_id="nope", memory=later.MemoryItem(content="a"))
            ),
            stub.SearchMemories(later.SearchMemoriesRequest(session_id="nope")),
            stub.GetMemoryStats(later.GetMemoryStatsRequest(session_id="nope")),
            stub.RetrieveMemory(later.RetrieveMemoryRequest(session_id="nope", memory_id="mem_1")),
            stub.SummarizeMemories(later.SummarizeMemoriesRequest(session_id="nope")),
        ):
            unknown = await failure(call)
            assert unknown.code() == grpc.StatusCode.NOT_FOUND and "session 'nope' not found" in (
                unknown.details() or ""
            )
        undecodable = await failure(
            live.channel.unary_unary("/a3s.code.agent.v1.CodeAgentService/StoreMemory")(b"\xff\xff")
        )
        assert undecodable.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert await stats(stub, session_id) == (0, 0, 0)
        assert not fake.requests  # nothing reached the model


async def test_capabilities_list_memory(workspace: Path, tmp_path: Path) -> None:
    async with serving(agent_settings(workspace, tmp_path / "data")) as (live, _):
        features = (await live.stub.GetCapabilities(pb.GetCapabilitiesRequest())).features
        assert "memory" in features
