"""Request bodies go out as compact JSON, the same bytes whether encoded at once or in pieces."""

from __future__ import annotations

import json

from a3s_agent.llm.json_body import BIG_BODY_CHARS, encoded, fixed_json, is_big


async def test_small_and_big_bodies_are_compact_and_equal_to_one_dumps() -> None:
    small = {"model": "m", "messages": [{"role": "user", "content": "hi, there: a"}], "n": [1, 2.5, None]}
    big = {**small, "messages": [{"role": "user", "content": 'é"\\' + "x" * BIG_BODY_CHARS}]}
    for body in (small, big):
        sent = await encoded(body)
        assert sent == json.dumps(body, separators=(",", ":")).encode()
        assert json.loads(sent) == body
    assert await encoded({"a": {"b": [1, 2]}, "c": "d"}) == b'{"a":{"b":[1,2]},"c":"d"}'


async def test_fixed_values_are_spliced_as_the_same_bytes_and_follow_their_items() -> None:
    """The tool schemas go out as JSON encoded once per list of the same schema objects; the body's
    bytes are those of one dumps of the plain list, small or big; a list of other objects (or an
    object changed since) is encoded afresh."""
    schemas = [
        {"type": "function", "function": {"name": f"t{i}", "description": "é\n" * 5}} for i in range(3)
    ]
    fixed = fixed_json(list(schemas))
    assert fixed_json(list(schemas)) is fixed  # a new list of the same objects
    for content in ("hi", "x" * BIG_BODY_CHARS):
        plain = {"model": "m", "messages": [{"role": "user", "content": content}], "tools": schemas, "n": 1}
        sent = await encoded({**plain, "tools": fixed})
        assert sent == json.dumps(plain, separators=(",", ":")).encode()
    assert is_big({"tools": fixed_json([{"description": "d" * BIG_BODY_CHARS}])})
    others = [dict(schema) for schema in schemas]
    others[0]["function"] = {"name": "renamed"}
    assert json.loads(fixed_json(others).text)[0]["function"] == {"name": "renamed"}
