"""faces/http/codec.py speaks the proto3 JSON mapping as json_format does: every message of
CodeAgentService round-trips to the same JSON text; odd and bad inputs are accepted (to the same
values) or refused alike, the refusal naming the field; a synthetic proto covers what
CodeAgentService does not use (every scalar kind, real oneofs, every map key kind, recursion); the
later dialect's own RPCs' messages (later_schema.py, codec.LATER) round-trip too; and schema.py and
later_schema.py are what tools/gen_http_schema.py generates now."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import Message

from a3s_agent.faces.http import codec, later_schema, schema
from a3s_agent.faces.http.codec import Codec, CodecError
from a3s_agent.proto import code_agent_later_pb2, code_agent_pb2

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gen_http_schema", ROOT / "tools" / "gen_http_schema.py")
assert _spec and _spec.loader
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

FLAGS = {"preserving_proto_field_name": True, "always_print_fields_with_no_presence": True}
T = FieldDescriptor


@dataclass(frozen=True)
class Proto:
    """A proto file, and a codec for it."""

    file: FileDescriptor
    decode: Callable[[str, object], dict[str, Any]]
    encode: Callable[[str, Any], dict[str, Any]]

    def message(self, name: str) -> Message:
        found = self.file.pool.FindMessageTypeByName(f"{self.file.package}.{name}")
        return message_factory.GetMessageClass(found)()

    def names(self) -> list[str]:
        """Every message but map entries, by its name relative to the package."""
        found: list[str] = []

        def visit(message: Descriptor) -> None:
            if not message.GetOptions().map_entry:
                found.append(message.full_name.removeprefix(self.file.package + "."))
                for nested in message.nested_types:
                    visit(nested)

        for message in self.file.message_types_by_name.values():
            visit(message)
        return found


REAL = Proto(code_agent_pb2.DESCRIPTOR, codec.decode, codec.encode)
LATER = Proto(code_agent_later_pb2.DESCRIPTOR, codec.LATER.decode, codec.LATER.encode)


# -- a synthetic proto with everything CodeAgentService's lacks --------------------------------

SCALARS = {
    "double": T.TYPE_DOUBLE,
    "float": T.TYPE_FLOAT,
    "int64": T.TYPE_INT64,
    "uint64": T.TYPE_UINT64,
    "int32": T.TYPE_INT32,
    "fixed64": T.TYPE_FIXED64,
    "fixed32": T.TYPE_FIXED32,
    "bool": T.TYPE_BOOL,
    "string": T.TYPE_STRING,
    "bytes": T.TYPE_BYTES,
    "uint32": T.TYPE_UINT32,
    "sfixed32": T.TYPE_SFIXED32,
    "sfixed64": T.TYPE_SFIXED64,
    "sint32": T.TYPE_SINT32,
    "sint64": T.TYPE_SINT64,
}
MAPS = {  # key kind: value kind, for the maps of All
    "int32": "All",
    "int64": "Color",
    "uint32": "bytes",
    "uint64": "double",
    "sint32": "float",
    "sint64": "int64",
    "fixed32": "string",
    "fixed64": "bool",
    "sfixed32": "uint64",
    "sfixed64": "sint32",
    "bool": "string",
    "string": "float",
}


def _synthetic() -> Proto:
    """codec.test.All: each scalar kind plain, repeated and optional; enums (one with a negative
    value); a real oneof; a map for each key kind; itself, nested."""
    file = descriptor_pb2.FileDescriptorProto(name="codec_test.proto", package="codec.test", syntax="proto3")
    file.enum_type.add(name="Color").value.extend(
        [
            descriptor_pb2.EnumValueDescriptorProto(name="COLOR_UNKNOWN", number=0),
            descriptor_pb2.EnumValueDescriptorProto(name="COLOR_RED", number=1),
            descriptor_pb2.EnumValueDescriptorProto(name="COLOR_BLUE", number=-2),
        ]
    )
    every = file.message_type.add(name="All")
    every.oneof_decl.add(name="choice")
    numbers = iter(range(1, 1000))

    def add(
        name: str, kind: str, repeated: bool = False, optional: bool = False, oneof: bool = False
    ) -> None:
        label = T.LABEL_REPEATED if repeated else T.LABEL_OPTIONAL
        field = every.field.add(name=name, number=next(numbers), label=label)
        if kind in SCALARS:
            field.type = SCALARS[kind]
        else:
            field.type = T.TYPE_ENUM if kind == "Color" else T.TYPE_MESSAGE
            field.type_name = f".codec.test.{kind}"
        if oneof:
            field.oneof_index = 0
        if optional:
            field.proto3_optional = True
            field.oneof_index = len(every.oneof_decl)
            every.oneof_decl.add(name=f"_{name}")

    for kind in [*SCALARS, "Color"]:
        add(f"s_{kind}", kind)
        add(f"r_{kind}", kind, repeated=True)
        add(f"o_{kind}", kind, optional=True)
    add("child", "All")
    add("other_child", "All")
    add("children", "All", repeated=True)
    add("choice_text", "string", oneof=True)
    add("choice_all", "All", oneof=True)
    add("choice_color", "Color", oneof=True)
    for key, value in MAPS.items():
        entry = every.nested_type.add(name=f"By{key.capitalize()}Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=SCALARS[key], label=T.LABEL_OPTIONAL)
        entry.field.add(name="value", number=2, label=T.LABEL_OPTIONAL)
        if value in SCALARS:
            entry.field[1].type = SCALARS[value]
        else:
            entry.field[1].type = T.TYPE_ENUM if value == "Color" else T.TYPE_MESSAGE
            entry.field[1].type_name = f".codec.test.{value}"
        every.field.add(
            name=f"by_{key}",
            number=next(numbers),
            label=T.LABEL_REPEATED,
            type=T.TYPE_MESSAGE,
            type_name=f".codec.test.All.{entry.name}",
        )
    file.message_type.add(name="Empty")
    service = file.service.add(name="Test")
    service.method.add(name="Call", input_type=".codec.test.All", output_type=".codec.test.Empty")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(file.SerializeToString())
    found = pool.FindFileByName("codec_test.proto")
    table: dict[str, Any] = {}
    exec(compile(gen.schema_text(found, "Test"), "codec_test_schema", "exec"), table)
    synthetic = Codec(table["MESSAGES"], table["ENUMS"])
    return Proto(found, synthetic.decode, synthetic.encode)


SYNTHETIC = _synthetic()


# -- protobuf's side: populated messages and their plain forms ----------------------------------

VALUES: dict[int, list[Any]] = {
    T.TYPE_DOUBLE: [1e300, -0.5],
    T.TYPE_FLOAT: [0.1, -3.4e38],
    T.TYPE_INT64: [2**62 + 1, -(2**63)],
    T.TYPE_SINT64: [-(2**53) - 1, 2**63 - 1],
    T.TYPE_SFIXED64: [2**60, -1],
    T.TYPE_UINT64: [2**64 - 1, 2**53 + 1],
    T.TYPE_FIXED64: [2**64 - 2, 3],
    T.TYPE_INT32: [-(2**31), 7],
    T.TYPE_SINT32: [2**31 - 1, -7],
    T.TYPE_SFIXED32: [-5, 5],
    T.TYPE_UINT32: [2**32 - 1, 1],
    T.TYPE_FIXED32: [2**31, 9],
    T.TYPE_BOOL: [True, False],
    T.TYPE_STRING: ["héllo ✓ 日本語 🎉", 'a "quote", a \\ and a\nnewline'],
    T.TYPE_BYTES: [b"\x00\xff\xfe binary", b"?>~"],  # base64 "Pz5+": a "+" to carry
}
KEYS: dict[int, list[Any]] = {**VALUES, T.TYPE_STRING: ["k1", "ключ"]}


def _values(field: FieldDescriptor) -> list[Any]:
    """Two values for `field`: for an enum, a named one and a number it does not name; for a
    message, placeholders (populate makes messages in place)."""
    if field.type == T.TYPE_ENUM:
        return [field.enum_type.values[-1].number, 99]
    return [None, None] if field.type == T.TYPE_MESSAGE else VALUES[field.type]


def populate(message: Message, depth: int = 0) -> Message:
    """Every field set (the last member of a oneof wins), two entries in each repeated field and
    map; below the third level of nesting, messages are present but empty."""
    for field in message.DESCRIPTOR.fields:
        target = getattr(message, field.name)
        if field.message_type and field.message_type.GetOptions().map_entry:
            key, value = field.message_type.fields
            for k, v in zip(KEYS[key.type], _values(value), strict=True):
                if value.type == T.TYPE_MESSAGE:
                    fill(target[k], depth)
                else:
                    target[k] = v
        elif field.type == T.TYPE_MESSAGE and field.is_repeated:
            for _ in range(2):
                fill(target.add(), depth)
        elif field.type == T.TYPE_MESSAGE:
            fill(target, depth)
        elif field.is_repeated:
            target.extend(_values(field))
        else:
            setattr(message, field.name, _values(field)[0])
    return message


def fill(nested: Message, depth: int) -> None:
    """A nested message, populated unless too deep (a recursive message would never end)."""
    if depth < 2:
        populate(nested, depth + 1)
    else:
        nested.SetInParent()


def plain(message: Message) -> dict[str, Any]:
    """The plain form of a protobuf message, as codec.decode should give it."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type and field.message_type.GetOptions().map_entry:
            nested = field.message_type.fields_by_name["value"].type == T.TYPE_MESSAGE
            out[field.name] = {k: plain(v) if nested else v for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [plain(v) if field.type == T.TYPE_MESSAGE else v for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = plain(value) if field.type == T.TYPE_MESSAGE else value
    return out


def same(ours: Any, theirs: Any) -> bool:
    """Equal, and of the same type (True is not 1), a NaN equal to a NaN, -0.0 not equal to 0.0."""
    if type(ours) is not type(theirs):
        return False
    if isinstance(ours, dict):
        return ours.keys() == theirs.keys() and all(same(ours[k], theirs[k]) for k in ours)
    if isinstance(ours, list):
        return len(ours) == len(theirs) and all(map(same, ours, theirs))
    if isinstance(ours, float):
        return (math.isnan(ours) and math.isnan(theirs)) or (
            ours == theirs and math.copysign(1, ours) == math.copysign(1, theirs)
        )
    return bool(ours == theirs)


def text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- round trips ---------------------------------------------------------------------------------


def check_round_trip(proto: Proto, name: str, message: Message) -> None:
    wire = json_format.MessageToDict(message, **FLAGS)
    decoded = proto.decode(name, wire)
    assert same(decoded, plain(message)), name
    assert text(proto.encode(name, decoded)) == text(wire), name  # byte for byte: field order too
    assert text(proto.encode(name, plain(message))) == text(wire), name
    camel = json_format.MessageToDict(message, always_print_fields_with_no_presence=True)
    assert same(proto.decode(name, camel), decoded), name


@pytest.mark.parametrize("name", REAL.names())
def test_every_message_round_trips_as_json_format_writes_it(name: str) -> None:
    check_round_trip(REAL, name, populate(REAL.message(name)))
    check_round_trip(REAL, name, REAL.message(name))
    assert text(REAL.encode(name, {})) == text(json_format.MessageToDict(REAL.message(name), **FLAGS))


def test_the_schema_holds_every_message_of_the_service() -> None:
    assert sorted(schema.MESSAGES) == sorted(REAL.names())
    service = code_agent_pb2.DESCRIPTOR.services_by_name["CodeAgentService"]
    assert [(m.name, m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods] == [
        tuple(method) for method in schema.METHODS
    ]


@pytest.mark.parametrize("name", list(later_schema.MESSAGES))
def test_every_message_of_the_later_only_rpcs_round_trips(name: str) -> None:
    check_round_trip(LATER, name, populate(LATER.message(name)))
    check_round_trip(LATER, name, LATER.message(name))


def test_the_later_schema_holds_the_later_only_rpcs_and_what_they_use() -> None:
    box = code_agent_pb2.DESCRIPTOR.services_by_name["CodeAgentService"]
    service = code_agent_later_pb2.DESCRIPTOR.services_by_name["CodeAgentService"]
    only = [m for m in service.methods if m.name not in box.methods_by_name]
    assert [(m.name, m.input_type.name, m.output_type.name, m.server_streaming) for m in only] == [
        tuple(method) for method in later_schema.METHODS
    ]
    used = {m.input_type.name for m in only} | {m.output_type.name for m in only}
    assert used <= set(later_schema.MESSAGES) <= set(LATER.names())
    assert "ContentBlock" in later_schema.MESSAGES and "Message" not in later_schema.MESSAGES
    # an enum is written by its name, also when the plain form holds the name (as protobuf takes it)
    job = LATER.encode("CronJob", {"status": "CRON_JOB_STATUS_PAUSED", "job_type": 1})
    assert (job["status"], job["job_type"]) == ("CRON_JOB_STATUS_PAUSED", "CRON_JOB_TYPE_AGENT")


def test_every_kind_round_trips_in_a_synthetic_proto() -> None:
    for name in SYNTHETIC.names():
        check_round_trip(SYNTHETIC, name, populate(SYNTHETIC.message(name)))
        check_round_trip(SYNTHETIC, name, SYNTHETIC.message(name))
    for member in ("choice_text", "choice_all", "choice_color"):
        message = SYNTHETIC.message("All")
        if member == "choice_all":
            populate(message.choice_all, 2)
        else:
            setattr(message, member, "" if member == "choice_text" else 0)  # the default, yet set: printed
        check_round_trip(SYNTHETIC, "All", message)
    edges = SYNTHETIC.message("All")
    edges.s_float, edges.s_double, edges.r_float[:] = -0.0, float("nan"), [float("inf"), float("-inf"), 1e-45]
    edges.o_double = 0.0
    check_round_trip(SYNTHETIC, "All", edges)


# -- odd and bad inputs: json_format and the codec agree -----------------------------------------


def check_alike(proto: Proto, name: str, value: dict[str, Any], where: str) -> None:
    """ParseDict accepts `value` iff decode does, to the same values; a refusal names `where`."""
    try:
        expected = plain(json_format.ParseDict(value, proto.message(name)))
    except Exception:  # ParseError, and the odd OverflowError json_format lets through
        with pytest.raises(CodecError) as refused:
            proto.decode(name, value)
        assert str(refused.value).startswith(f"invalid {name}: {where}"), (value, str(refused.value))
    else:
        decoded = proto.decode(name, value)
        assert same(decoded, expected), (value, decoded, expected)


ODD = [
    None, True, False, 0, -1, 1.0, 1.5, -0.0, 2**31, 2**32, -(2**31) - 1, 2**63, 2**64, -(2**63) - 1,
    1e20, 3.5e38, 1e-50, float("inf"), float("-inf"), float("nan"), 10**400,
    "1", "-1", " 1", "1 ", "\t1", "1e3", "1.0", "1.5", "0x10", "1_000", "١٢", "abc", "", "9" * 5000,
    "NaN", "nan", "NAN", "Infinity", "-Infinity", "inf", "3.5e38", "1e400", "true", "false",
    "AAEC", "AAE", "A", "-_8", "+/8=", "YQ==!!====", "é", "\ud800", "a\udc00",
    "COLOR_RED", "COLOR_BLUE", "SIZE_BIG", "-2", "2147483648",
    [], {}, [1], ["x"], {"a": 1},
]  # fmt: skip


def _valid(field: FieldDescriptor) -> Any:
    return {T.TYPE_MESSAGE: {}, T.TYPE_STRING: "", T.TYPE_BYTES: "", T.TYPE_BOOL: False}.get(field.type, 0)


def _wraps(field: FieldDescriptor, odd: object) -> bool:
    """Whether upb's json_format reads `odd` wrongly in `field`: see the test below."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        field = field.message_type.fields[1]
    int32 = isinstance(odd, int) and not isinstance(odd, bool) and -(2**31) <= odd < 2**31
    return field.type == T.TYPE_ENUM and isinstance(odd, int) and not int32


def _odd_cases(proto: Proto, name: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Each odd value in each field (by either name), as an element of a repeated field, as a
    map's value and key."""
    for field in proto.message(name).DESCRIPTOR.fields:
        for key in sorted({field.name, field.json_name}):
            is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
            for odd in (odd for odd in ODD if not _wraps(field, odd)):
                if is_map:
                    yield {key: {"1": odd}}, key
                    if isinstance(odd, str):
                        yield {key: {odd: _valid(field.message_type.fields[1])}}, key
                elif field.is_repeated:
                    yield {key: [odd]}, f"{key}[0]"
                    yield {key: odd}, key
                else:
                    yield {key: odd}, key


def test_odd_values_in_every_field_are_taken_or_refused_alike() -> None:
    later = ((LATER, n) for n in later_schema.MESSAGES)
    for proto, name in [(SYNTHETIC, "All"), *((REAL, n) for n in REAL.names()), *later]:
        for value, where in _odd_cases(proto, name):
            check_alike(proto, name, value, where)


def test_an_enum_number_beyond_int32_is_refused_where_upb_wraps_it() -> None:
    """upb looks an enum number up modulo 2**32, so ParseDict reads 2**32 + 1 as ROLE_USER (and
    refuses 2**32 + 5, which names no value). Protobuf's own range check refuses both; so do we."""
    wrapped = {"messages": [{"role": 2**32 + 1}]}
    assert json_format.ParseDict(wrapped, code_agent_pb2.GenerateRequest()).messages[0].role == 1
    with pytest.raises(
        CodecError, match=r"^invalid GenerateRequest: messages\[0\]\.role: out of range for enum"
    ):
        codec.decode("GenerateRequest", wrapped)


GENERATE = "GenerateRequest"
CORPUS: list[tuple[Proto, str, dict[str, Any], str]] = [
    (REAL, "CreateSessionRequest", {"bogus": 1}, "bogus"),
    (REAL, "CreateSessionRequest", {"[ext.name]": 1}, "[ext.name]"),
    (REAL, "CreateSessionRequest", {"session_id": "a", "sessionId": "b"}, "sessionId"),
    (REAL, "CreateSessionRequest", {"session_id": "a", "sessionId": None}, ""),  # null clears it
    (REAL, "CreateSessionRequest", {"session_id": None, "sessionId": "b"}, ""),
    (REAL, GENERATE, {"session_id": "a", "sessionId": "b"}, ""),  # no presence: the last one wins
    (REAL, GENERATE, {"messages": [{"role": "ROLE_USER", "content": "hi"}], "options": {"maxTokens": "5"}}, ""),
    (REAL, GENERATE, {"messages": [{"role": "ROLE_NOPE"}]}, "messages[0].role"),
    (REAL, GENERATE, {"messages": [{"role": 1, "bogus": 2}]}, "messages[0].bogus"),
    (REAL, GENERATE, {"messages": [{"attachments": [{}, {"content": "%%%"}]}]}, "messages[0].attachments[1].content"),
    (REAL, GENERATE, {"messages": [{"metadata": {"a": None}}]}, 'messages[0].metadata["a"]'),
    (REAL, GENERATE, {"messages": [None]}, "messages[0]"),
    (REAL, GENERATE, {"messages": [[]]}, ""),  # json_format reads [] and "" as an empty message
    (REAL, GENERATE, {"messages": [""]}, ""),
    (REAL, GENERATE, {"messages": ["x"]}, "messages[0]"),
    (REAL, GENERATE, {"messages": [5]}, "messages[0]"),
    (REAL, GENERATE, {"messages": {}}, "messages"),
    (REAL, GENERATE, {"options": []}, ""),
    (REAL, GENERATE, {"options": 5}, "options"),
    (REAL, GENERATE, {"options": {"temperature": 0.7, "stop_sequences": ["a", None]}}, "options.stop_sequences[1]"),
    (REAL, "SetConfirmationPolicyRequest", {"policy": {"defaultTimeoutMs": "18446744073709551615"}}, ""),
    (REAL, "SetConfirmationPolicyRequest", {"policy": {"defaultTimeoutMs": "18446744073709551616"}}, "policy"),
    (REAL, "SetConfirmationPolicyRequest", {"policy": {"yolo_lanes": ["SESSION_LANE_QUERY", 3, "4"]}}, ""),
    (SYNTHETIC, "All", {"choice_text": "a", "choiceAll": {}}, "choiceAll"),
    (SYNTHETIC, "All", {"choice_text": "a", "choice_all": None, "choice_color": None}, ""),
    (SYNTHETIC, "All", {"choice_text": None, "choice_color": "COLOR_RED"}, ""),
    (SYNTHETIC, "All", {"choice_all": {"child": {"child": {"s_int32": "x"}}}}, "choice_all.child.child.s_int32"),
    (SYNTHETIC, "All", {"child": {"r_string": ["a"], "s_int32": 1}, "children": [{"child": {"s_bool": 1}}]}, "children[0].child.s_bool"),
    (SYNTHETIC, "All", {"s_bool": True, "sBool": False, "child": {"s_int32": 1}}, ""),
    # a message given twice (by both names) merges; a repeated field or a map is replaced
    (SYNTHETIC, "All", {"by_int32": {"1": {"s_int32": 1}, "01": {"s_int64": 2}}}, ""),
    (
        SYNTHETIC,
        "All",
        {
            "other_child": {"s_int32": 1, "r_string": ["a"], "by_int32": {"1": {}}, "child": {"s_bool": True}},
            "otherChild": {"r_string": ["b"], "by_int32": {"2": {}}, "child": {"s_int64": 2}, "s_double": 1.5},
        },
        "",
    ),
    (SYNTHETIC, "All", {"other_child": {"s_int32": 1}, "otherChild": None}, ""),
    (SYNTHETIC, "All", {"by_bool": {"true": "a", "false": "b"}, "byBool": {"true": "c"}}, ""),
    (SYNTHETIC, "All", {"by_bool": {"yes": "a"}}, "by_bool"),
    (SYNTHETIC, "All", {"by_int32": {"1": None}}, "by_int32[1]"),
    (SYNTHETIC, "All", {"by_int32": []}, "by_int32"),
]  # fmt: skip


@pytest.mark.parametrize(("proto", "name", "value", "where"), CORPUS)
def test_a_corpus_of_inputs_is_taken_or_refused_alike(
    proto: Proto, name: str, value: Any, where: str
) -> None:
    check_alike(proto, name, value, where)


def test_nesting_deeper_than_json_format_allows_is_refused() -> None:
    def nested(depth: int) -> dict[str, Any]:
        value: dict[str, Any] = {}
        for _ in range(depth):
            value = {"child": value}
        return value

    check_alike(SYNTHETIC, "All", nested(98), "")
    check_alike(SYNTHETIC, "All", nested(99), "")
    check_alike(SYNTHETIC, "All", nested(100), "child.child")


@pytest.mark.parametrize(
    ("value", "kind"),
    [([1], "an array"), ("{}", "a string"), (None, "null"), (3, "a number"), (True, "a boolean")],
)
def test_a_request_that_is_not_an_object_is_refused(value: object, kind: str) -> None:
    with pytest.raises(CodecError, match=f"^a CreateSessionRequest must be a JSON object, not {kind}$"):
        codec.decode("CreateSessionRequest", value)


def test_the_schemas_are_what_the_generator_writes_now(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_http_schema.py"), "--dir", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for name in ("schema.py", "later_schema.py"):
        committed = ROOT / "a3s_agent" / "faces" / "http" / name
        fresh = (tmp_path / name).read_text()
        assert fresh == committed.read_text(), f"{name} is stale: run tools/gen_http_schema.py"
