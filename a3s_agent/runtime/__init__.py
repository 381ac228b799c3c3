"""The runtime: the one place that builds the engine's parts from Settings and owns them.

runtime.py is the Runtime (the store, sessions, tools, control, events, providers, Agent Spaces; the
agent loop's AgentHost), initialization.py what Initialize set and how it is stored, mcp.py the MCP
servers each session uses, providers.py the provider for an LLM config, runs.py generations that
outlive their caller, replicas.py leases and control routed to the replica that owns a run,
warmup.py the warm-up after ready. Faces never see it: they are given the application layer
(app/), which is built over one Runtime.
"""

from .runtime import AgentInfo, Runtime

__all__ = ["AgentInfo", "Runtime"]
