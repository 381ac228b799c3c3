"""What Initialize set, and the form it is stored in so that it survives a restart.

Nothing secret reaches the disk: the LLM's api_key is never stored (nor an LLM config whose
base_url carries credentials), and of `env` and `tool_config` only the names of secret-looking
entries are kept, not their values (see `withheld`). The host gives those again with its next
Initialize.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..base.models import LLMConfig
from ..base.secrets import is_secret_name
from ..llm.redact import url_secrets

STORED_VERSION = 1


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

    def to_storable(self, marked: frozenset[str]) -> dict[str, Any]:
        """The JSON-ready stored form; `marked` are the names the operator marks secret."""
        env, env_withheld = _split(self.env, marked)
        tool_config, config_withheld = _split(self.tool_config, marked)
        keep_llm = self.llm is not None and not url_secrets(self.llm.base_url)
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
        )


def withheld_names(data: dict[str, Any]) -> list[str]:
    """What the stored form left out, for the log line at restore: env names, tool_config keys."""
    names = [f"env {name}" for name in data.get("env_withheld", [])]
    names += [f"tool_config {name}" for name in data.get("tool_config_withheld", [])]
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
