"""A group's RPC handlers by name (later.py gathers them): each takes a request's plain form
(codec.py) and answers its reply's, through one call into the application layer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from ...app import Application
from .convert import Given, Plain

Handler = Callable[[Application, Given], Awaitable[Plain]]
Started = Callable[[], None]
"""Called once a stream has started (methods.py says when; only the first call counts)."""
StreamHandler = Callable[[Application, Given, Started], AsyncIterator[Plain]]


class Handlers(dict[str, Handler | StreamHandler]):
    """Filled by `rpc` and `streams`: `@HANDLERS.rpc("GetTodos")` over the handler of GetTodos,
    `@HANDLERS.streams("StreamDelegate")` over a server-streaming RPC's (its replies' plain forms)."""

    def rpc(self, name: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self[name] = handler
            return handler

        return register

    def streams(self, name: str) -> Callable[[StreamHandler], StreamHandler]:
        def register(handler: StreamHandler) -> StreamHandler:
            self[name] = handler
            return handler

        return register
