"""Who the agent is to the gateway: its stable id and the RegisterAgent message."""

from __future__ import annotations

import platform
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path

from ...proto import coven_pb2 as pb
from .git import git_info

AGENT_ID_FILE = "coven-agent-id"
BACKEND = "direct"
PROTOCOL_FEATURES = ("token_usage", "tool_states", "injection", "cancellation")


def stored_agent_id(data_dir: Path) -> str:
    """The id kept in `<data_dir>/coven-agent-id`, created (a UUID) on first use: the gateway
    knows the agent by it, so it must survive restarts."""
    path = data_dir / AGENT_ID_FILE
    try:
        existing = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return existing
    agent_id = str(uuid.uuid4())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(agent_id + "\n", encoding="utf-8")
    return agent_id


async def registration(
    agent_id: str, name: str, capabilities: Sequence[str], workspaces: Sequence[str], workspace: Path
) -> pb.RegisterAgent:
    """RegisterAgent with fresh metadata (git state changes between reconnects)."""
    metadata = pb.AgentMetadata(
        working_directory=str(workspace),
        hostname=socket.gethostname(),
        os=platform.system().lower(),
        workspaces=list(workspaces),
        backend=BACKEND,
    )
    git = await git_info(workspace)
    if git is not None:
        metadata.git.CopyFrom(git)
    return pb.RegisterAgent(
        agent_id=agent_id,
        name=name,
        capabilities=list(capabilities),
        metadata=metadata,
        protocol_features=list(PROTOCOL_FEATURES),
    )
