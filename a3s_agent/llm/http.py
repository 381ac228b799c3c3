"""What the HTTP providers (openai_compat.py, anthropic_provider.py) share: one endpoint's connection
pool and proxy, how a failed request is told apart (worth another try or not), and the retries.

- `Endpoint`: the URL, shown without credentials; the proxy HTTPS_PROXY / HTTP_PROXY name for it
  (NO_PROXY respected, base/proxies.py); the secrets every message is redacted of (the key, the
  URL's credentials, the proxy's password); an aiohttp pool (aiohttp is imported on first use: its
  import costs the server's start-up a quarter second). `post` maps what the transport raises:
  timeouts and unreachable servers are `Retryable`, a reply cut off is Unavailable, a proxy's 407
  is FailedPrecondition (no retry helps) and the proxy's other refusals are `Retryable`, each
  named without the proxy's credentials (aiohttp's own message shows them).
- `http_failure`: an HTTP error status as the error clients get; 408, 409, 429 and 5xx are retried
  (unless the server says `x-should-retry: false`), honouring `retry-after-ms` / `retry-after`
  (seconds or an HTTP date) up to a minute.
- `retrying`: one request's body encoded (json_body.py), then its attempts, with exponential backoff
  (base/backoff.py: 0.5 s doubling up to 8 s, 75-100%, the OpenAI client's conventions); once
  part of a reply has reached the caller a retry would repeat it, so the failure is final. Every
  error's message is redacted of the endpoint's secrets there (llm/redact.py).
"""

from __future__ import annotations

import asyncio
import email.utils
import io
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any

from ..base.backoff import Backoff
from ..base.errors import AgentError, FailedPrecondition, InvalidArgument, Unavailable
from ..base.proxies import proxy_for
from .json_body import BIG_BODY_CHARS, encoded
from .provider import ProviderEvent
from .provider_errors import error_message, is_context_overflow, overflow
from .redact import redact, shown_url, url_secrets

if TYPE_CHECKING:
    import aiohttp

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_RETRIES = 3
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 60.0
MAX_ERROR_BODY_BYTES = 64 * 1024
"""What is read of an error reply's body (its message is near the start); the rest is left unread."""
MAX_WHOLE_REPLY_BYTES = 128 << 20
"""The longest whole (not streamed) JSON reply taken from a model's server, as sse.py bounds an event."""
_DRAIN_S = 0.05
_DRAIN_BYTES = 64 * 1024
_RETRY_INITIAL_S, _RETRY_MAX_S, _RETRY_JITTER = 0.5, 8.0, 0.25


class Retryable(Exception):
    """A failure worth another try; `delay_s` is what the server asked for, if anything."""

    def __init__(self, message: str, delay_s: float | None = None) -> None:
        super().__init__(message)
        self.delay_s = delay_s

    def delay(self, backoff_s: float) -> float:
        """The delay the server asked for, when sensible, else our own backoff."""
        asked = self.delay_s
        return asked if asked is not None and 0 < asked <= MAX_RETRY_AFTER_S else backoff_s


class Endpoint:
    """One URL, its proxy and connection pool; `headers` go with every request."""

    def __init__(self, url: str, api_key: str, headers: Mapping[str, str], timeout_s: float) -> None:
        self.url = url
        self.shown = shown_url(url)
        self.proxy = proxy_for(url)
        self.secrets = [api_key, *url_secrets(url), self.proxy.password if self.proxy else ""]
        """What every message from this endpoint is redacted of (llm/redact.py)."""
        self.timeout_s = timeout_s
        self._headers = dict(headers)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            # No total limit (a long answer may stream for minutes), but silence is bounded.
            timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout_s, sock_read=self.timeout_s)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @asynccontextmanager
    async def post(
        self, body: bytes, extra_headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The response to `body` (with `extra_headers` besides the endpoint's: a trace's context);
        what the transport raises, while posting or while the caller reads the reply, comes out as
        the module's docstring says."""
        import aiohttp

        # A big body goes as a file-like object, written a chunk at a time between other work.
        data = io.BytesIO(body) if len(body) > BIG_BODY_CHARS else body
        try:
            async with self._client().post(
                self.url,
                data=data,
                headers={**self._headers, **extra_headers} if extra_headers else self._headers,
                proxy=self.proxy.url if self.proxy else None,
            ) as response:
                if response.status == 407 and self.proxy:  # an http:// URL's proxy answers in its place
                    raise self._proxy_refusal(407, response.reason or "")
                yield response
        except TimeoutError as exc:
            raise Retryable(f"the LLM provider at {self.shown} timed out after {self.timeout_s:g} s") from exc
        except aiohttp.ClientPayloadError as exc:
            raise Unavailable(f"the LLM provider's reply broke off: {exc}") from exc
        except aiohttp.ClientHttpProxyError as exc:  # no tunnel to an https:// URL; its text has the proxy
            raise self._proxy_refusal(exc.status, exc.message) from exc  # URL, credentials and all
        except aiohttp.ClientError as exc:
            via = f" through {self.proxy.named}" if self.proxy else ""
            raise Retryable(f"cannot reach the LLM provider at {self.shown}{via}: {exc}") from exc

    def _proxy_refusal(self, status: int, reason: str) -> Exception:
        assert self.proxy is not None
        said = self.proxy.refusal(status, reason)
        return FailedPrecondition(said) if status == 407 else Retryable(f"{said} to {self.shown}")


async def drain(content: aiohttp.StreamReader) -> None:
    """Read what follows the end of a streamed reply (normally just the end of the chunked body),
    so that its connection goes back to the pool instead of being closed; at most _DRAIN_BYTES
    in _DRAIN_S."""
    read = 0
    with suppress(Exception):  # whatever comes (or breaks) now, the reply is complete
        async with asyncio.timeout(_DRAIN_S):
            while not content.at_eof() and read < _DRAIN_BYTES:
                read += len(await content.readany())


async def error_text(response: aiohttp.ClientResponse) -> str:
    """An error reply's body as text, its first MAX_ERROR_BODY_BYTES at most (a hostile or broken
    server may send no end)."""
    body = await _read_at_most(response.content, MAX_ERROR_BODY_BYTES)
    return body.decode(response.charset or "utf-8", errors="replace")


async def whole_body(response: aiohttp.ClientResponse) -> bytes:
    """A reply's whole body; Unavailable when it is longer than MAX_WHOLE_REPLY_BYTES."""
    body = await _read_at_most(response.content, MAX_WHOLE_REPLY_BYTES + 1)
    if len(body) > MAX_WHOLE_REPLY_BYTES:
        raise Unavailable(
            f"the LLM provider sent a reply of more than {MAX_WHOLE_REPLY_BYTES >> 20} MiB; gave up reading it"
        )
    return body


async def _read_at_most(content: aiohttp.StreamReader, limit: int) -> bytes:
    body = bytearray()
    while len(body) < limit and (chunk := await content.read(limit - len(body))):
        body += chunk
    return bytes(body)


def http_failure(
    response: aiohttp.ClientResponse, text: str, url: str, retry_statuses: frozenset[int] = RETRY_STATUSES
) -> Exception:
    """The error for an HTTP error status whose body is `text`."""
    message = error_message(text) or response.reason or "no message"
    status = response.status
    if is_context_overflow(text):
        return overflow(f"HTTP {status}", message)
    if status == 401:
        return FailedPrecondition(f"the LLM provider at {url} rejected the API key (HTTP 401): {message}")
    if status == 403:
        return FailedPrecondition(f"the LLM provider refused access (HTTP 403): {message}")
    if status in retry_statuses and response.headers.get("x-should-retry") != "false":
        return Retryable(f"the LLM provider failed (HTTP {status}): {message}", retry_after(response.headers))
    if status < 500:
        return InvalidArgument(f"the LLM provider refused the request (HTTP {status}): {message}")
    return Unavailable(f"the LLM provider failed (HTTP {status}): {message}")


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds a server asked to wait: `retry-after-ms` (OpenAI), else `retry-after`, in
    seconds or as an HTTP date; None when it asked nothing readable."""
    milliseconds = _number(headers.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds / 1000
    value = headers.get("retry-after", "")
    seconds = _number(value)
    if seconds is not None or not value:
        return seconds
    try:
        return email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        return None


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


async def retrying(
    body: dict[str, Any],
    attempt: Callable[[bytes], AsyncIterator[ProviderEvent]],
    *,
    retries: int,
    secrets: list[str],
) -> AsyncIterator[ProviderEvent]:
    """The events of the first `attempt` with `body` (as JSON) that does not fail `Retryable`,
    after up to `retries` more tries; Unavailable when none succeeds or one fails after yielding.
    Every failure's message is redacted of `secrets` on its way to clients, logs and the store."""
    try:
        data = await encoded(body)
        backoff = Backoff(_RETRY_INITIAL_S, _RETRY_MAX_S, jitter=_RETRY_JITTER)
        for tried in range(1, retries + 2):
            started = False
            try:
                async for event in attempt(data):
                    started = True
                    yield event
                return
            except Retryable as exc:
                if started or tried > retries:
                    raise Unavailable(f"{exc} (after {tried} attempts)") from exc
                await asyncio.sleep(exc.delay(backoff.next_s()))
    except AgentError as exc:
        exc.args = (redact(str(exc), secrets),)
        raise
