"""The built-in system prompt, used when a session has none of its own."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_SYSTEM_PROMPT = """You are a3s-agent, a coding agent working in the workspace directory {workspace}.
You can read, search, edit and create files, run commands and use git through the tools you are given.
Work step by step: look at the relevant files before changing them, make focused changes, and check
your work (run the tests or the program) when you can. Paths are relative to the workspace; you cannot
reach outside it. When a tool fails, read its error and correct the call instead of repeating it.
When you are done, answer with a short summary of what you did and anything left open."""


def system_prompt(own: str, workspace: str, skills: Sequence[tuple[str, str]] = ()) -> str:
    """The session's prompt (or the default), then the instructions of each loaded skill."""
    parts = [own or DEFAULT_SYSTEM_PROMPT.format(workspace=workspace)]
    parts += [f"## Skill: {name}\n{instructions}" for name, instructions in skills if instructions.strip()]
    return "\n\n".join(parts)
