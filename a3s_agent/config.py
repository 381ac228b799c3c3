"""Server settings: command-line flags > environment > defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .core.models import LLMConfig

DEFAULT_LISTEN = "0.0.0.0:4088"
DEFAULT_HTTP_LISTEN = "0.0.0.0:4089"
DEFAULT_MAX_SESSIONS = 1000
DEFAULT_MAX_GENERATIONS = 256
DEFAULT_MAX_TOOLS_PER_REQUEST = 50
DEFAULT_MAX_CONTEXT_TOKENS = 128_000
DEFAULT_GRACE_SECONDS = 10.0
DEFAULT_LLM_TIMEOUT_S = 120.0
DEFAULT_LLM_RETRIES = 3
BOX_SKILLS_DIR = Path("/a3s/skills")  # A3S Box mounts skills here, read-only


@dataclass
class Settings:
    listen: str = DEFAULT_LISTEN
    http_listen: str = DEFAULT_HTTP_LISTEN  # HOST:PORT of the HTTP face, or "off"
    auth_token: str = ""  # when set, callers must send `authorization: Bearer <token>`
    coven_gateway: str = ""  # HOST:PORT of a coven gateway to serve as an agent, alongside the server
    workspace: Path = field(default_factory=Path.cwd)
    data_dir: Path | None = None
    log_level: str = "INFO"
    llm: LLMConfig = field(default_factory=LLMConfig)
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_generations: int = DEFAULT_MAX_GENERATIONS
    max_tools_per_request: int = DEFAULT_MAX_TOOLS_PER_REQUEST
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    llm_timeout_s: float = DEFAULT_LLM_TIMEOUT_S
    llm_retries: int = DEFAULT_LLM_RETRIES
    skill_dirs: list[Path] = field(default_factory=list)
    llm_tool_mode: Literal["native", "text"] = "native"  # the default of LLM configs without +text/+native
    relay_dir: str = ""

    def skill_dirs_for(self, workspace: Path) -> list[Path]:
        """Where skills are found: configured dirs, then the workspace's own, then Box's mount."""
        return [*self.skill_dirs, workspace / ".a3s" / "skills", BOX_SKILLS_DIR]

    @property
    def resolved_data_dir(self) -> Path:
        """The data directory; `<workspace>/.a3s` unless set."""
        return (self.data_dir or self.workspace / ".a3s").resolve()


def llm_from_env(env: Mapping[str, str]) -> LLMConfig:
    """Server-level LLM settings: A3S_LLM_* first, then the standard OPENAI_* names."""
    return LLMConfig(
        provider=env.get("A3S_LLM_PROVIDER", ""),
        model=env.get("A3S_LLM_MODEL", ""),
        api_key=env.get("A3S_LLM_API_KEY") or env.get("OPENAI_API_KEY", ""),
        base_url=env.get("A3S_LLM_BASE_URL") or env.get("OPENAI_BASE_URL", ""),
    )


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names it."""


def _number(
    env: Mapping[str, str], name: str, default: float, kind: type = int, zero_ok: bool = False
) -> float:
    value = env.get(name)
    if not value:
        return default
    try:
        number = kind(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {value!r}") from None
    if number < 0 or (number == 0 and not zero_ok):
        raise ConfigError(f"{name} must be {'zero or more' if zero_ok else 'positive'}, not {value!r}")
    return number


def settings_from(
    *,
    listen: str | None = None,
    http_listen: str | None = None,
    workspace: str | None = None,
    data_dir: str | None = None,
    log_level: str | None = None,
    max_sessions: int | None = None,
    skills_dirs: list[str] | None = None,
    auth_token: str | None = None,
    coven_gateway: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Build settings from flag values (None = not given) over the environment."""
    env = os.environ if env is None else env
    workspace_value = workspace or env.get("WORKSPACE")
    data_value = data_dir or env.get("A3S_DATA_DIR")
    return Settings(
        listen=listen or env.get("LISTEN_ADDR") or DEFAULT_LISTEN,
        http_listen=http_listen or env.get("A3S_HTTP_LISTEN") or DEFAULT_HTTP_LISTEN,
        auth_token=auth_token or env.get("A3S_AUTH_TOKEN", ""),
        coven_gateway=coven_gateway or env.get("A3S_COVEN_GATEWAY", ""),
        workspace=Path(workspace_value).resolve() if workspace_value else Path.cwd(),
        data_dir=Path(data_value) if data_value else None,
        log_level=(log_level or env.get("A3S_LOG_LEVEL") or "INFO").upper(),
        llm=llm_from_env(env),
        max_sessions=max_sessions or int(_number(env, "A3S_MAX_SESSIONS", DEFAULT_MAX_SESSIONS)),
        max_generations=int(_number(env, "A3S_MAX_GENERATIONS", DEFAULT_MAX_GENERATIONS)),
        llm_timeout_s=_number(env, "A3S_LLM_TIMEOUT_S", DEFAULT_LLM_TIMEOUT_S, float),
        llm_retries=int(_number(env, "A3S_LLM_RETRIES", DEFAULT_LLM_RETRIES, zero_ok=True)),
        llm_tool_mode="text" if env.get("A3S_LLM_TOOL_MODE", "").lower() == "text" else "native",
        relay_dir=env.get("A3S_RELAY_DIR", ""),
        skill_dirs=[
            Path(p) for p in [*(skills_dirs or []), *env.get("A3S_SKILL_DIRS", "").split(os.pathsep)] if p
        ],
    )
