"""The operator's model prices (--model-prices, A3S_MODEL_PRICES): US dollars per million input
and output tokens, per model name, for cost summaries. A JSON file read once at start:

    {"gpt-4o": {"input_per_mtok": 2.5, "output_per_mtok": 10.0}}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidArgument
from .jsontext import parse_json

MAX_FILE_BYTES = 1_000_000
FIELDS = ("input_per_mtok", "output_per_mtok")


@dataclass(frozen=True)
class ModelPrice:
    input_per_mtok: float
    output_per_mtok: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok) / 1e6


def load_prices(path: Path) -> dict[str, ModelPrice]:
    """The file's prices; ValueError saying what is wrong with it."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    try:
        table = parse_json(text, str(path))
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(table, dict):
        raise ValueError(f"{path}: must be a JSON object of model name -> prices")
    return {model: _price(path, model, entry) for model, entry in table.items()}


def _price(path: Path, model: str, entry: object) -> ModelPrice:
    where = f"{path}: model {model!r}"
    if not isinstance(entry, dict) or set(entry) != set(FIELDS):
        raise ValueError(f"{where}: must be an object with exactly {' and '.join(FIELDS)}")
    for name in FIELDS:
        value = entry[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: {name} must be a number, not {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}: {name} must be a finite number of 0 or more, not {value!r}")
    return ModelPrice(float(entry["input_per_mtok"]), float(entry["output_per_mtok"]))
