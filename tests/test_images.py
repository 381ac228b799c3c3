"""read_file of an image: the image itself for a model that takes images, a description for one that
does not, never a base64 dump; through the real gRPC server (and the HTTP face) to the fake LLM,
which refuses images as OpenAI does (only in user messages, only for vision models, only real
PNG/JPEG/GIF/WebP data) and a user message right after a tool message as Mistral does."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from a3s_agent.llm.messages import tool_images_after_results
from a3s_agent.llm.vision import NOT_SHOWN, takes_images
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, call, text, tool_call, tool_calls
from a3s_agent.tools.files import TOOLS
from a3s_agent.tools.images import MAX_IMAGE_BYTES, image_of
from a3s_agent.tools.registry import ToolContext, ToolOutput, ToolRegistry

from .conftest import LiveServer, agent_settings, new_session, running, user
from .test_http import serving

REGISTRY = ToolRegistry(TOOLS)
IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lGODlhAQABAAAAACw="}}
BAD_IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}
CALL_AND_RESULT: list[dict[str, Any]] = [
    {"role": "user", "content": "read it"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    ]},
    {"role": "tool", "tool_call_id": "c1", "content": "done"},
]  # fmt: skip


# ---------------------------------------------------------------- images, made byte by byte


def png(width: int = 3, height: int = 2) -> bytes:
    """A real PNG: RGB, every pixel red."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def jpeg(width: int, height: int) -> bytes:
    """A JPEG's segments up to its frame header, with an Exif segment first (as cameras write)."""
    exif = b"Exif\x00\x00" + bytes(300)
    app1 = b"\xff\xe1" + struct.pack(">H", len(exif) + 2) + exif
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app1 + sof0 + b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00" + bytes(16) + b"\xff\xd9"


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00;"


def webp(kind: bytes, width: int, height: int) -> bytes:
    if kind == b"VP8 ":
        body = b"\x00\x00\x00\x9d\x01\x2a" + struct.pack("<HH", width, height)
    elif kind == b"VP8L":
        body = b"\x2f" + struct.pack("<I", (width - 1) | (height - 1) << 14)
    else:
        body = b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    data = b"WEBP" + kind + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", len(data)) + data


async def read(workspace: Path, path: str, **arguments: Any) -> ToolOutput:
    return await REGISTRY.run(
        "read_file", json.dumps({"path": path, **arguments}), ToolContext(workspace=workspace)
    )


# ---------------------------------------------------------------- read_file


@pytest.mark.parametrize(
    ("data", "kind", "size"),
    [
        (png(3, 2), "image/png", (3, 2)),
        (jpeg(640, 480), "image/jpeg", (640, 480)),
        (gif(16, 9), "image/gif", (16, 9)),
        (webp(b"VP8 ", 300, 200), "image/webp", (300, 200)),
        (webp(b"VP8L", 1024, 768), "image/webp", (1024, 768)),
        (webp(b"VP8X", 7000, 5), "image/webp", (7000, 5)),
    ],
)
async def test_an_image_is_attached_with_a_line_describing_it(
    workspace: Path, data: bytes, kind: str, size: tuple[int, int]
) -> None:
    (workspace / "picture").write_bytes(data)  # no extension: the content decides
    result = await read(workspace, "picture")
    assert result.success, result.error
    [attached] = result.attachments
    assert (attached.kind, attached.mime_type, attached.content, attached.name) == (
        "image",
        kind,
        data,
        "picture",
    )
    width, height = size
    assert (
        result.output
        == f"picture is a {kind.split('/')[1].upper().replace('WEBP', 'WebP')} image, {width}x{height} pixels, {len(data)} bytes."
    )
    assert result.metadata | {"duration_ms": 0} == {
        "bytes": len(data),
        "mime_type": kind,
        "width": width,
        "height": height,
        "image_attached": True,
        "truncated": False,
        "duration_ms": 0,
    }


async def test_the_content_decides_not_the_name(workspace: Path) -> None:
    (workspace / "fake.png").write_text("just text\n")
    (workspace / "real.txt").write_bytes(png())
    (workspace / "cut.png").write_bytes(png()[:20])  # the magic, but no whole header
    text_file = await read(workspace, "fake.png")
    assert text_file.success and "just text" in text_file.output and not text_file.attachments
    image = await read(workspace, "real.txt")
    assert image.attachments and image.metadata["mime_type"] == "image/png"
    cut = await read(workspace, "cut.png")
    assert not cut.success and "binary" in cut.error and not cut.attachments
    # encoding="base64" still returns the raw bytes, and nothing else
    raw = await read(workspace, "real.txt", encoding="base64")
    assert base64.b64decode(raw.output) == png() and not raw.attachments


async def test_an_image_beyond_the_providers_limits_is_described_not_attached(workspace: Path) -> None:
    (workspace / "huge.png").write_bytes(png(10, 10) + bytes(MAX_IMAGE_BYTES))
    (workspace / "wide.gif").write_bytes(gif(9000, 10))
    (workspace / "fits.png").write_bytes(png(10, 10) + bytes(MAX_IMAGE_BYTES - len(png(10, 10))))
    for name in ("huge.png", "wide.gif"):
        result = await read(workspace, name)
        assert result.success and not result.attachments and result.metadata["image_attached"] is False
        assert "too large to be shown: images up to 3932160 bytes and 8000 pixels a side are" in result.output
    fits = await read(workspace, "fits.png")
    assert len(fits.attachments[0].content) == MAX_IMAGE_BYTES


@pytest.mark.parametrize(
    "data",
    [
        b"\x89PNG\r\n\x1a\n" + bytes(8),  # no IHDR
        b"\xff\xd8\xff\xda" + bytes(20),  # scan data before any frame header
        b"\xff\xd8\xff\xe1\xff\xff" + bytes(10),  # a segment longer than the file
        b"RIFF\x00\x00\x00\x00WEBPVP8 " + bytes(6),  # no start code
        b"GIF89a\x00\x00\x01\x00",  # zero width
        b"GIF8",
    ],
)
def test_broken_headers_are_no_image(data: bytes) -> None:
    assert image_of(data) is None


# ---------------------------------------------------------------- which models take images


@pytest.mark.parametrize(
    "model",
    ["gpt-4o", "gpt-4o-mini", "openai/gpt-4.1", "gpt-5-mini", "o3", "o4-mini", "o1", "claude-3-5-sonnet-latest",
     "claude-sonnet-4-5", "claude-opus-4-1", "gemini-2.5-flash", "llava:13b", "qwen2.5vl:7b", "Qwen/Qwen2.5-VL-7B-Instruct",
     "pixtral-12b-2409", "llama3.2-vision", "meta-llama/Llama-4-Scout-17B-16E-Instruct"],
)  # fmt: skip
def test_vision_families_take_images(model: str) -> None:
    assert takes_images(model)


@pytest.mark.parametrize(
    "model",
    ["fake-model", "gpt-3.5-turbo", "gpt-4", "gpt-4-turbo-preview", "o1-mini", "o3-mini", "deepseek-chat",
     "claude-2.1", "qwen2.5-coder:7b", "devstral", "mistral-large-latest", "llama3.1:8b", "gpt-oss-20b"],
)  # fmt: skip
def test_other_models_do_not(model: str) -> None:
    assert not takes_images(model)


def test_the_override_s_last_matching_pattern_decides() -> None:
    assert takes_images("my-vlm", "my-*")
    assert not takes_images("gpt-4o-mini", "gpt-4o*, !gpt-4o-mini")
    assert takes_images("gpt-4o-mini", "!gpt-4o-mini, gpt-4o*")
    assert not takes_images("gemini-2.5-pro", "!*") and takes_images("anything", "*")
    assert takes_images("gpt-4o", "my-vlm")  # a model no pattern matches keeps its family's default


# ---------------------------------------------------------------- Chat Completions wire form


def test_images_of_a_run_of_tool_results_follow_the_run_in_one_user_message() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "look"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": "{}"}}
                for n, name in enumerate(["read_file", "grep", "read_file"])
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": [{"type": "text", "text": "a.png is..."}, image]},
        {"role": "tool", "tool_call_id": "c1", "content": "no matches"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "b.png is..."}, image]},
        {"role": "assistant", "content": "Two images."},
    ]
    wire = tool_images_after_results(messages)
    assert [m["role"] for m in wire] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert [m["content"] for m in wire[2:5]] == ["a.png is...", "no matches", "b.png is..."]
    assert wire[6]["content"] == [
        {"type": "text", "text": "The result of read_file (call c0):"},
        image,
        {"type": "text", "text": "The result of read_file (call c2):"},
        image,
    ]
    assert tool_images_after_results(messages[:2]) is not None and wire[:2] == messages[:2]


@pytest.mark.parametrize(
    ("dialect", "vision", "messages", "refusal"),
    [
        ("openai", True, [{"role": "user", "content": "hi"}], None),
        ("openai", True, [{"role": "user", "content": [IMAGE_PART]}], None),
        ("openai", False, [{"role": "user", "content": [IMAGE_PART]}], "image_url is only supported by certain"),
        ("openai", True, [{"role": "system", "content": [IMAGE_PART]}], "only allowed for messages with role 'user'"),
        ("openai", True, [{"role": "user", "content": [BAD_IMAGE_PART]}], "You uploaded an unsupported image"),
        ("openai", True, [*CALL_AND_RESULT, {"role": "user", "content": "next"}], None),
        ("mistral", True, [*CALL_AND_RESULT, {"role": "user", "content": "next"}], "Unexpected role 'user' after role 'tool'"),
        ("mistral", True, [*CALL_AND_RESULT, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}], None),
    ],
)  # fmt: skip
async def test_the_fake_refuses_images_and_orders_as_the_real_servers_do(
    dialect: str, vision: bool, messages: list[dict[str, Any]], refusal: str | None
) -> None:
    async with (
        FakeLLM(fallback=text("ok"), dialect=dialect, vision=vision) as fake,
        aiohttp.ClientSession() as http,
    ):
        body = {"model": "m", "messages": messages}
        async with http.post(f"{fake.base_url}/chat/completions", json=body) as response:
            answer = await response.text()
    assert (response.status == 400) == (refusal is not None), answer
    assert refusal is None or refusal in answer


# ---------------------------------------------------------------- through the server


@pytest.fixture
async def images(workspace: Path) -> dict[str, bytes]:
    files = {"logo.png": png(4, 4), "photo.jpg": jpeg(64, 48)}
    for name, data in files.items():
        (workspace / name).write_bytes(data)
    (workspace / "notes.txt").write_text("some notes\n")
    return files


async def initialize(server: LiveServer, fake: FakeLLM, model: str, **custom: str) -> None:
    await server.stub.Initialize(
        pb.InitializeRequest(
            config=pb.AgentConfig(
                llm=pb.LLMConfig(provider="openai", model=model, base_url=fake.base_url), custom=custom
            )
        )
    )


def image_urls(messages: list[dict[str, Any]]) -> list[str]:
    return [
        part["image_url"]["url"]
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize("dialect", ["openai", "mistral", "ollama-noindex"])
async def test_a_vision_model_sees_the_images_read_file_returned(
    workspace: Path, tmp_path: Path, images: dict[str, bytes], dialect: str
) -> None:
    async with (
        FakeLLM(dialect=dialect) as fake,
        running(agent_settings(workspace, tmp_path / "data")) as server,
    ):
        await initialize(server, fake, "gpt-4o")
        fake.script(
            tool_calls([
                call("read_file", {"path": "logo.png"}),
                call("read_file", {"path": "notes.txt"}),
                call("read_file", {"path": "photo.jpg"}),
            ]),
            text("A red square and a photo."),
        )  # fmt: skip
        session = await new_session(server)
        reply = await server.stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("look")]))

    assert reply.message.content == "A red square and a photo.", reply
    logo, notes, photo = reply.tool_calls
    assert logo.result.output == f"logo.png is a PNG image, 4x4 pixels, {len(images['logo.png'])} bytes."
    assert (
        logo.result.metadata["mime_type"] == "image/png" and logo.result.metadata["image_attached"] == "true"
    )
    sent = fake.requests[-1].messages
    roles = [m["role"] for m in sent]
    assert roles[-6:] == ["assistant", "tool", "tool", "tool", "assistant", "user"]  # the strict fake took it
    assert [m["content"] for m in sent[-5:-2]] == [
        logo.result.output,
        notes.result.output,
        photo.result.output,
    ]
    assert sent[-1]["content"][0] == {"type": "text", "text": f"The result of read_file (call {logo.id}):"}
    assert image_urls(sent) == [
        data_url(images["logo.png"], "image/png"),
        data_url(images["photo.jpg"], "image/jpeg"),
    ]


async def test_a_model_without_vision_gets_the_description_and_no_image(
    workspace: Path, tmp_path: Path, images: dict[str, bytes]
) -> None:
    async with (
        FakeLLM(vision=False) as fake,
        running(agent_settings(workspace, tmp_path / "data")) as server,
    ):
        await initialize(server, fake, "gpt-3.5-turbo")
        fake.script(tool_call("read_file", {"path": "logo.png"}), text("I cannot see it."))
        session = await new_session(server)
        reply = await server.stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("look")]))
        # A user's own image goes to the model as the client sent it: this model refuses it.
        attached = pb.Message(
            role=pb.Message.ROLE_USER,
            content="and this?",
            attachments=[pb.Attachment(type=pb.Attachment.TYPE_IMAGE, mime_type="image/png", content=png())],
        )
        fake.script(text("unused"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await server.stub.Generate(pb.GenerateRequest(session_id=session, messages=[attached]))

    assert reply.message.content == "I cannot see it."
    tool = fake.requests[1].messages[-1]
    assert tool == {
        "role": "tool",
        "tool_call_id": reply.tool_calls[0].id,
        "content": f"{reply.tool_calls[0].result.output}\n\n{NOT_SHOWN}",
    }
    body = json.dumps(fake.requests[1].body)
    assert base64.b64encode(images["logo.png"]).decode() not in body and "image_url" not in body
    assert "image_url is only supported by certain models" in refused.value.details()


async def test_the_vision_models_setting_overrides_the_family_default(
    workspace: Path, tmp_path: Path, images: dict[str, bytes]
) -> None:
    async with FakeLLM() as fake, running(agent_settings(workspace, tmp_path / "data")) as server:
        await initialize(server, fake, "fake-model", vision_models="fake-*")
        fake.script(tool_call("read_file", {"path": "logo.png"}), text("seen"))
        await server.stub.Generate(
            pb.GenerateRequest(session_id=await new_session(server), messages=[user("a")])
        )
        assert image_urls(fake.requests[-1].messages) == [data_url(images["logo.png"], "image/png")]

        await initialize(server, fake, "gpt-4o", vision_models="!gpt-4o")
        fake.script(tool_call("read_file", {"path": "logo.png"}), text("not seen"))
        await server.stub.Generate(
            pb.GenerateRequest(session_id=await new_session(server), messages=[user("b")])
        )
        assert image_urls(fake.requests[-1].messages) == []

        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await initialize(server, fake, "gpt-4o", vision_models="gpt-4o, !")
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "config.custom.vision_models" in bad.value.details()


async def test_execute_tool_gives_the_description_and_the_stored_session_keeps_the_image(
    workspace: Path, tmp_path: Path, images: dict[str, bytes]
) -> None:
    """Over gRPC and HTTP a client gets the line describing the image (and its metadata), as the
    wire's ToolResult has no place for the image; the session's history keeps it, across a restart."""
    data = tmp_path / "data"
    async with FakeLLM() as fake:
        async with running(agent_settings(workspace, data)) as server:
            await initialize(server, fake, "gpt-4o")
            session = await new_session(server)
            ran = await server.stub.ExecuteTool(
                pb.ExecuteToolRequest(
                    session_id=session, tool_name="read_file", arguments='{"path": "logo.png"}'
                )
            )
            async with serving(server) as http:
                over_http = await http.client.post(
                    f"/sessions/{session}/tools/read_file", json={"path": "logo.png"}
                )
                result = (await over_http.json())["result"]
        assert ran.result.success and ran.result.output == result["output"]
        assert ran.result.output == f"logo.png is a PNG image, 4x4 pixels, {len(images['logo.png'])} bytes."
        assert dict(ran.result.metadata) | {"duration_ms": ""} == {
            "bytes": str(len(images["logo.png"])),
            "mime_type": "image/png",
            "width": "4",
            "height": "4",
            "image_attached": "true",
            "truncated": "false",
            "duration_ms": "",
        }
        assert result["metadata"]["width"] == "4"

        async with running(agent_settings(workspace, data)) as server:
            await initialize(server, fake, "gpt-4o")
            fake.script(text("It is red."))
            await server.stub.Generate(
                pb.GenerateRequest(session_id=session, messages=[user("what was it?")])
            )
    # Both recorded calls, the gRPC one and the HTTP one, went to the model with their image.
    assert image_urls(fake.requests[-1].messages) == [data_url(images["logo.png"], "image/png")] * 2


@pytest.mark.parametrize(
    ("model", "cost"), [("gpt-4o", 765), ("claude-sonnet-4-5", 1399), ("llava:13b", 765)]
)
async def test_the_context_usage_counts_an_image_by_its_size(live: LiveServer, model: str, cost: int) -> None:
    """A 1024x1024 image: 765 tokens for OpenAI (four 512-pixel tiles of its 768x768 scaling), 1399
    for Anthropic (1024 * 1024 / 750); a session of screenshots reaches its compaction threshold then."""
    picture = pb.Attachment(
        type=pb.Attachment.TYPE_IMAGE, name="shot.png", mime_type="image/png", content=png(1024, 1024)
    )
    usages = []
    for attachments in ([], [picture], [picture, picture]):
        message = pb.Message(
            role=pb.Message.ROLE_USER, content="what is on the screen?", attachments=attachments
        )
        created = await live.stub.CreateSession(
            pb.CreateSessionRequest(
                config=pb.SessionConfig(llm=pb.LLMConfig(provider="openai", model=model)),
                initial_context=[message],
            )
        )
        reply = await live.stub.GetContextUsage(pb.GetContextUsageRequest(session_id=created.session_id))
        usages.append(reply.usage.prompt_tokens)
    assert [usage - usages[0] for usage in usages] == [0, cost, 2 * cost]
