"""Skills: SKILL.md parsing, skill-defined tools run for real, directory scanning, the shipped skills."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from a3s_agent.base.errors import InvalidArgument, NotFound
from a3s_agent.core.skills.catalog import EXAMPLE_SKILLS_DIR
from a3s_agent.core.skills.skill import Skill, load_skill_file, parse_skill, scan_skill_dirs
from a3s_agent.tools.registry import ToolContext, ToolOutput, ToolRegistry
from a3s_agent.tools.skill_backends import BinaryBackend, HttpBackend, ScriptBackend

SHIPPED_SKILLS = EXAMPLE_SKILLS_DIR


def skill_text(frontmatter: dict[str, Any], body: str = "") -> str:
    # Not allow_unicode: PyYAML then writes characters such as U+0085 raw, and reads them back as line breaks.
    return f"---\n{yaml.safe_dump(frontmatter, sort_keys=False)}---\n{body}"


def one_tool(env: list[str] | None = None, **definition: Any) -> Skill:
    """A skill with a single tool named `t`, declaring the environment variables `env`."""
    frontmatter = {"name": "s", **({"env": env} if env else {}), "tools": [{"name": "t", **definition}]}
    return parse_skill(skill_text(frontmatter), source="client")


async def call(skill: Skill, ctx: ToolContext, **arguments: Any) -> ToolOutput:
    registry = ToolRegistry(skill.build_tools())
    return await registry.run(skill.tools[0].name, json.dumps(arguments), ctx)


# ---------------------------------------------------------------- parsing


def test_a_full_skill_parses() -> None:
    text = """---
name: release-notes
description: Draft release notes from git history — café ✓ 中文.
allowed-tools: Bash(git log:*), Read
version: 1.2
owner: {team: docs}
---
# Release notes

Read the log, then write.
"""
    skill = parse_skill(text, source="skills/release-notes/SKILL.md")
    assert skill == Skill(
        name="release-notes",
        description="Draft release notes from git history — café ✓ 中文.",
        allowed_tools=["Bash(git log:*)", "Read"],
        instructions="# Release notes\n\nRead the log, then write.",
        tools=[],
        source="skills/release-notes/SKILL.md",
        metadata={"version": 1.2, "owner": {"team": "docs"}},
    )
    assert skill.tool_names == []
    assert skill.build_tools() == []


def test_allowed_tools_as_a_list_or_a_string_are_the_same() -> None:
    as_string = parse_skill(
        "---\nname: a\nallowed-tools: 'Bash(git add:*, git commit:*), Read,, Edit '\n---\n", source="client"
    )
    as_list = parse_skill(
        "---\nname: a\nallowed-tools:\n  - Bash(git add:*, git commit:*)\n  - Read\n  - ' Edit'\n---\n",
        source="client",
    )
    assert (
        as_string.allowed_tools == as_list.allowed_tools == ["Bash(git add:*, git commit:*)", "Read", "Edit"]
    )


def test_allowed_tools_with_an_underscore_is_understood_too() -> None:
    skill = parse_skill("---\nname: a\nallowed_tools: [Read]\n---\n", source="client")
    assert skill.allowed_tools == ["Read"]
    assert skill.metadata == {}


def test_crlf_line_endings_and_a_byte_order_mark_parse_like_lf() -> None:
    text = "---\nname: a\ndescription: d\nallowed-tools: Read\n---\n# Title\n\nbody line\n"
    crlf = "\ufeff" + text.replace("\n", "\r\n")
    assert parse_skill(crlf, source="client") == parse_skill(text, source="client")
    assert parse_skill(crlf, source="client").instructions == "# Title\n\nbody line"


def test_empty_body_and_optional_fields_default_to_empty() -> None:
    skill = parse_skill("---\nname: bare\n---", source="client")
    assert (skill.description, skill.allowed_tools, skill.instructions, skill.tools, skill.metadata) == (
        "",
        [],
        "",
        [],
        {},
    )


def test_blank_lines_before_the_frontmatter_are_allowed_and_count_for_line_numbers() -> None:
    assert parse_skill("\n\n---\nname: a\n---\n", source="client").name == "a"
    with pytest.raises(InvalidArgument, match=r"^client: line 5: invalid YAML"):
        parse_skill("\n\n---\nname: a\nbad: [x\n---\n", source="client")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# Just markdown\n", r"^f\.md: line 1: a skill starts with YAML frontmatter"),
        ("", r"^f\.md: the skill is empty; a skill starts with YAML frontmatter"),
        (" \n\n", r"^f\.md: the skill is empty"),
        ("---\nname: a\n", r"^f\.md: line 1: the frontmatter is never closed"),
        ("---\n---\nbody\n", r"^f\.md: missing required field 'name'$"),
        ("---\ndescription: x\n---\n", r"^f\.md: missing required field 'name'$"),
        ("---\n- a\n- b\n---\n", r"^f\.md: line 2: the frontmatter must be a mapping .*not a list"),
        ("---\nname: a\ndescription: x: y\n---\n", r"^f\.md: line 3: invalid YAML: mapping values"),
        (
            "---\nname: a\n\ntags: [x,\n  y\n---\n",
            r"^f\.md: line 5: invalid YAML: .*flow sequence on line 4\)",
        ),
        (
            "---\nname: !!python/object:os.system x\n---\n",
            r"^f\.md: line 2: invalid YAML: could not determine",
        ),
        ("---\nname: 2024\n---\n", r"^f\.md: name: must be a string, not a number \(quote it\)"),
        ("---\nname: has space\n---\n", r"^f\.md: name: 'has space' is not a valid skill name"),
        ("---\nname: " + "x" * 65 + "\n---\n", r"is not a valid skill name"),
        ("---\nname: a\ndescription: [1]\n---\n", r"^f\.md: description: must be a string, not a list"),
        ("---\nname: a\nallowed-tools: 3\n---\n", r"^f\.md: allowed-tools: must be a comma-separated"),
        ("---\nname: a\nallowed-tools: [Read, 3]\n---\n", r"^f\.md: allowed-tools\[1\]: must be a string"),
        ("---\nname: a\ntools: {x: 1}\n---\n", r"^f\.md: tools: must be a list of tool definitions"),
        ("---\nname: a\ntools: [x]\n---\n", r"^f\.md: tools\[0\]: must be a mapping"),
        (
            "---\nname: a\nx: &x [1]\ny: [*x, *x]\n---\n",
            r"^f\.md: line 4: invalid YAML: aliases \(\*name\) are not allowed",
        ),
        (
            "---\nname: a\n" + "x: " + "[" * 5000 + "\n---\n",
            r"^f\.md: (the frontmatter is nested too deeply|line)",
        ),
    ],
)
def test_bad_frontmatter_names_the_line_or_field(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_skill(text, source="f.md")


SCRIPT = {"script": "echo hi"}
OBJECT = {"type": "object", "properties": {"msg": {"type": "string"}}}


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ([{"script": "echo"}], r"tools\[0\]: missing required field 'name'"),
        ([{"name": "has space", **SCRIPT}], r"tools\[0\]\.name: 'has space' is not a valid tool name"),
        ([{"name": "a.b", **SCRIPT}], r"tools\[0\]\.name: 'a\.b' is not a valid tool name"),
        ([{"name": "t", **SCRIPT}, {"name": "t", **SCRIPT}], r"tools\[1\]\.name: 't' is defined twice"),
        ([{"name": "t"}], r"tools\[0\]: give exactly one backend of script, binary or http \(found 0\)"),
        ([{"name": "t", "binary": ["ls"], **SCRIPT}], r"tools\[0\]: give exactly one backend .*\(found 2\)"),
        ([{"name": "t", "scirpt": "ls"}], r"tools\[0\]: unknown field 'scirpt'"),
        (
            [
                {
                    "name": "t",
                    "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}},
                    **SCRIPT,
                }
            ],
            r"tools\[0\]\.parameters is not a valid JSON Schema: ",
        ),
        (
            [{"name": "t", "parameters": {"type": "string"}, **SCRIPT}],
            r"tools\[0\]\.parameters must describe an object",
        ),
        (
            [{"name": "t", "parameters": "x", **SCRIPT}],
            r"tools\[0\]\.parameters must be a JSON Schema object",
        ),
        (
            [{"name": "t", "parameters": {1: "x"}, **SCRIPT}],
            r"tools\[0\]\.parameters: holds values JSON cannot",
        ),
        ([{"name": "t", "timeout_ms": 0, **SCRIPT}], r"tools\[0\]\.timeout_ms: must be a whole number"),
        ([{"name": "t", "timeout_ms": True, **SCRIPT}], r"tools\[0\]\.timeout_ms: must be a whole number"),
        ([{"name": "t", "script": "  "}], r"tools\[0\]\.script: must be the script's source text"),
        ([{"name": "t", "interpreter": "", **SCRIPT}], r"tools\[0\]\.interpreter: must name an interpreter"),
        ([{"name": "t", "interpreter": "'open", **SCRIPT}], r"tools\[0\]\.interpreter: No closing quotation"),
        (
            [{"name": "t", "interpreter": "sh", "language": "sh", **SCRIPT}],
            r"tools\[0\]: give interpreter or language",
        ),
        (
            [{"name": "t", "language": "python", "binary": ["ls"]}],
            r"tools\[0\]: interpreter and language only",
        ),
        ([{"name": "t", "binary": []}], r"tools\[0\]\.binary: must be a non-empty list"),
        ([{"name": "t", "binary": ["sleep", 1]}], r"tools\[0\]\.binary\[1\]: must be a string, not a number"),
        ([{"name": "t", "binary": [" "]}], r"tools\[0\]\.binary\[0\]: must name the program"),
        (
            [{"name": "t", "parameters": OBJECT, "binary": ["echo", "${mgs}"]}],
            r"tools\[0\]\.binary\[1\]: \$\{mgs\} is not one of the tool's parameters \(msg\)",
        ),
        (
            [{"name": "t", "binary": ["echo", "${env:}"]}],
            r"tools\[0\]\.binary\[1\]: \$\{env:\} does not name an environment",
        ),
        ([{"name": "t", "http": 3}], r"tools\[0\]\.http: must be a URL or a mapping"),
        ([{"name": "t", "http": {"method": "GET"}}], r"tools\[0\]\.http: missing required field 'url'"),
        (
            [{"name": "t", "http": {"url": "http://x", "verb": "GET"}}],
            r"tools\[0\]\.http: unknown field 'verb'",
        ),
        (
            [{"name": "t", "http": {"url": "http://x", "method": "FETCH"}}],
            r"tools\[0\]\.http\.method: 'FETCH' is not one of GET, POST, PUT, PATCH, DELETE, HEAD$",
        ),
        (
            [{"name": "t", "http": {"url": "http://x", "headers": {"A": 1}}}],
            r"tools\[0\]\.http\.headers: must map header names",
        ),
        (
            [{"name": "t", "http": {"url": "http://x", "body": 3}}],
            r"tools\[0\]\.http\.body: must be a string",
        ),
        (
            [{"name": "t", "http": {"url": "http://x", "headers": {"Authorization": "Bearer ${token}"}}}],
            r"tools\[0\]\.http\.headers\.Authorization: \$\{token\} is not one of the tool's parameters \(it has none\)",
        ),
        (
            [
                {
                    "name": "t",
                    "parameters": OBJECT,
                    "http": {"url": "http://x", "method": "POST", "body": {"a": ["${b}"]}},
                }
            ],
            r"tools\[0\]\.http\.body\.a\[0\]: \$\{b\} is not one of",
        ),
    ],
)
def test_bad_tool_definitions_name_the_field(tools: list[Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^client: " + message):
        parse_skill(skill_text({"name": "s", "tools": tools}), source="client")


@pytest.mark.parametrize(
    ("env", "tools", "message"),
    [
        ("GITHUB_API_URL", [], r"env: must be a list of environment variable names, not a string"),
        (["OK", 3], [], r"env\[1\]: must be a string, not a number"),
        (["1BAD"], [], r"env\[0\]: '1BAD' is not an environment variable name"),
        (["A3S_AUTH_TOKEN"], [], r"env\[0\]: A3S_AUTH_TOKEN is one of the server's secrets"),
        (["X", "OPENAI_API_KEY"], [], r"env\[1\]: OPENAI_API_KEY is one of the server's secrets"),
        (["A3S_LLM_BASE_URL"], [], r"env\[0\]: A3S_LLM_BASE_URL is one of the server's secrets"),
        (["MARKED_BY_OPERATOR"], [], r"env\[0\]: MARKED_BY_OPERATOR is one of the server's secrets"),
        (
            ["X"],
            [{"name": "t", "binary": ["echo", "${env:X}", "${env:Y}"]}],
            r"tools\[0\]\.binary\[2\]: \$\{env:Y\} reads a variable the skill does not declare; "
            r"list it in the skill's env field \(env: \[Y\]\)",
        ),
    ],
)
def test_env_declares_the_variables_a_skill_reads_and_never_a_secret(
    env: Any, tools: list[Any], message: str
) -> None:
    text = skill_text({"name": "s", "env": env, "tools": tools})
    with pytest.raises(InvalidArgument, match=r"^client: " + message):
        parse_skill(text, source="client", secret_names={"MARKED_BY_OPERATOR"})


def test_every_problem_in_the_fields_is_reported_one_line_each() -> None:
    text = skill_text(
        {
            "name": "has space",
            "env": ["OK", 3, "OPENAI_API_KEY"],
            "tools": [
                {"name": "a", "scirpt": "ls"},
                {"name": "b", "script": "ls", "binary": ["ls"]},
                {"name": "c", "http": {"url": "http://x", "method": 3, "headers": {"A": ["b"]}, "body": 3}},
                {"name": "d", "binary": ["echo", 1], "timeout_ms": "5", "description": {"x": 1}},
                {"name": "e", "interpreter": "sh", "script": 7},
                "f",
            ],
            "tags": ["kept"],
        }
    )
    with pytest.raises(InvalidArgument) as caught:
        parse_skill(text, source="f.md")
    known = "backend, binary, description, http, interpreter, language, name, parameters, script, timeout_ms"
    assert str(caught.value).split("\n") == [
        "f.md: name: 'has space' is not a valid skill name: use 1-64 letters, digits, '.', '_' or '-'",
        "f.md: env[1]: must be a string, not a number (quote it)",
        "f.md: env[2]: OPENAI_API_KEY is one of the server's secrets (a token, key, password, LLM setting"
        " or a name the operator marks secret); a skill cannot read it",
        f"f.md: tools[0]: unknown field 'scirpt' (known: {known})",
        "f.md: tools[1]: give exactly one backend of script, binary or http (found 2)",
        "f.md: tools[2].http.method: must be a string, not a number (quote it)",
        "f.md: tools[2].http.headers: must map header names to strings",
        "f.md: tools[2].http.body: must be a string template, or a mapping or list sent as JSON",
        "f.md: tools[3].description: must be a string, not a mapping (quote it)",
        "f.md: tools[3].timeout_ms: must be a whole number of milliseconds from 1 to 600000",
        "f.md: tools[3].binary[1]: must be a string, not a number (quote it)",
        "f.md: tools[4].script: must be the script's source text",
        "f.md: tools[5]: must be a mapping (name, description, parameters, a backend)",
    ]


def test_the_checks_across_fields_report_every_problem_once_the_fields_are_valid() -> None:
    tools = [
        {"name": "t", "parameters": OBJECT, "binary": ["${msg}", "${nope}", "${env:X}", "${env:Y}"]},
        {
            "name": "t",
            "http": {"url": "http://x/${a}", "headers": {"H": "${env:1}"}, "body": {"k": ["${b}"]}},
        },
    ]
    with pytest.raises(InvalidArgument) as caught:
        parse_skill(skill_text({"name": "s", "env": ["X"], "tools": tools}), source="client")
    assert str(caught.value) == "client: tools[1].name: 't' is defined twice"
    tools[1]["name"] = "u"
    with pytest.raises(InvalidArgument) as caught:
        parse_skill(skill_text({"name": "s", "env": ["X"], "tools": tools}), source="client")
    assert str(caught.value).split("\n") == [
        "client: tools[0].binary[1]: ${nope} is not one of the tool's parameters (msg)",
        "client: tools[0].binary[3]: ${env:Y} reads a variable the skill does not declare; "
        "list it in the skill's env field (env: [Y])",
        "client: tools[1].http.url: ${a} is not one of the tool's parameters (it has none)",
        "client: tools[1].http.headers.H: ${env:1} does not name an environment variable",
        "client: tools[1].http.body.k[0]: ${b} is not one of the tool's parameters (it has none)",
    ]


def test_the_backend_key_picks_the_definition_and_its_fields() -> None:
    # `language` belongs to script definitions only; the tag of the variant is not in the field path.
    with pytest.raises(InvalidArgument, match=r"^client: tools\[0\]: interpreter and language only apply"):
        one_tool(http="http://x", language="sh")
    with pytest.raises(InvalidArgument, match=r"^client: tools\[0\]\.language: must be a string, not a list"):
        one_tool(script="echo", language=["sh"])
    with pytest.raises(InvalidArgument, match=r"^client: tools\[0\]\.http: must be a URL or a mapping"):
        one_tool(http=["http://x"])
    with pytest.raises(
        InvalidArgument, match=r"^client: tools\[0\]\.http\.url: must be a string, not a null"
    ):
        one_tool(http={"url": None})
    assert one_tool(http={"url": " http://x ", "method": "post"}).tools[0].backend == HttpBackend(
        "http://x", "POST"
    )


def test_env_names_are_kept_once_in_order() -> None:
    skill = parse_skill(skill_text({"name": "s", "env": ["B", "A", "B"]}), source="client")
    assert skill.env == ["B", "A"]


def test_tool_definitions_parse_into_backends() -> None:
    skill = parse_skill(
        skill_text(
            {
                "name": "s",
                "tools": [
                    {"name": "shebang", "script": "#!/usr/bin/env -S python3 -u\nprint(1)"},
                    {"name": "default", "script": "echo hi"},
                    {"name": "declared", "language": "node", "script": "#!/bin/sh\nconsole.log(1)"},
                    {"name": "argv", "parameters": OBJECT, "binary": ["echo", "${msg}"], "timeout_ms": 5},
                    {"name": "url", "http": "http://127.0.0.1/${env:X}"},
                ],
                "env": ["X"],
            }
        ),
        source="client",
    )
    backends = [spec.backend for spec in skill.tools]
    assert backends[0] == ScriptBackend("#!/usr/bin/env -S python3 -u\nprint(1)", ("python3", "-u"))
    assert isinstance(backends[1], ScriptBackend) and backends[1].interpreter == ("bash",)
    assert isinstance(backends[2], ScriptBackend) and backends[2].interpreter == ("node",)
    assert backends[3] == BinaryBackend(("echo", "${msg}"))
    assert backends[4] == HttpBackend("http://127.0.0.1/${env:X}")
    assert [spec.timeout_ms for spec in skill.tools] == [120_000, 120_000, 120_000, 5, 30_000]
    assert skill.env == ["X"] and {spec.env for spec in skill.tools} == {("X",)}
    assert "env" not in skill.metadata
    assert skill.tool_names == ["shebang", "default", "declared", "argv", "url"]
    built = {item.name: item for item in skill.build_tools()}
    assert [(item.family, item.lane) for item in built.values()] == [("command", "execute")] * 4 + [
        ("web", "execute")
    ]
    assert built["argv"].parameters_schema == OBJECT
    assert built["argv"].parameter_names == ["msg"]
    assert built["default"].parameters_schema == {"type": "object", "properties": {}}


def test_parameters_without_a_type_are_objects_and_yaml_only_values_are_refused() -> None:
    untyped = one_tool(parameters={"properties": {"n": {"type": "integer"}}}, script="echo")
    assert untyped.tools[0].parameters == {"type": "object", "properties": {"n": {"type": "integer"}}}
    text = "---\nname: s\ntools:\n  - name: t\n    script: echo\n    parameters:\n      properties:\n"
    with pytest.raises(InvalidArgument, match=r"^client: tools\[0\]\.parameters: holds values JSON cannot"):
        parse_skill(text + "        day: {default: 2024-01-01}\n---\n", source="client")


# ---------------------------------------------------------------- round trips

skill_names = st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True)
free_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\r"), max_size=200)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=skill_names,
    description=free_text,
    allowed=st.lists(st.from_regex(r"[A-Za-z_]{1,10}(\([a-z :*]{1,10}\))?", fullmatch=True), max_size=5),
    body=free_text,
)
def test_rendered_frontmatter_parses_back_equal(
    name: str, description: str, allowed: list[str], body: str
) -> None:
    text = skill_text({"name": name, "description": description, "allowed-tools": allowed}, body)
    skill = parse_skill(text, source="client")
    assert (skill.name, skill.description, skill.allowed_tools, skill.instructions) == (
        name,
        description.strip(),
        allowed,
        body.strip(),
    )
    joined = parse_skill(skill_text({"name": name, "allowed-tools": ", ".join(allowed)}), source="client")
    assert joined.allowed_tools == allowed


# ---------------------------------------------------------------- script backend


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    # The test servers are on 127.0.0.1, which http tools refuse unless allowed.
    return ToolContext(
        workspace=workspace, env={"SESSION_VALUE": "from-session", "A3S_FETCH_ALLOW_PRIVATE": "1"}
    )


async def test_script_gets_its_arguments_in_the_environment(ctx: ToolContext) -> None:
    skill = one_tool(
        parameters={
            "type": "object",
            "properties": {
                "msg": {"type": "string"},
                "count": {"type": "integer"},
                "dry-run": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
        },
        script='printf "%s|%s|%s|%s|%s|%s\\n" "$TOOL_ARG_MSG" "$TOOL_ARG_COUNT" "$TOOL_ARG_DRY_RUN" '
        '"$TOOL_ARG_TAGS" "$SESSION_VALUE" "$(pwd)"\nprintf "%s" "$TOOL_ARGS"',
    )
    arguments = {"msg": "it's $HOME; `x`", "count": 3, "dry-run": True, "tags": ["a", "b"]}
    result = await call(skill, ctx, **arguments)
    assert result.success, result.error
    first, second = result.output.split("\n", 1)
    assert first == f'it\'s $HOME; `x`|3|true|["a", "b"]|from-session|{ctx.workspace.resolve()}'
    assert json.loads(second) == arguments
    assert result.metadata["exit_code"] == 0
    assert list(ctx.workspace.iterdir()) == []  # the script file lives elsewhere


async def test_script_interpreter_from_shebang_or_declaration(ctx: ToolContext) -> None:
    code = "import os, sys\nprint(sys.executable, os.environ['TOOL_ARG_N'])"
    by_shebang = await call(one_tool(script=f"#!/usr/bin/env python3\n{code}"), ctx, N=1)
    by_field = await call(one_tool(interpreter="python3 -S", script=code), ctx, N=2)
    by_language = await call(one_tool(language="python", script=code), ctx, N=3)
    assert [r.output for r in (by_shebang, by_field, by_language)] == [
        f"{sys.executable} 1\n",
        f"{sys.executable} 2\n",
        f"{sys.executable} 3\n",
    ]


async def test_script_schema_defaults_fill_missing_arguments(ctx: ToolContext) -> None:
    skill = one_tool(
        parameters={"type": "object", "properties": {"greeting": {"type": "string", "default": "hello"}}},
        script='echo "$TOOL_ARG_GREETING $TOOL_ARGS"',
    )
    assert (await call(skill, ctx)).output == 'hello {"greeting": "hello"}\n'
    assert (await call(skill, ctx, greeting="hi")).output == 'hi {"greeting": "hi"}\n'


async def test_script_failure_keeps_output_and_exit_code(ctx: ToolContext) -> None:
    result = await call(one_tool(script="echo partial; echo oops >&2; exit 3"), ctx)
    assert not result.success
    assert result.error == "exited with code 3"
    assert result.output == "partial\noops\n"
    assert result.metadata["exit_code"] == 3


async def test_script_timeout_kills_it(ctx: ToolContext) -> None:
    started = asyncio.get_running_loop().time()
    result = await call(one_tool(timeout_ms=1000, script="echo started; sleep 30"), ctx)
    assert asyncio.get_running_loop().time() - started < 10
    assert not result.success
    assert result.error.startswith("timed out after 1 s")
    assert result.metadata["timed_out"] is True
    assert result.output == "started\n"


async def test_script_with_a_missing_interpreter_fails_clearly(ctx: ToolContext) -> None:
    result = await call(one_tool(interpreter="no-such-interpreter-xyz", script="x"), ctx)
    assert not result.success
    assert result.error == "no-such-interpreter-xyz is not installed on this machine (not found on PATH)"


# ---------------------------------------------------------------- binary backend


async def test_binary_substitutes_argv_without_a_shell(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVER_VALUE", "from-server")
    monkeypatch.setenv("SESSION_VALUE", "server-loses")
    skill = one_tool(
        env=["SESSION_VALUE", "SERVER_VALUE"],
        parameters={"type": "object", "properties": {"msg": {"type": "string"}, "n": {"type": "number"}}},
        binary=["echo", "${msg}", "n=${n}", "${env:SESSION_VALUE}", "${env:SERVER_VALUE}"],
    )
    result = await call(skill, ctx, msg="$(whoami); rm -rf / && `id` *", n=1.5)
    assert result.success, result.error
    assert result.output == "$(whoami); rm -rf / && `id` * n=1.5 from-session from-server\n"


async def test_binary_failures_are_clear(ctx: ToolContext) -> None:
    params = {"type": "object", "properties": {"msg": {"type": "string"}}}
    missing_arg = await call(one_tool(parameters=params, binary=["echo", "${msg}"]), ctx)
    assert not missing_arg.success
    assert missing_arg.error == "argument 'msg' is needed by this tool but was not given"
    missing_env = await call(
        one_tool(env=["A3S_SURELY_UNSET_VAR"], binary=["echo", "${env:A3S_SURELY_UNSET_VAR}"]), ctx
    )
    assert missing_env.error.startswith("environment variable A3S_SURELY_UNSET_VAR is not set")
    missing_program = await call(one_tool(binary=["no-such-program-xyz"]), ctx)
    assert missing_program.error == "no-such-program-xyz is not installed on this machine (not found on PATH)"
    nul = await call(one_tool(parameters=params, binary=["echo", "${msg}"]), ctx, msg="a\x00b")
    assert nul.error.startswith("cannot run ") and nul.error.endswith("echo: embedded null byte")
    failing = await call(one_tool(binary=["false"]), ctx)
    assert (failing.success, failing.error) == (False, "exited with code 1")


async def test_binary_runs_a_workspace_relative_program(ctx: ToolContext) -> None:
    program = ctx.workspace / "tool.sh"
    program.write_text('#!/bin/sh\necho "ran $1"\n')
    program.chmod(0o755)
    result = await call(one_tool(binary=["./tool.sh", "ok"]), ctx)
    assert result.output == "ran ok\n"


# ---------------------------------------------------------------- http backend


async def _echo(request: web.Request) -> web.Response:
    if request.match_info["tail"] == "missing":
        return web.json_response({"error": "nope"}, status=404)
    if request.match_info["tail"] == "slow":
        await asyncio.sleep(30)
    if request.match_info["tail"] == "big":
        return web.Response(text="x" * 50_000)
    return web.json_response(
        {
            "method": request.method,
            "path": request.raw_path,
            "authorization": request.headers.get("Authorization"),
            "content_type": request.headers.get("Content-Type"),
            "body": await request.text(),
        }
    )


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _echo)
    async with TestServer(app, host="127.0.0.1") as test_server:
        yield str(test_server.make_url("")).rstrip("/")


async def test_http_get_substitutes_arguments_and_env(
    server: str, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ECHO_BASE", server)
    skill = one_tool(
        env=["ECHO_BASE", "SESSION_VALUE"],
        parameters={"type": "object", "properties": {"id": {"type": "integer"}, "q": {"type": "string"}}},
        http={
            "url": "${env:ECHO_BASE}/items/${id}?q=${q}",
            "headers": {"Authorization": "Bearer ${env:SESSION_VALUE}"},
        },
    )
    result = await call(skill, ctx, id=7, q="a b&c=d/e")
    assert result.success, result.error
    status, body = result.output.split("\n\n", 1)
    assert status == "HTTP 200 OK"
    assert json.loads(body) == {
        "method": "GET",
        "path": "/items/7?q=a%20b%26c%3Dd%2Fe",
        "authorization": "Bearer from-session",
        "content_type": None,
        "body": "",
    }
    assert result.metadata["status_code"] == 200
    assert result.metadata["content_type"].startswith("application/json")


async def test_http_post_json_body_keeps_argument_types(server: str, ctx: ToolContext) -> None:
    skill = one_tool(
        parameters={
            "type": "object",
            "properties": {
                "count": {"type": "integer"},
                "name": {"type": "string"},
                "tags": {"type": "array"},
            },
        },
        http={
            "url": f"{server}/create",
            "method": "post",
            "body": {"count": "${count}", "greeting": "hello ${name}", "tags": "${tags}", "fixed": [1, None]},
        },
    )
    result = await call(skill, ctx, count=2, name='Al "Q"', tags=["x"])
    echoed = json.loads(result.output.split("\n\n", 1)[1])
    assert echoed["method"] == "POST"
    assert echoed["content_type"] == "application/json"
    assert json.loads(echoed["body"]) == {
        "count": 2,
        "greeting": 'hello Al "Q"',
        "tags": ["x"],
        "fixed": [1, None],
    }


async def test_http_string_body_is_a_raw_template(server: str, ctx: ToolContext) -> None:
    skill = one_tool(
        parameters=OBJECT,
        http={
            "url": f"{server}/raw",
            "method": "PUT",
            "headers": {"Content-Type": "text/plain"},
            "body": "msg=${msg}",
        },
    )
    echoed = json.loads((await call(skill, ctx, msg="a b")).output.split("\n\n", 1)[1])
    assert (echoed["method"], echoed["body"], echoed["content_type"]) == ("PUT", "msg=a b", "text/plain")


async def test_http_error_status_fails_with_the_body(server: str, ctx: ToolContext) -> None:
    result = await call(one_tool(http=f"{server}/missing"), ctx)
    assert not result.success
    assert result.error == "HTTP 404 Not Found"
    assert result.output == 'HTTP 404 Not Found\n\n{"error": "nope"}'


async def test_http_body_is_capped(server: str, workspace: Path) -> None:
    result = await call(
        one_tool(http=f"{server}/big"),
        ToolContext(workspace=workspace, env={"A3S_FETCH_ALLOW_PRIVATE": "1"}, max_output_bytes=1256),
    )
    assert result.metadata["truncated"] is True
    assert result.output == "HTTP 200 OK\n\n" + "x" * 1000 + "\n[body truncated at 1000 bytes]"


@contextmanager
def unused_port() -> Iterator[int]:
    """A local port nobody listens on, while the context lasts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_http_timeout_and_connection_failures(server: str, ctx: ToolContext) -> None:
    slow = await call(one_tool(timeout_ms=300, http=f"{server}/slow"), ctx)
    assert slow.error == f"GET {server}/slow timed out after 0.3 s"
    with unused_port() as port:
        env = {**ctx.env, "PORT": str(port)}
        template = "http://127.0.0.1:${env:PORT}/?key=${env:SESSION_VALUE}"
        skill = one_tool(env=["PORT", "SESSION_VALUE"], http=template)
        refused = await call(skill, ToolContext(workspace=ctx.workspace, env=env))
    # The error names the template, never the substituted URL with its secrets.
    assert refused.error.startswith(f"GET {template} failed: ")
    assert "from-session" not in refused.error
    bad_scheme = await call(one_tool(http="file:///etc/passwd"), ctx)
    assert bad_scheme.error.startswith("GET file:///etc/passwd failed: ")


# ---------------------------------------------------------------- argument validation


async def test_arguments_are_validated_against_the_schema_with_every_error(ctx: ToolContext) -> None:
    skill = one_tool(
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "opts": {"type": "object", "properties": {"n": {"minimum": 1}}},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        script="echo never",
    )
    registry = ToolRegistry(skill.build_tools())
    with pytest.raises(InvalidArgument) as caught:
        await registry.run("t", {"opts": {"n": 0}, "extra": 1}, ctx)
    assert str(caught.value) == (
        "invalid arguments for t: "
        "(arguments): 'path' is a required property; "
        "(arguments): Additional properties are not allowed ('extra' was unexpected); "
        "opts.n: 0 is less than the minimum of 1"
    )
    with pytest.raises(InvalidArgument, match="arguments for t: not valid JSON"):
        await registry.run("t", "{not json", ctx)
    with pytest.raises(InvalidArgument, match="arguments for t must be a JSON object"):
        await registry.run("t", "[1]", ctx)


# ---------------------------------------------------------------- files and directories


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_load_skill_file_from_a_file_or_a_directory(tmp_path: Path) -> None:
    file = write(tmp_path / "alpha" / "SKILL.md", "---\nname: alpha\n---\nDo alpha.\n")
    assert load_skill_file(file) == load_skill_file(tmp_path / "alpha")
    assert load_skill_file(file).source == str(file)
    with pytest.raises(NotFound, match="no skill file at"):
        load_skill_file(tmp_path / "nothing.md")
    (tmp_path / "binary.md").write_bytes(b"---\nname: \xff\n---\n")
    with pytest.raises(InvalidArgument, match=r"binary\.md: cannot be read"):
        load_skill_file(tmp_path / "binary.md")
    write(tmp_path / "bad.md", "---\nname: a\nx: [\n---\n")
    with pytest.raises(InvalidArgument, match=rf"^{tmp_path / 'bad.md'}: line 3: invalid YAML"):
        load_skill_file(tmp_path / "bad.md")


def test_scan_finds_both_layouts_and_the_first_duplicate_wins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write(first / "alpha" / "SKILL.md", "---\nname: alpha\n---\nfrom first\n")
    write(first / "beta.md", "---\nname: beta\n---\n")
    write(first / "notes.txt", "not a skill")
    write(first / "no-skill-here" / "README.md", "a directory without SKILL.md")
    write(first / ".hidden" / "SKILL.md", "---\nname: hidden\n---\n")
    write(first / "broken.md", "no frontmatter")
    write(second / "gamma" / "SKILL.md", "---\nname: gamma\n---\n")
    write(second / "alpha.md", "---\nname: alpha\n---\nfrom second\n")
    with caplog.at_level(logging.WARNING, logger="a3s_agent.core.skills.skill"):
        skills = scan_skill_dirs([first, second, tmp_path / "missing"])
    assert sorted(skills) == ["alpha", "beta", "gamma"]
    assert skills["alpha"].instructions == "from first"
    assert skills["alpha"].source == str(first / "alpha" / "SKILL.md")
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 3
    assert warnings[0].startswith(f"skipping skill file: {first / 'broken.md'}: line 1")
    assert warnings[1] == (
        f"skipping skill 'alpha' from {second / 'alpha.md'}: already loaded from {first / 'alpha' / 'SKILL.md'}"
    )
    assert warnings[2].startswith(f"cannot read skill directory {tmp_path / 'missing'}: [Errno 2]")


# ---------------------------------------------------------------- the shipped skills


def test_shipped_skills_parse() -> None:
    skills = scan_skill_dirs([SHIPPED_SKILLS])
    assert {"python-testing", "word-count"} <= set(skills)
    testing = skills["python-testing"]
    assert "Bash(pytest:*)" in testing.allowed_tools
    assert {"Read", "Edit"} <= set(testing.allowed_tools)
    assert testing.instructions.startswith("# Testing Python code with pytest")
    assert skills["word-count"].tool_names == ["count_lines"]


async def test_shipped_count_lines_tool_runs_on_a_workspace(workspace: Path) -> None:
    skill = load_skill_file(SHIPPED_SKILLS / "word-count")
    (workspace / "docs").mkdir()
    (workspace / "docs" / "notes.txt").write_text("one two\nthree\n\nfour five six")
    ctx = ToolContext(workspace=workspace)
    result = await call(skill, ctx, path="docs/notes.txt")
    assert result.success, result.output
    assert result.output == "docs/notes.txt: 4 lines, 6 words, 28 bytes\n"
    outside = await call(skill, ctx, path="../../etc/passwd")
    assert not outside.success
    assert outside.output == "../../etc/passwd is outside the workspace\n"
    with pytest.raises(InvalidArgument, match="'path' is a required property"):
        await call(skill, ctx)
