"""llm/http.py, what both HTTP providers share: how long a server asked to wait before a retry.
(The retries themselves run through the real server in tests/test_fake_llm.py, test_dialects.py and
test_anthropic.py; the proxy in test_proxies.py.)"""

from __future__ import annotations

import email.utils
import time

import pytest

from a3s_agent.llm.http import MAX_RETRY_AFTER_S, Retryable, retry_after


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after-ms": "250"}, 0.25),  # OpenAI's, in milliseconds, first
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "soon", "retry-after": "3"}, 3.0),  # an unreadable one does not hide the other
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_in_seconds_or_milliseconds(headers: dict[str, str], seconds: float | None) -> None:
    assert retry_after(headers) == seconds


def test_retry_after_as_an_http_date() -> None:
    asked = retry_after({"retry-after": email.utils.formatdate(time.time() + 30, usegmt=True)})
    assert asked is not None and 28 <= asked <= 30


def test_a_delay_asked_is_taken_only_when_sensible() -> None:
    assert Retryable("x", 2.0).delay(0.5) == 2.0
    for unreasonable in (None, 0.0, -5.0, MAX_RETRY_AFTER_S + 1):  # none, a date past, an hour
        assert Retryable("x", unreasonable).delay(0.5) == 0.5
