"""Application: the services every face calls, built over one Runtime."""

from __future__ import annotations

from ..core.store.a2a_tasks import A2aTaskTable
from ..runtime import Runtime
from .agentic import Agentic
from .asking import Asking
from .checkpoints import Checkpoints
from .context import Context
from .control import Control
from .cron import CronJobs
from .events import Events
from .generation import Generation
from .harness import Harness
from .history import History
from .lifecycle import Lifecycle
from .lsp import Lsp
from .mcp_servers import McpServerAdmin
from .memory import Memories
from .observability import Observability
from .permissions import Permissions
from .planning import Planning
from .providers import Providers
from .push import Push
from .sessions import Sessions
from .skills import Skills
from .spaces import Spaces
from .subagents import Subagents
from .todos import Todos
from .tools import Tools


class Application:
    """One service per group of operations. Holds no state of its own: two built over the same
    runtime behave as one."""

    def __init__(self, runtime: Runtime) -> None:
        self.lifecycle = Lifecycle(runtime)
        self.sessions = Sessions(runtime)
        self.context = Context(runtime)
        self.generation = Generation(runtime)
        self.tools = Tools(runtime)
        self.skills = Skills(runtime)
        self.events = Events(runtime)
        self.control = Control(runtime)
        self.permissions = Permissions(runtime)
        self.spaces = Spaces(runtime)
        self.harness = Harness(runtime)
        self.history = History(runtime)
        self.mcp_servers = McpServerAdmin(runtime)
        self.todos = Todos(runtime)
        self.memory = Memories(runtime)
        self.observability = Observability(runtime)
        self.lsp = Lsp(runtime)
        self.cron = CronJobs(runtime)
        self.providers = Providers(runtime)
        self.planning = Planning(runtime)
        self.subagents = Subagents(runtime)
        self.agentic = Agentic(runtime, self.generation, self.planning, self.subagents)
        self.checkpoints = Checkpoints(runtime)
        self.asking = Asking(runtime, self.generation, self.control)
        self.push = Push(runtime)
        self.a2a_tasks: A2aTaskTable = runtime.store.a2a_tasks
        """The A2A face's tasks, kept in the session store."""
        self._runtime = runtime

    @property
    def max_request_messages(self) -> int:
        """The most messages one request may carry (a generation's or a new session's history)."""
        return self._runtime.settings.max_request_messages
