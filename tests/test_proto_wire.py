"""The proto is byte-compatible with A3S Box: every name and number of the wire reference matches,
and the committed stubs are exactly what tools/gen_protos.py generates."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from a3s_agent.proto import code_agent_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = (Path(__file__).parent / "data" / "a3s-wire-reference.md").read_text()

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_BYTES: "bytes",
}


def _sections() -> dict[str, str]:
    parts = re.split(r"\n### ", REFERENCE)[1:]
    return {part.partition("\n")[0]: part.partition("\n")[2] for part in parts}


def _type_name(field: FieldDescriptor) -> str:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return f"map<{_type_name(key)}, {_type_name(value)}>"
    if field.message_type is not None:
        base = field.message_type.name
    elif field.enum_type is not None:
        base = field.enum_type.name
    else:
        base = _SCALARS[field.type]
    if field.is_repeated:
        return f"repeated {base}"
    if field.has_presence and field.containing_oneof is not None:  # proto3 `optional`
        return f"optional {base}"
    return base


def _descriptor(name: str) -> Descriptor | EnumDescriptor:
    outer, _, inner = name.partition(".")
    message = pb.DESCRIPTOR.message_types_by_name.get(outer)
    if inner:
        return message.enum_types_by_name[inner]
    return message if message is not None else pb.DESCRIPTOR.enum_types_by_name[outer]


def test_service_has_every_rpc_of_the_reference_in_order() -> None:
    table = REFERENCE.split("## Service `CodeAgentService`")[1].split("###")[0]
    expected = [
        tuple(cell.strip() for cell in row.strip("|").split("|")) for row in table.strip().splitlines()[2:]
    ]
    service = pb.DESCRIPTOR.services_by_name["CodeAgentService"]
    actual = [
        (m.name, m.input_type.name, ("stream " if m.server_streaming else "") + m.output_type.name)
        for m in service.methods
    ]
    assert len(expected) == 38
    assert actual == expected
    assert service.full_name == "a3s.code.agent.v1.CodeAgentService"


def test_every_message_field_matches_name_number_and_type() -> None:
    checked = 0
    for heading, body in _sections().items():
        match = re.match(r"message `(\w+)`", heading)
        if not match:
            continue
        expected = re.findall(r"^\| (\d+) \| (\w+) \| ([^|]+?) \|$", body, flags=re.MULTILINE)
        message = _descriptor(match.group(1))
        actual = [(str(f.number), f.name, _type_name(f)) for f in message.fields]
        assert actual == expected, match.group(1)
        checked += 1
    assert checked == len(pb.DESCRIPTOR.message_types_by_name) == 98


def test_every_enum_matches_names_and_numbers() -> None:
    checked = 0
    for heading, body in _sections().items():
        match = re.match(r"enum `([\w.]+)`", heading)
        if not match:
            continue
        expected = [(name, int(number)) for name, number in re.findall(r"`(\w+)`=(\d+)", body)]
        enum = _descriptor(match.group(1))
        assert [(v.name, v.number) for v in enum.values] == expected, match.group(1)
        checked += 1
    assert checked == 12


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    committed = ROOT / "a3s_agent" / "proto"
    fresh = sorted(p.name for p in tmp_path.iterdir() if p.suffix in {".py", ".pyi"})
    assert fresh == sorted(p.name for p in committed.iterdir() if p.suffix in {".py", ".pyi"})
    for name in fresh:
        assert (tmp_path / name).read_text() == (committed / name).read_text(), f"{name} is stale"
