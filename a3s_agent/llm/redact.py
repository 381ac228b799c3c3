"""Keeping the API key out of what a provider says back: its error bodies may quote the key (a 401
that repeats a wrong key, a proxy echoing headers), and those messages reach clients, logs and the store."""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

REDACTED = "[redacted]"
_WINDOW = 8
"""A word sharing this many consecutive characters with a secret is taken for (part of) the secret."""
_WORD = re.compile(r"[\w\-.~+/=*]{" + str(_WINDOW) + ",}")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+\S+")


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` without the secrets, nor any word that shares eight characters with one (providers
    often show a key's first and last characters), nor any bearer or basic credentials."""
    secrets = [secret for secret in secrets if len(secret) >= _WINDOW]
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    if not secrets:
        return text
    for secret in secrets:
        text = text.replace(secret, REDACTED)

    def hide(match: re.Match[str]) -> str:
        word = match.group(0)
        windows = {word[i : i + _WINDOW] for i in range(len(word) - _WINDOW + 1)}
        return REDACTED if any(window in secret for secret in secrets for window in windows) else word

    return _WORD.sub(hide, text)


def shown_url(url: str) -> str:
    """A URL as it may be shown: without user:password and without the query (some gateways take
    the key as a query parameter)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def url_secrets(url: str) -> list[str]:
    """The credentials a URL carries: its password and its query values."""
    parts = urlsplit(url)
    found = [parts.password] if parts.password else []
    found += [value for pair in parts.query.split("&") for value in pair.split("=", 1)[1:] if value]
    return found
