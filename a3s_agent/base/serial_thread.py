"""A thread that runs functions one after another for the event loop (each SQLite store has one).

A call costs one queue put and, when it is done, one `call_soon_threadsafe`. `run_in_executor` on
a one-worker ThreadPoolExecutor, which this replaced, also makes a concurrent Future (a lock and a
condition, taken on both threads) and chains two callbacks between the futures: for the 16 commits
of the benchmark's six-turn task that was about 1.3 ms of the server's CPU (measured in commit
2fb8a7f).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class SerialThread:
    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # A daemon: a process that exits without `stop` is not held up by a thread waiting for work.
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the thread, after every call queued before it. A caller cancelled before
        its call began skips it (as with run_in_executor); once begun, the call runs to its end."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, args, loop, done))
        return await done

    def stop(self) -> None:
        """Run the calls queued so far, then end the thread (waiting for it)."""
        self._jobs.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            _run(*job)
            del job  # nothing of a finished call (its result, its error) is kept while idle


def _run(
    fn: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop, done: asyncio.Future[Any]
) -> None:
    if done.cancelled():
        return
    try:
        result, error = fn(*args), None
    except BaseException as exc:  # the caller's to handle, whatever it is
        result, error = None, exc
    if not loop.is_closed():
        try:
            loop.call_soon_threadsafe(_settle, done, result, error)
        except RuntimeError:  # the loop closed meanwhile: nobody is waiting any more
            pass


def _settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.cancelled():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
