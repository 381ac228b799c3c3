"""Skills in A3S Code's format (`backend: {type: binary|script|http, ...}`) through the real gRPC
server: loaded from content and from a skills directory, listed, and run by ExecuteTool."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM

from .conftest import LiveServer, agent_settings, new_session, running

HEADERS_SEEN = web.AppKey("headers_seen", list[dict[str, str]])
# Prints its arguments as JSON, so a test sees exactly which argv the tool ran.
_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"


def a3s_code_skill(port: int = 1) -> str:
    return f"""---
name: a3s-style
description: Tools in A3S Code's format
version: 1.0.0
tools:
  - name: show-args
    description: Show the arguments the program gets
    backend:
      type: binary
      path: python3
      args_template: "-c '{_ARGV}' ${{message}} --tag=${{tag}} 'two ${{tag}} words'"
    parameters:
      type: object
      properties:
        message: {{type: string}}
        tag: {{type: string, default: none}}
      required: [message]
  - name: greet
    description: Greet someone
    backend:
      type: script
      interpreter: bash
      interpreter_args: ["-e"]
      script: |
        echo "hello $TOOL_ARG_NAME"
    parameters:
      type: object
      properties:
        name: {{type: string}}
  - name: weather
    description: Ask the weather service
    backend:
      type: http
      url: http://127.0.0.1:{port}/weather?city=${{city}}
      method: POST
      headers:
        X-Client: a3s-${{city}}
      body_template: '{{"city": "${{city}}", "days": ${{days}}}}'
      timeout_ms: 5000
    parameters:
      type: object
      properties:
        city: {{type: string}}
        days: {{type: integer, default: 3}}
---
Use these tools.
"""


@pytest.fixture
async def weather() -> AsyncIterator[TestServer]:
    async def answer(request: web.Request) -> web.Response:
        body = await request.text()
        request.app[HEADERS_SEEN].append(dict(request.headers))
        return web.json_response(
            {
                "city": request.query["city"],
                "client": request.headers["X-Client"],
                "body": body,
                "query": {key: request.query.getall(key) for key in request.query},
            }
        )

    app = web.Application()
    app[HEADERS_SEEN] = []
    app.router.add_post("/weather", answer)
    server = TestServer(app, host="127.0.0.1")
    async with server:
        yield server


@pytest.fixture
async def agent(workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[LiveServer]:
    settings = agent_settings(workspace, tmp_path / "data")
    async with running(settings) as server:
        await server.stub.Initialize(
            pb.InitializeRequest(
                config=pb.AgentConfig(
                    llm=pb.LLMConfig(provider="openai", model="fake-model", base_url=fake.base_url)
                ),
                env={"A3S_FETCH_ALLOW_PRIVATE": "1"},  # the weather service is on 127.0.0.1
            )
        )
        yield server


async def _execute(server: LiveServer, session_id: str, tool: str, **arguments: object) -> pb.ToolResult:
    reply = await server.stub.ExecuteTool(
        pb.ExecuteToolRequest(session_id=session_id, tool_name=tool, arguments=json.dumps(arguments))
    )
    return reply.result


async def test_a_skill_in_a3s_code_format_loads_and_its_tools_run(
    agent: LiveServer, weather: TestServer
) -> None:
    session_id = await new_session(agent)
    reply = await agent.stub.LoadSkill(
        pb.LoadSkillRequest(
            session_id=session_id, skill_name="a3s-style", skill_content=a3s_code_skill(weather.port or 0)
        )
    )
    assert reply.success and list(reply.tool_names) == ["show-args", "greet", "weather"]
    listed = {
        t.name: t for t in (await agent.stub.ListTools(pb.ListToolsRequest(session_id=session_id))).tools
    }
    assert {"show-args", "greet", "weather"} <= set(listed)
    assert json.loads(listed["show-args"].parameters_schema)["required"] == ["message"]

    shown = await _execute(agent, session_id, "show-args", message="hello world", tag="x")
    assert shown.success, shown.error
    assert json.loads(shown.output) == ["hello world", "--tag=x", "two x words"]
    defaulted = await _execute(agent, session_id, "show-args", message="m")
    assert json.loads(defaulted.output) == ["m", "--tag=none", "two none words"]

    greeted = await _execute(agent, session_id, "greet", name="Ada")
    assert greeted.success and greeted.output.strip() == "hello Ada"

    asked = await _execute(agent, session_id, "weather", city="Paris")
    assert asked.success, asked.error
    assert asked.output.startswith("HTTP 200")
    answer = json.loads(asked.output.split("\n\n", 1)[1])
    assert json.loads(answer.pop("body")) == {"city": "Paris", "days": 3}  # a bare ${days} keeps its type
    assert answer == {"city": "Paris", "client": "a3s-Paris", "query": {"city": ["Paris"]}}


async def test_http_values_stay_values_in_the_body_url_and_headers(
    agent: LiveServer, weather: TestServer
) -> None:
    """A value that closes the JSON string adds no field, one with `&` adds no query parameter,
    and one with a line break adds no header: the request is refused."""
    session_id = await new_session(agent)
    await agent.stub.LoadSkill(
        pb.LoadSkillRequest(
            session_id=session_id, skill_name="a3s-style", skill_content=a3s_code_skill(weather.port or 0)
        )
    )
    for city in (
        'x", "admin": true, "y": "',
        'Paris" }, {"admin": true',
        'Zurich \\ "quoted"\tend',
        "a&admin=1#f",
    ):
        asked = await _execute(agent, session_id, "weather", city=city)
        assert asked.success, asked.error
        answer = json.loads(asked.output.split("\n\n", 1)[1])
        assert json.loads(answer["body"]) == {"city": city, "days": 3}
        assert answer["query"] == {"city": [city]} and answer["client"] == f"a3s-{city}"
    for city in ("x\r\nX-Admin: 1", "x\nX-Admin: 1", "x\0", "Zürich"):
        refused = await _execute(agent, session_id, "weather", city=city)
        assert not refused.success and "header 'X-Client'" in refused.error, refused.error
    assert weather.app[HEADERS_SEEN] and all("X-Admin" not in seen for seen in weather.app[HEADERS_SEEN])


async def test_argument_values_never_reach_a_shell(agent: LiveServer) -> None:
    """A3S Code fills the template and then splits it into words; we split first, so a value
    is one argument whatever it holds: no shell syntax, no word splitting, no quote games."""
    session_id = await new_session(agent)
    await agent.stub.LoadSkill(
        pb.LoadSkillRequest(session_id=session_id, skill_name="a3s-style", skill_content=a3s_code_skill())
    )
    victim = agent.workspace / "x"
    victim.mkdir()
    (victim / "keep.txt").write_text("still here")
    attacks = ["; rm -rf x", "$(id)", "`id`", "a' 'b", 'c" "d', "x && touch pwned", "-c", "${tag}"]
    for attack in attacks:
        shown = await _execute(agent, session_id, "show-args", message=attack, tag=attack)
        assert shown.success, shown.error
        assert json.loads(shown.output) == [attack, f"--tag={attack}", f"two {attack} words"]
    assert (victim / "keep.txt").read_text() == "still here"
    assert not (agent.workspace / "pwned").exists()


async def test_a_skills_directory_in_a3s_code_format(workspace: Path, tmp_path: Path, fake: FakeLLM) -> None:
    skills = tmp_path / "skills"
    (skills / "a3s-style").mkdir(parents=True)
    (skills / "a3s-style" / "SKILL.md").write_text(a3s_code_skill())
    settings = agent_settings(workspace, tmp_path / "data")
    settings.skill_dirs = [skills]
    async with running(settings) as server:
        await server.stub.Initialize(
            pb.InitializeRequest(
                config=pb.AgentConfig(
                    llm=pb.LLMConfig(provider="openai", model="fake-model", base_url=fake.base_url)
                )
            )
        )
        listed = {s.name: s for s in (await server.stub.ListSkills(pb.ListSkillsRequest())).skills}
        assert list(listed["a3s-style"].tools) == ["show-args", "greet", "weather"]
        session_id = await new_session(server)
        await server.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_name="a3s-style"))
        greeted = await _execute(server, session_id, "greet", name="Grace")
        assert greeted.output.strip() == "hello Grace"


@pytest.mark.parametrize(
    ("backend", "problems"),
    [
        (
            "{type: binary, url: 'https://example.com/tool', path: /bin/echo, retries: 3}",
            [
                "tools[0].backend.retries: unknown field 'retries' (known: args_template, path, type, url)",
                "tools[0].backend.url: downloading a program is not supported",
            ],
        ),
        ("{type: builtin}", ["tools[0].backend.type: builtin tools are A3S Code's own"]),
        ("{type: http, method: GET}", ["tools[0].backend: missing required field 'url'"]),
        (
            '{type: binary, path: /bin/echo, args_template: "\'open"}',
            ["tools[0].backend.args_template: cannot"],
        ),
        ("[binary]", ["tools[0].backend: must be a mapping with a type"]),
    ],
)
async def test_what_we_cannot_honour_is_a_load_error(
    agent: LiveServer, backend: str, problems: list[str]
) -> None:
    content = f"---\nname: odd\ntools:\n  - name: t\n    backend: {backend}\n  - name: u\n    backend: {{type: script}}\n---\nb"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent.stub.LoadSkill(pb.LoadSkillRequest(skill_name="odd", skill_content=content))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    for problem in [*problems, "tools[1].backend: missing required field 'script'"]:  # all at once
        assert problem in details, details
    assert all(line.startswith("client: tools[") for line in details.splitlines())  # the source, the tool
