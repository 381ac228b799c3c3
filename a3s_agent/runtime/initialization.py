"""What Initialize set, and the form it is stored in so that it survives a restart.

Nothing secret reaches the disk: the LLM's api_key is never stored (nor an LLM config whose
base_url carries credentials), of `env` and `tool_config` only the names of secret-looking
entries are kept, not their values (see `withheld`), and of MCP servers with credentials only their
names. The host gives those again with its next Initialize.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..base.models import LLMConfig
from ..base.secrets import is_secret_name
from ..core.loop.budget import parse_budget
from ..llm.redact import url_secrets
from ..tools.mcp.config import storable

STORED_VERSION = 1
TOKEN_BUDGET_KEY = "token_budget"
"""The `config.custom` key of the server-wide token budget (core/loop/budget.py); other keys are ignored."""
SANDBOX_NETWORK_KEY = "sandbox_network"
"""The `config.custom` key narrowing the network commands get (off, on, allow:host,...): within the
operator's --sandbox-network only (tools/sandbox/)."""


@dataclass(frozen=True)
class InitializeRequest:
    """What an Initialize call asks for. Empty `workspace` and `log_level` keep the current ones;
    `llm` None (or empty) leaves the model to the server's settings."""

    workspace: str = ""
    llm: LLMConfig | None = None
    enabled_tools: list[str] = field(default_factory=list)
    disabled_tools: list[str] = field(default_factory=list)
    tool_config: dict[str, str] = field(default_factory=dict)
    log_level: str = ""
    env: dict[str, str] = field(default_factory=dict)
    custom: dict[str, str] = field(default_factory=dict)
    """`config.custom`: of its keys only TOKEN_BUDGET_KEY, SANDBOX_NETWORK_KEY, VISION_MODELS_KEY
    (llm/vision.py) and MCP_SERVERS_KEY (runtime/mcp.py) mean something here."""


def token_budget(custom: Mapping[str, str]) -> int:
    """The server-wide token budget an Initialize's `config.custom` sets (0: none)."""
    if TOKEN_BUDGET_KEY not in custom:
        return 0
    return parse_budget(custom[TOKEN_BUDGET_KEY], f"config.custom.{TOKEN_BUDGET_KEY}")


@dataclass
class Initialization:
    """What the last Initialize call set (empty until one is made)."""

    workspace: str = ""  # the directory an Initialize chose (resolved); "" while none did
    llm: LLMConfig | None = None
    env: dict[str, str] = field(default_factory=dict)
    enabled_tools: list[str] = field(default_factory=list)
    disabled_tools: list[str] = field(default_factory=list)
    tool_config: dict[str, str] = field(default_factory=dict)
    log_level: str = ""  # a logging level name an Initialize set; "" while none did
    token_budget: int = 0  # the cap on each session's total tokens, unless its own; 0: none
    vision_models: str = ""  # which models take images, besides their families' defaults (llm/vision.py)
    mcp_servers: dict[str, dict[str, Any]] = field(default_factory=dict)  # config.custom's (runtime/mcp.py)
    sandbox_network: str = ""  # the network commands get, narrowed from the operator's ("": as it is)

    def to_storable(self, marked: frozenset[str]) -> dict[str, Any]:
        """The JSON-ready stored form; `marked` are the names the operator marks secret."""
        env, env_withheld = _split(self.env, marked)
        tool_config, config_withheld = _split(self.tool_config, marked)
        keep_llm = self.llm is not None and not url_secrets(self.llm.base_url)
        servers, servers_withheld = storable(self.mcp_servers, marked)
        return {
            "version": STORED_VERSION,
            "workspace": self.workspace,
            "llm": asdict(self.llm.without_secret()) if keep_llm and self.llm is not None else None,
            "llm_withheld": self.llm is not None and not keep_llm,
            "env": env,
            "env_withheld": env_withheld,
            "enabled_tools": list(self.enabled_tools),
            "disabled_tools": list(self.disabled_tools),
            "tool_config": tool_config,
            "tool_config_withheld": config_withheld,
            "log_level": self.log_level,
            "token_budget": self.token_budget,
            "vision_models": self.vision_models,
            "mcp_servers": servers,
            "mcp_servers_withheld": servers_withheld,
            "sandbox_network": self.sandbox_network,
        }

    @classmethod
    def from_storable(cls, data: dict[str, Any]) -> Initialization:
        """The stored form back (without what was withheld; see `withheld_names`)."""
        if data.get("version") != STORED_VERSION:
            raise ValueError(f"stored Initialize has version {data.get('version')!r}, not {STORED_VERSION}")
        llm = data.get("llm")
        return cls(
            workspace=data.get("workspace", ""),
            llm=LLMConfig(**llm) if llm is not None else None,
            env=dict(data.get("env", {})),
            enabled_tools=list(data.get("enabled_tools", [])),
            disabled_tools=list(data.get("disabled_tools", [])),
            tool_config=dict(data.get("tool_config", {})),
            log_level=data.get("log_level", ""),
            token_budget=data.get("token_budget", 0),
            vision_models=data.get("vision_models", ""),
            mcp_servers=dict(data.get("mcp_servers", {})),
            sandbox_network=data.get("sandbox_network", ""),
        )


def withheld_names(data: dict[str, Any]) -> list[str]:
    """What the stored form left out, for the log line at restore: env names, tool_config keys."""
    names = [f"env {name}" for name in data.get("env_withheld", [])]
    names += [f"tool_config {name}" for name in data.get("tool_config_withheld", [])]
    names += [f"MCP server {name} (it carries credentials)" for name in data.get("mcp_servers_withheld", [])]
    if data.get("llm_withheld"):
        names.append("config.llm (its base_url carries credentials)")
    return names


def withheld(name: str, marked: frozenset[str]) -> bool:
    """Whether only the name of an env or tool_config entry is stored: a name is_secret_name
    matches or the operator marked."""
    return is_secret_name(name, marked)


def _split(values: dict[str, str], marked: frozenset[str]) -> tuple[dict[str, str], list[str]]:
    """(the entries stored with their values, the names stored without)."""
    kept = {name: value for name, value in values.items() if not withheld(name, marked)}
    return kept, sorted(set(values) - set(kept))
