"""The ACP face: a3s-agent as an Agent Client Protocol agent for editors (`a3s-agent acp`).

serve.py runs it on stdio, agent.py answers the editor's requests, turn.py runs one prompt and
tool_calls.py (with describe.py) reports its tool calls, permissions.py asks the editor's
permission, editor.py routes file and shell tools through the editor, tools.py and plan.py make
the process's tools, content.py and replay.py convert messages, outbox.py orders the updates. A client asking for
protocol 2 is served by v2.py over v2_wire.py instead (the SDK speaks v1 only).
"""

from .serve import run_acp

__all__ = ["run_acp"]
