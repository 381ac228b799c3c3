"""The later dialect's own RPCs over HTTP: for each group later_service.SERVED lists, the module of
its handlers (the gRPC face's later_only.SERVICES, in plain forms). methods.py serves them at
/rpc/<Method> (and over /ws) in the later dialect's messages (later_schema.py)."""

from __future__ import annotations

from .. import later_service as groups
from . import (
    later_agentic,
    later_cron,
    later_lsp,
    later_memory,
    later_planning,
    later_providers,
    later_session,
    later_skills,
)
from .rpc_table import Handler, Handlers, StreamHandler

SERVED: dict[groups.Group, Handlers] = {
    groups.HISTORY: later_session.HANDLERS,
    groups.TODOS: later_session.HANDLERS,
    groups.MCP: later_session.HANDLERS,
    groups.OBSERVABILITY: later_session.HANDLERS,
    groups.LSP: later_lsp.HANDLERS,
    groups.MEMORY: later_memory.HANDLERS,
    groups.CRON: later_cron.HANDLERS,
    groups.SKILLS: later_skills.HANDLERS,
    groups.PROVIDERS: later_providers.HANDLERS,
    groups.PLANNING: later_planning.HANDLERS,
    groups.AGENTIC: later_agentic.HANDLERS,
}


def _handlers() -> dict[str, Handler | StreamHandler]:
    """Every served RPC's handler; a group with an RPC and no handler fails the import."""
    found: dict[str, Handler | StreamHandler] = {}
    for group in groups.SERVED:
        missing = [name for name in group.methods if name not in SERVED[group]]
        if missing:
            raise ImportError(f"the {group.name} group has no HTTP handler for {', '.join(missing)}")
        found.update((name, SERVED[group][name]) for name in group.methods)
    return found


HANDLERS = _handlers()
