"""A group's RPC handlers by name (later.py gathers them): each takes a request's plain form
(codec.py) and answers its reply's, through one call into the application layer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ...app import Application
from .convert import Given, Plain

Handler = Callable[[Application, Given], Awaitable[Plain]]


class Handlers(dict[str, Handler]):
    """Filled by `rpc`: `@HANDLERS.rpc("GetTodos")` over the handler of GetTodos."""

    def rpc(self, name: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self[name] = handler
            return handler

        return register
