"""The ACP face: a3s-agent as an Agent Client Protocol agent for editors (`a3s-agent acp`).

serve.py runs it on stdio, agent.py answers the editor's requests, turn.py runs one prompt and
tool_calls.py (with describe.py) reports its tool calls, permissions.py asks the editor's
permission, editor.py routes file and shell tools through the editor, tools.py and plan.py make
the process's tools, content.py and replay.py convert messages, outbox.py orders the updates.
"""

from .serve import run_acp

__all__ = ["run_acp"]
