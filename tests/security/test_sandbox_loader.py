"""The loader's variables (LD_PRELOAD, LD_AUDIT, LD_LIBRARY_PATH, GCONV_PATH...) in a command's
environment act only inside the sandbox: the mechanism that builds it (the shell joining the call's
cgroup, bwrap, the Landlock launcher) starts without them, and the command gets them as it starts.

A library planted in the workspace and preloaded through Initialize's `env` writes a file outside
the workspace from its constructor: run before the sandbox, it would succeed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from a3s_agent.config import SandboxSettings, Settings
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.tools.sandbox import bwrap, landlock

from ..conftest import LiveServer, running

pytestmark = [
    pytest.mark.security,
    pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the planted library"),
]

NO_BWRAP = pytest.mark.skipif(bwrap.problem() is not None, reason="no bwrap here")
MECHANISMS = [
    pytest.param(SandboxSettings(mechanism="bwrap"), marks=NO_BWRAP, id="bwrap"),
    pytest.param(  # the launcher runs first in bwrap, to make the proxy reachable
        SandboxSettings(mechanism="bwrap", network="allow", allowed_hosts=("pypi.org",)),
        marks=NO_BWRAP,
        id="bwrap-allow",
    ),
    pytest.param(
        SandboxSettings(mechanism="landlock"),
        marks=pytest.mark.skipif(landlock.problem() is not None, reason="no Landlock here"),
        id="landlock",
    ),
]

CONSTRUCTOR = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/written-by-%d", OUTSIDE, (int)getpid());
    close(open(path, O_WRONLY | O_CREAT, 0600));
    snprintf(path, sizeof path, "%s/preloaded-in-%d", WORKSPACE, (int)getpid());
    close(open(path, O_WRONLY | O_CREAT, 0600));
}
unsigned int la_version(unsigned int version) { return version; } /* an audit library too */
"""


def planted_library(workspace: Path, outside: Path) -> Path:
    source = workspace / "planted.c"
    source.write_text(CONSTRUCTOR)
    library = workspace / "libplanted.so"
    subprocess.run(
        [
            *("cc", "-shared", "-fPIC", "-o", str(library), str(source)),
            f'-DOUTSIDE="{outside}"',
            f'-DWORKSPACE="{workspace}"',
        ],
        check=True,
        timeout=60,
    )
    return library


def names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.fixture(params=MECHANISMS)
async def served(
    request: pytest.FixtureRequest, workspace: Path, tmp_path: Path
) -> AsyncIterator[LiveServer]:
    settings = Settings(
        listen="127.0.0.1:0",
        workspace=workspace,
        data_dir=tmp_path / "data",
        sandbox=request.param,
    )
    async with running(settings) as live:
        yield live


@pytest.mark.parametrize("variable", ["LD_PRELOAD", "LD_AUDIT"])
async def test_a_preloaded_library_runs_only_inside_the_sandbox(
    served: LiveServer, workspace: Path, tmp_path: Path, variable: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    library = planted_library(workspace, outside)
    await served.stub.Initialize(pb.InitializeRequest(env={variable: str(library)}))
    reply = await served.stub.ExecuteTool(
        pb.ExecuteToolRequest(tool_name="bash", arguments=json.dumps({"command": f"echo ${variable}"}))
    )
    assert reply.result.success, reply.result.error
    assert reply.result.output == f"{library}\n"  # the command still gets it
    assert names(outside) == []  # nothing ran where it could write there
    assert any(name.startswith("preloaded-in-") for name in names(workspace))  # it ran, in the sandbox
