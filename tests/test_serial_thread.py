"""The stores' thread (base/serial_thread.py): calls run in order, off the event loop; errors reach
the caller; a caller that gave up before its call began skips it, one that gave up later does not
undo it; stopping runs what was queued."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref

import pytest

from a3s_agent.base.serial_thread import SerialThread


async def test_calls_run_in_order_on_their_thread_and_errors_reach_the_caller() -> None:
    worker = SerialThread("a3s-test")
    try:
        seen: list[int] = []

        def note(n: int) -> str:
            seen.append(n)
            return threading.current_thread().name

        names = await asyncio.gather(*(worker.run(note, n) for n in range(50)))
        assert seen == list(range(50))
        assert set(names) == {"a3s-test"}

        def fail() -> None:
            raise KeyError("no such row")

        with pytest.raises(KeyError, match="no such row"):
            await asyncio.wait_for(worker.run(fail), 10)  # a thread killed by the error would hang it
        assert await asyncio.wait_for(worker.run(lambda: "still serving"), 10) == "still serving"
    finally:
        worker.stop()


async def test_the_loop_turns_while_a_call_blocks() -> None:
    worker = SerialThread("a3s-test")
    try:
        release = threading.Event()
        blocked = asyncio.ensure_future(worker.run(release.wait, 10))
        ticks = 0
        for _ in range(5):
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 5 and not blocked.done()
        release.set()
        assert await blocked is True
    finally:
        worker.stop()


async def test_a_caller_that_gave_up_skips_its_call_only_if_it_had_not_begun() -> None:
    worker = SerialThread("a3s-test")
    try:
        began, release = threading.Event(), threading.Event()
        ran: list[str] = []

        def first() -> None:
            began.set()
            release.wait(10)
            ran.append("first")

        running = asyncio.ensure_future(worker.run(first))
        queued = asyncio.ensure_future(worker.run(ran.append, "queued"))
        await asyncio.to_thread(began.wait, 10)
        running.cancel()
        queued.cancel()
        release.set()
        await worker.run(ran.append, "after")
        assert ran == ["first", "after"]  # the begun call ended; the queued one never ran
        assert running.cancelled() and queued.cancelled()
    finally:
        worker.stop()


async def test_stop_runs_what_was_queued() -> None:
    worker = SerialThread("a3s-test")
    ran: list[int] = []

    def slowly(n: int) -> None:
        time.sleep(0.01)
        ran.append(n)

    pending = [asyncio.ensure_future(worker.run(slowly, n)) for n in range(3)]
    await asyncio.sleep(0)  # each caller has queued its call
    worker.stop()
    assert ran == [0, 1, 2]
    await asyncio.gather(*pending)


async def test_an_idle_thread_keeps_nothing_of_the_last_call() -> None:
    """A loaded history must not stay in memory because it was the thread's last result."""

    class Rows(list[int]):
        pass

    worker = SerialThread("a3s-test")
    try:
        rows = await worker.run(lambda: Rows(range(1000)))
        gone = weakref.ref(rows)
        del rows
        for _ in range(200):  # the thread may still be finishing the call when its caller resumes
            gc.collect()
            if gone() is None:
                break
            await asyncio.sleep(0.01)
        assert gone() is None
    finally:
        worker.stop()
