"""Request bodies go out as compact JSON, the same bytes whether encoded at once or in pieces."""

from __future__ import annotations

import json

from a3s_agent.llm.json_body import BIG_BODY_CHARS, encoded


async def test_small_and_big_bodies_are_compact_and_equal_to_one_dumps() -> None:
    small = {"model": "m", "messages": [{"role": "user", "content": "hi, there: a"}], "n": [1, 2.5, None]}
    big = {**small, "messages": [{"role": "user", "content": 'é"\\' + "x" * BIG_BODY_CHARS}]}
    for body in (small, big):
        sent = await encoded(body)
        assert sent == json.dumps(body, separators=(",", ":")).encode()
        assert json.loads(sent) == body
    assert await encoded({"a": {"b": [1, 2]}, "c": "d"}) == b'{"a":{"b":[1,2]},"c":"d"}'
