"""base/jsontext.model_json: a model's JSON parsed with lone surrogates replaced, the walk over the
parsed value done only when the text holds an escape that can spell one."""

from __future__ import annotations

import pytest

from a3s_agent.base.jsontext import model_json


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": "\\ud800"}', {"a": "\ufffd"}),
        ('{"a": "x\\uDFFFy"}', {"a": "x\ufffdy"}),  # upper case hex
        ('{"\\udbff": ["\\udc00 ok", 1]}', {"\ufffd": ["\ufffd ok", 1]}),  # keys and lists too
        ('{"a": "\\ud83d\\ude00"}', {"a": "\U0001f600"}),  # a pair is one character
        ('{"a": "\\u00e9\\\\ud800"}', {"a": "é\\ud800"}),  # an escaped backslash spells no surrogate
        ('{"a": "plain", "b": [1, 2.5, null]}', {"a": "plain", "b": [1, 2.5, None]}),
    ],
)
def test_lone_surrogates_become_replacement_characters(text: str, expected: object) -> None:
    assert model_json(text) == expected


def test_invalid_json_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        model_json('{"a": ')
