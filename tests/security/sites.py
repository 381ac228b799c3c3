"""A real HTTP(S) site for the fetch and proxy tests: what reaches it, and under which TLS name."""

from __future__ import annotations

import ssl

from aiohttp import web


class Site:
    """A real HTTP(S) server on one address, recording each request (`path`, `path_qs` and its
    headers by lower-case name; `host` "" when it sent none) and each TLS server name. It answers
    `body`, or without one "<method> <path?query> <request body>"."""

    def __init__(self, body: str | None = None) -> None:
        self.body = body
        self.requests: list[dict[str, str]] = []
        self.server_names: list[str | None] = []
        self.runner: web.AppRunner | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None) -> int:
        async def anything(request: web.Request) -> web.Response:
            received = await request.text()
            headers = {name.lower(): value for name, value in request.headers.items()}
            self.requests.append({"path": request.path, "path_qs": request.path_qs, "host": "", **headers})
            answer = self.body if self.body is not None else f"{request.method} {request.path_qs} {received}"
            return web.Response(text=answer)

        if tls is not None:
            tls.sni_callback = lambda sock, name, context: self.server_names.append(name)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", anything)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, host, port, ssl_context=tls).start()
        return int(self.runner.addresses[0][1])

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
