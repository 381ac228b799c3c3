"""The ACP registry entry (registry/a3s-agent/): what the registry's CI checks of it (its schema,
tests/data/acp/agent.schema.json; the directory named by the id; a 16x16 icon drawn in
`currentColor` only), and that what it tells an editor to run is this release's `acp` command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema

import a3s_agent

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ROOT / "registry" / "a3s-agent"
SCHEMA = json.loads((Path(__file__).parent / "data" / "acp" / "agent.schema.json").read_text())


def entry() -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((ENTRY / "agent.json").read_text())
    return manifest


def test_the_entry_is_valid_against_the_registrys_schema() -> None:
    manifest = entry()
    checker = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    assert [error.message for error in checker.iter_errors(manifest)] == []
    assert manifest["id"] == ENTRY.name


def test_the_schema_check_refuses_what_the_registry_refuses() -> None:
    checker = jsonschema.Draft7Validator(SCHEMA)
    for broken in (
        {**entry(), "id": "A3S Agent"},
        {**entry(), "distribution": {}},
        {**entry(), "distribution": {"uvx": {"package": "a3s-agent", "command": "x"}}},
        {key: value for key, value in entry().items() if key != "version"},
    ):
        assert list(checker.iter_errors(broken)), broken


def test_it_runs_this_releases_acp_command_from_the_published_package() -> None:
    uvx = entry()["distribution"]["uvx"]
    assert uvx["package"] == f"a3s-agent@{a3s_agent.__version__}"
    assert entry()["version"] == a3s_agent.__version__
    # `uvx a3s-agent@V acp` as the editor runs it: the package's script with these arguments
    done = subprocess.run(
        [sys.executable, "-m", "a3s_agent", *uvx["args"], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: a3s-agent acp"), done.stdout + done.stderr


def test_the_icon_is_16_by_16_and_takes_the_editors_colour() -> None:
    svg = ET.parse(ENTRY / "icon.svg").getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert (svg.get("width"), svg.get("height"), svg.get("viewBox")) == ("16", "16", "0 0 16 16")
    colours = {
        value
        for element in svg.iter()
        for name in ("fill", "stroke", "color", "stop-color")
        if (value := element.get(name)) is not None
    }
    assert colours <= {"currentColor", "none"}, colours
    assert not re.search(r"#[0-9a-fA-F]{3,8}\b|rgb\(|style=", (ENTRY / "icon.svg").read_text())
