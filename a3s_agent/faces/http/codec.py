"""The HTTP face's wire format without protobuf: the proto3 JSON mapping of CodeAgentService's
messages, read from a table: schema.py's (the Box-era proto: `decode`, `encode`) or
later_schema.py's (the RPCs only the later dialect has: `LATER`).

`decode` accepts exactly what json_format.ParseDict accepts (and refuses what it refuses, with a
message naming the field); `encode` writes exactly what json_format.MessageToDict writes with
`preserving_proto_field_name=True, always_print_fields_with_no_presence=True`, field order included
(a map's entries come in the plain form's order; protobuf's is its hash table's, no order a client
can rely on). tests/test_http_codec.py holds both to json_format.

Between them is a message's *plain form*: a dict with every field by its proto name; scalars as
int, float, bool, str, bytes; enums as int (`encode` takes a value's name too); repeated fields as
lists, maps as dicts; a singular message as its plain form; None for an absent message or
`optional`/oneof field. A float field holds what a float32 holds, as it would in protobuf.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import later_schema, schema

MAX_DEPTH = 100
"""Messages nested deeper than this are refused (json_format's max_recursion_depth)."""

_FLOAT_MAX = float.fromhex("0x1.fffffep+127")
_LONE_SURROGATE = re.compile("[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")
_RANGES = {
    **dict.fromkeys(["int32", "sint32", "sfixed32", "enum"], (-(2**31), 2**31 - 1)),
    **dict.fromkeys(["uint32", "fixed32"], (0, 2**32 - 1)),
    **dict.fromkeys(["int64", "sint64", "sfixed64"], (-(2**63), 2**63 - 1)),
    **dict.fromkeys(["uint64", "fixed64"], (0, 2**64 - 1)),
}
_QUOTED = {"int64", "sint64", "sfixed64", "uint64", "fixed64"}


class CodecError(ValueError):
    """A JSON value that is not the message it should be; the message names the field."""


class _Bad(Exception):
    """A value a scalar converter refuses; the walk adds where it is."""


def _kind_of(value: object) -> str:
    kinds = {type(None): "null", bool: "a boolean", dict: "an object", list: "an array", str: "a string"}
    return kinds.get(type(value), "a number")


def _show(value: object) -> str:
    if value is None or isinstance(value, (dict, list)):
        return _kind_of(value)
    text = json.dumps(value)
    return text if len(text) <= 60 else f"{text[:50]}... ({len(text)} characters)"


def _integer(kind: str) -> Callable[[Any], int]:
    low, high = _RANGES[kind]

    def convert(value: Any) -> int:  # json_format's _ConvertInteger, then protobuf's range check
        if (
            isinstance(value, bool)
            or (isinstance(value, float) and not value.is_integer())
            or (isinstance(value, str) and " " in value)
        ):
            raise _Bad(f"not an integer: {_show(value)}")
        try:
            number = int(value)
        except ValueError:  # a string such as "1e3" or "2.0": a float that is whole will do
            try:
                whole = float(value)
            except ValueError:
                whole = math.nan
            if not whole.is_integer():
                raise _Bad(f"not an integer: {_show(value)}") from None
            number = int(whole)
        except TypeError:
            raise _Bad(f"not an integer: {_show(value)}") from None
        if not low <= number <= high:
            raise _Bad(f"out of range for {kind}: {number}")
        return number

    return convert


def _single(number: float) -> float:
    """`number` as a float32 holds it, as protobuf stores a float field."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", number))[0])
    except OverflowError:
        return math.copysign(math.inf, number)


def _floating(single: bool) -> Callable[[Any], float]:
    def convert(value: Any) -> float:  # json_format's _ConvertFloat
        if isinstance(value, float) and not math.isfinite(value):
            raise _Bad('NaN and infinities are strings: "NaN", "Infinity", "-Infinity"')
        if single and isinstance(value, float) and abs(value) > _FLOAT_MAX:
            raise _Bad(f"out of range for float: {value}")
        if value == "nan":
            raise _Bad('not a number: "nan" (NaN is "NaN")')
        try:
            number = float(value)  # also true/false, "Infinity", "NaN", " 1.5 "
        except (ValueError, TypeError, OverflowError):
            raise _Bad(f"not a number: {_show(value)}") from None
        return _single(number) if single else number

    return convert


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"not true or false: {_show(value)}")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _Bad(f"not a string: {_show(value)}")
    if _LONE_SURROGATE.search(value):
        raise _Bad("the string holds a lone surrogate")
    return value


def _bytes(value: Any) -> bytes:
    """Base64, standard or URL-safe, padding optional; other characters are skipped, as json_format does."""
    if not isinstance(value, str):
        raise _Bad(f"not a base64 string: {_show(value)}")
    try:
        encoded = value.encode()
        return base64.urlsafe_b64decode(encoded + b"=" * (4 - len(encoded) % 4))
    except ValueError as exc:
        raise _Bad(f"not base64: {exc}") from None


def _enum(name: str, values: Mapping[str, int]) -> Callable[[Any], int]:
    in_range = _integer("enum")

    def convert(value: Any) -> int:  # a name, or any number (proto3 enums are open), even as a string
        try:
            number = values.get(value)
            return number if number is not None else in_range(int(value))
        except (ValueError, TypeError, OverflowError):
            raise _Bad(f"not a value of {name}: {_show(value)}") from None

    return convert


def _bool_key(key: Any) -> bool:
    if key not in ("true", "false"):
        raise _Bad(f'not "true" or "false": {_show(key)}')
    return key == "true"


def _key_text(key: Any) -> str:
    return ("true" if key else "false") if isinstance(key, bool) else str(key)


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _shortest(value: float) -> float:
    """The shortest decimal that is the float32 `value` (json_format's ToShortestFloat)."""
    precision = 6
    rounded = float(f"{value:.{precision}g}")
    while _single(rounded) != value:
        precision += 1
        rounded = float(f"{value:.{precision}g}")
    return rounded


def _double_json(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    return ("Infinity" if value > 0 else "-Infinity") if math.isinf(value) else float(value)


def _float_json(value: float) -> float | str:
    value = _single(value)
    return _double_json(value) if not math.isfinite(value) else _shortest(value)


_SCALARS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any], Any]] = {
    **{kind: (_integer(kind), int, 0) for kind in _RANGES if kind not in _QUOTED},
    **{kind: (_integer(kind), lambda value: str(int(value)), 0) for kind in _QUOTED},
    "float": (_floating(True), _float_json, 0.0),
    "double": (_floating(False), _double_json, 0.0),
    "bool": (_boolean, bool, False),
    "string": (_string, str, ""),
    "bytes": (_bytes, _b64, b""),
}
"""kind: (read from JSON, write to JSON, default)."""


@dataclass(frozen=True, slots=True)
class _Spec:
    """A field with what reading and writing it needs, worked out once."""

    field: schema.Field
    read: Callable[[Any], Any]
    """A scalar (a map's value) from JSON; unused for a message."""
    write: Callable[[Any], Any]
    """A scalar, enum or message (a map's value) to JSON."""
    read_key: Callable[[str], Any]
    default: Any

    def blank(self) -> Any:
        """The plain form of the field when it is not in the JSON (or null)."""
        field = self.field
        return {} if field.map_key else [] if field.repeated else None if field.presence else self.default

    def is_set(self, value: Any) -> bool:
        """Whether protobuf holds the field as set: present, or not the default (-0.0 is set)."""
        field = self.field
        if field.presence or field.map_key or field.repeated:
            return field.presence or bool(value)
        if field.kind in ("float", "double"):
            value = _single(value) if field.kind == "float" else value
            return value != 0 or math.copysign(1.0, value) < 0
        return bool(value)

    def to_json(self, value: Any) -> Any:
        if self.field.map_key:
            return {_key_text(key): self.write(one) for key, one in value.items()}
        return [self.write(one) for one in value] if self.field.repeated else self.write(value)


@dataclass(frozen=True, slots=True)
class _Layout:
    fields: tuple[_Spec, ...]
    """In declaration order."""
    by_number: tuple[_Spec, ...]
    by_key: dict[str, _Spec]
    """By JSON name and by proto name."""


class Codec:
    """decode and encode for the messages and enums of one schema (schema.py's: the module's own)."""

    def __init__(
        self, messages: Mapping[str, tuple[schema.Field, ...]], enums: Mapping[str, Mapping[str, int]]
    ) -> None:
        self._enums = enums
        self._layouts: dict[str, _Layout] = {}
        for message, fields in messages.items():
            specs = tuple(self._spec(field) for field in fields)
            by_key = {spec.field.name: spec for spec in specs}
            by_key.update((spec.field.json_name, spec) for spec in specs)  # json_format looks these up first
            by_number = tuple(sorted(specs, key=lambda spec: spec.field.number))
            self._layouts[message] = _Layout(specs, by_number, by_key)

    def _spec(self, field: schema.Field) -> _Spec:
        read_key: Callable[[Any], Any] = _unused
        if field.map_key:
            read_key = _bool_key if field.map_key == "bool" else _SCALARS[field.map_key][0]
        if field.kind == "message":
            return _Spec(field, _unused, lambda value: self.encode(field.type, value), read_key, None)
        if field.kind == "enum":
            values = self._enums[field.type]
            names = {number: name for name, number in values.items()}

            def write(value: Any) -> Any:
                if isinstance(value, str) and value in values:  # a value's name, as protobuf takes it
                    return value
                return names.get(value, int(value))  # a number it does not name as itself

            return _Spec(field, _enum(field.type, values), write, read_key, 0)
        return _Spec(field, *_SCALARS[field.kind][:2], read_key, _SCALARS[field.kind][2])

    def _blank(self, message: str) -> dict[str, Any]:
        return {spec.field.name: spec.blank() for spec in self._layouts[message].fields}

    def decode(self, message: str, value: object) -> dict[str, Any]:
        """The plain form of the JSON `value` (already parsed) as a `message`, or CodecError."""
        if not isinstance(value, dict):
            raise CodecError(f"a {message} must be a JSON object, not {_kind_of(value)}")
        try:
            return self._merge(message, value, self._blank(message), "", 1)
        except CodecError as exc:
            raise CodecError(f"invalid {message}: {exc}") from None

    def _merge(
        self, message: str, value: object, into: dict[str, Any], path: str, depth: int
    ) -> dict[str, Any]:
        """`value` read into the plain form `into` (json_format merges a message given twice)."""
        if depth > MAX_DEPTH:
            raise CodecError(f"{path}: messages nested more than {MAX_DEPTH} deep")
        if not isinstance(value, dict):
            if value == [] or value == "":  # json_format reads a non-object's items as keys: none
                return into
            raise CodecError(f"{path}: a {message} must be a JSON object, not {_kind_of(value)}")
        layout = self._layouts[message]
        oneofs: dict[str, str] = {}
        for key, item in value.items():
            here = f"{path}.{key}" if path else key
            spec = layout.by_key.get(key)
            if spec is None:
                raise CodecError(f"{here}: {message} has no such field")
            field = spec.field
            if field.oneof and item is not None and (other := oneofs.setdefault(field.oneof, key)) != key:
                if layout.by_key[other] is spec:
                    raise CodecError(f"{here}: the field is given twice, as {other} and {key}")
                raise CodecError(f"{here}: {other} is set already; {field.oneof} holds one of them")
            if item is None:
                into[field.name] = spec.blank()
            elif field.map_key:
                into[field.name] = self._map(spec, item, here, depth)
            elif field.repeated:
                if not isinstance(item, (list, tuple)):
                    raise CodecError(f"{here}: a repeated field must be a JSON array, not {_kind_of(item)}")
                into[field.name] = [
                    self._item(spec, one, f"{here}[{i}]", depth) for i, one in enumerate(item)
                ]
            elif field.kind == "message":
                sub = into[field.name] or self._blank(field.type)
                into[field.name] = self._merge(field.type, item, sub, here, depth + 1)
            else:
                into[field.name] = _read(spec, item, here)
        return into

    def _item(self, spec: _Spec, item: object, path: str, depth: int) -> Any:
        if item is None:
            raise CodecError(f"{path}: null in a repeated field")
        if spec.field.kind == "message":
            return self._merge(spec.field.type, item, self._blank(spec.field.type), path, depth + 1)
        return _read(spec, item, path)

    def _map(self, spec: _Spec, item: object, path: str, depth: int) -> dict[Any, Any]:
        if not isinstance(item, dict):
            raise CodecError(f"{path}: a map must be a JSON object, not {_kind_of(item)}")
        message = spec.field.type if spec.field.kind == "message" else ""
        result: dict[Any, Any] = {}
        for text, one in item.items():
            try:
                key = spec.read_key(text)
            except _Bad as exc:
                raise CodecError(f"{path}: the key {_show(text)}: {exc}") from None
            here = f"{path}[{_show(key)}]"
            if message:  # a key given twice ("1", "01") merges, as in json_format
                sub = result.get(key) or self._blank(message)
                result[key] = self._merge(message, one, sub, here, depth + 1)
            else:
                result[key] = _read(spec, one, here)
        return result

    def encode(self, message: str, value: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON form of the plain form `value` (a missing key is the default, or absent)."""
        layout = self._layouts[message]
        # As json_format: the fields protobuf holds as set by number, then the rest by declaration.
        out = {}
        for spec in layout.by_number:
            item = value.get(spec.field.name)
            if item is not None and spec.is_set(item):
                out[spec.field.name] = spec.to_json(item)
        for spec in layout.fields:
            if spec.field.name not in out and not spec.field.presence:
                out[spec.field.name] = spec.to_json(spec.blank())
        return out


def _read(spec: _Spec, item: object, path: str) -> Any:
    try:
        return spec.read(item)
    except _Bad as exc:
        raise CodecError(f"{path}: {exc}") from None


def _unused(value: Any) -> Any:
    raise AssertionError("a message is read by the walk, and only a map has keys")


BOX = Codec(schema.MESSAGES, schema.ENUMS)
LATER = Codec(later_schema.MESSAGES, later_schema.ENUMS)
decode = BOX.decode
encode = BOX.encode
