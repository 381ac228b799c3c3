"""The tools of `a3s-agent acp`: the built-in ones, file and shell tools routed through the editor
(editor.py), the plan tool (plan.py), and not ask_user: an editor asks its user in the chat (the
model ends its turn with the question), and nobody would answer ask_user's external task. Nor todo:
the plan tool is the list an editor shows."""

from __future__ import annotations

from collections.abc import Callable

from ...app.tool_kit import ToolRegistry, builtin_tools
from . import editor as through
from .editor import Editor, Remote, routed
from .plan import update_plan

LEFT_OUT = frozenset({"ask_user", "todo"})


def acp_registry(editor: Editor) -> ToolRegistry:
    routes: dict[str, tuple[Remote, Callable[[Editor], bool]]] = {
        "read_file": (through.read_file, lambda e: e.reads),
        "write_file": (through.write_file, lambda e: e.writes),
        "edit_file": (through.edit_file, lambda e: e.reads and e.writes),
        "bash": (through.bash, lambda e: e.terminals),
    }
    tools = [
        routed(tool, *routes[tool.name], editor) if tool.name in routes else tool
        for tool in builtin_tools()
        if tool.name not in LEFT_OUT
    ]
    return ToolRegistry([*tools, update_plan])
