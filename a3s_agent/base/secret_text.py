"""Text that looks like it holds a secret: the shapes of well-known keys and tokens, credentials in
a URL or an Authorization value, a value given to a variable named like a secret (the names
base/secrets.py withholds: *_API_KEY, *_TOKEN, *_SECRET, *_PASSWORD...), and the server's own
withheld secrets. What is kept for later and shown to other sessions (memories) is checked here.

A check, not a proof: it errs towards refusing a few harmless texts ("password: correcthorse")
rather than keeping a key."""

from __future__ import annotations

import re

from .secrets import is_secret_name, withheld_values

REDACTED = "[redacted]"

_SHAPES: list[tuple[str, re.Pattern[str]]] = [
    ("a private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("an AWS access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})")),
    ("an API key (sk-...)", re.compile(r"\bsk-[A-Za-z0-9_\-]{20,}")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}")),
    ("a JSON Web Token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("a bearer token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{16,}")),
    ("a URL with a password", re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@]+:[^\s/@]+@", re.IGNORECASE)),
]
_ASSIGNED = re.compile(r"\b([A-Za-z_][A-Za-z0-9_-]*)[\"']?\s*(?::|=|=>)\s*[\"']?([^\s\"',;]{8,})")
"""`NAME=value`, `name: value`, `"name": "value"`: a secret when NAME is named like one."""


def secret_kind(text: str) -> str | None:
    """What kind of secret `text` seems to hold (for a message that does not repeat it), or None."""
    for kind, shape in _SHAPES:
        if shape.search(text):
            return kind
    for match in _ASSIGNED.finditer(text):
        if is_secret_name(match.group(1).replace("-", "_")):
            return f"a value given to {match.group(1)[:40]}"
    if any(value in text for value in withheld_values()):
        return "one of the server's own secrets"
    return None


def redact_secrets(text: str) -> str:
    """`text` with every secret `secret_kind` would find replaced by REDACTED."""
    for _, shape in _SHAPES:
        text = shape.sub(REDACTED, text)
    text = _ASSIGNED.sub(
        lambda m: (
            m.group(0).replace(m.group(2), REDACTED)
            if is_secret_name(m.group(1).replace("-", "_"))
            else m.group(0)
        ),
        text,
    )
    for value in withheld_values():
        text = text.replace(value, REDACTED)
    return text
