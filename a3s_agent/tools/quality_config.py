"""Which configuration the formatters and linters read: the workspace's own, and only if it runs nothing.

Left alone, each tool looks for configuration in every directory above the file (up to / and
the home directory), and some configuration runs code or reads any file:

- ruff: the nearest `.ruff.toml`, `ruff.toml` or `pyproject.toml` with `[tool.ruff]` between the
  file and the workspace root is passed with `--config` (ruff runs in its directory, where its
  relative paths point); its `extend` chain must stay inside the workspace. None: `--isolated`.
- prettier: the nearest static configuration (`.prettierrc` YAML/JSON/TOML, `package.json`'s
  "prettier" object) with `--config`, refused when it loads plugins or names a shared
  configuration (both are JavaScript); JavaScript/TypeScript configuration files are refused.
  None: `--no-config`. `.editorconfig` is not used (`--no-editorconfig`).
- shellcheck: `--rcfile` with the nearest `.shellcheckrc` unless it enables external-sources
  (which follows `source` to files anywhere); none: `--norc`.
- shfmt: reads `.editorconfig` upwards from the file's name; it formats under a mirror directory
  holding copies of the workspace's `.editorconfig` files below one saying `root = true`.

The lookup stops at the workspace root, and a configuration file that is a symlink leading out
of the workspace is refused.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..base.jsontext import model_json
from .registry import ToolFailure
from .workspace_paths import relative_to_workspace, resolve_in_workspace, workspace_root

_RUFF_FILES = (".ruff.toml", "ruff.toml", "pyproject.toml")
_SHELLCHECK_FILES = (".shellcheckrc", "shellcheckrc")
# Prettier's own search order (prettier 3, src/config/prettier-config/config-searcher.js).
_PRETTIER_FILES = (
    "package.json", "package.yaml", ".prettierrc", ".prettierrc.json", ".prettierrc.yml", ".prettierrc.yaml",
    ".prettierrc.json5", ".prettierrc.js", "prettier.config.js", ".prettierrc.ts", "prettier.config.ts",
    ".prettierrc.mjs", "prettier.config.mjs", ".prettierrc.mts", "prettier.config.mts", ".prettierrc.cjs",
    "prettier.config.cjs", ".prettierrc.cts", "prettier.config.cts", ".prettierrc.toml",
)  # fmt: skip
_SCRIPT_SUFFIXES = frozenset({".js", ".mjs", ".cjs", ".ts", ".mts", ".cts"})
_EXTERNAL_SOURCES = re.compile(r"\bexternal-sources\s*=\s*(\S+)", re.IGNORECASE)
_MIRRORED_WORKSPACE = "workspace"


def _shown(workspace: Path, path: Path) -> str:
    return relative_to_workspace(workspace, path)


def _nearest(
    workspace: Path, start: Path, names: Sequence[str], wanted: Callable[[Path], bool] = lambda _: True
) -> Path | None:
    """The first of `names` (in order, directory by directory) from `start` up to the workspace
    root that `wanted` accepts, resolved; a symlink leading out of the workspace is refused."""
    root = workspace_root(workspace)
    directory = start
    while True:
        for name in names:
            candidate = directory / name
            if candidate.is_file():
                inside = resolve_in_workspace(workspace, str(candidate), field="configuration file")
                if wanted(inside):
                    return inside
        if directory == root or directory == directory.parent:
            return None
        directory = directory.parent


def _read(workspace: Path, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolFailure(f"cannot read the configuration file {_shown(workspace, path)}: {exc}") from exc


def _parsed(workspace: Path, path: Path, loader: Callable[[str], Any]) -> Any:
    text = _read(workspace, path)
    try:
        return loader(text)
    except (ValueError, yaml.YAMLError) as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ToolFailure(f"the configuration file {_shown(workspace, path)} does not parse: {exc}") from exc
    except RecursionError:  # TOML or YAML nested some thousand levels deep
        raise ToolFailure(f"the configuration file {_shown(workspace, path)} is nested too deeply") from None


# --- ruff -----------------------------------------------------------------------------------


def _ruff_table(workspace: Path, path: Path) -> dict[str, Any] | None:
    """The ruff settings in a ruff.toml or pyproject.toml; None for a pyproject.toml without them."""
    data: dict[str, Any] = _parsed(workspace, path, tomllib.loads)
    if path.name != "pyproject.toml":
        return data
    tool = data.get("tool")
    ruff = tool.get("ruff") if isinstance(tool, dict) else None
    return ruff if isinstance(ruff, dict) else None


def _check_ruff_extends(workspace: Path, config: Path) -> None:
    """Follow `extend` from config: every file it names must be inside the workspace."""
    seen: set[Path] = set()
    current = config
    while current not in seen:  # a cycle is ruff's to report
        seen.add(current)
        extend = (_ruff_table(workspace, current) or {}).get("extend")
        if extend is None:
            return
        refusal = f"not using the ruff configuration {_shown(workspace, current)}: its extend = {extend!r}"
        if not isinstance(extend, str) or extend.startswith("~") or "$" in extend:
            raise ToolFailure(f"{refusal} may lead outside the workspace (ruff expands ~ and $VARIABLES)")
        try:
            current = resolve_in_workspace(workspace, str(current.parent / extend), field="extend")
        except ToolFailure as exc:
            raise ToolFailure(f"{refusal} is outside the workspace") from exc


def ruff_invocation(workspace: Path, target: Path) -> tuple[list[str], Path]:
    """Options choosing ruff's configuration for the file or directory `target`, and the
    directory to run ruff in."""
    start = target if target.is_dir() else target.parent
    config = _nearest(workspace, start, _RUFF_FILES, lambda path: _ruff_table(workspace, path) is not None)
    if config is None:
        return ["--isolated"], workspace_root(workspace)
    _check_ruff_extends(workspace, config)
    return ["--config", str(config)], config.parent


# --- prettier -------------------------------------------------------------------------------


def _prettier_loader(path: Path) -> Callable[[str], Any]:
    if path.suffix == ".toml":
        return tomllib.loads
    if path.suffix == ".json":  # also package.json
        return model_json
    return yaml.safe_load  # .prettierrc, .yaml, .yml and package.yaml


def _prettier_settings(workspace: Path, path: Path) -> Any:
    data = _parsed(workspace, path, _prettier_loader(path))
    if path.name in ("package.json", "package.yaml"):
        return data.get("prettier") if isinstance(data, dict) else None
    return data


def _is_prettier_config(workspace: Path, path: Path) -> bool:
    """As prettier decides: a package.json or package.yaml counts only with a "prettier" key."""
    if path.name not in ("package.json", "package.yaml"):
        return True
    try:
        return bool(_prettier_settings(workspace, path))
    except ToolFailure:
        return False


def _uses_plugins(settings: dict[str, Any]) -> bool:
    overrides = settings.get("overrides")
    options = (
        [o.get("options") for o in overrides if isinstance(o, dict)] if isinstance(overrides, list) else []
    )
    return any(isinstance(o, dict) and o.get("plugins") for o in [settings, *options])


def prettier_options(workspace: Path, start: Path) -> list[str]:
    """Options choosing prettier's configuration for a file in the directory `start`."""
    config = _nearest(workspace, start, _PRETTIER_FILES, lambda path: _is_prettier_config(workspace, path))
    if config is None:
        return ["--no-config", "--no-editorconfig"]
    shown = _shown(workspace, config)
    if config.suffix in _SCRIPT_SUFFIXES:
        raise ToolFailure(
            f"not using the prettier configuration {shown}: it is a program prettier would run; "
            "use a .prettierrc.json instead"
        )
    if config.suffix == ".json5":
        raise ToolFailure(
            f"format_code does not read JSON5 prettier configuration ({shown}); use .prettierrc.json"
        )
    settings = _prettier_settings(workspace, config)
    if isinstance(settings, str):
        raise ToolFailure(
            f"not using the prettier configuration {shown}: it names the shared configuration "
            f"{settings!r}, a JavaScript module prettier would run"
        )
    if not isinstance(settings, dict):
        raise ToolFailure(f"the prettier configuration {shown} is not a mapping of options")
    if _uses_plugins(settings) or "plugins" in _read(workspace, config):
        raise ToolFailure(
            f"not using the prettier configuration {shown}: it loads plugins, JavaScript prettier would run"
        )
    return ["--config", str(config), "--no-editorconfig"]


# --- shellcheck -----------------------------------------------------------------------------


def shellcheck_options(workspace: Path, script: Path) -> list[str]:
    """Options choosing shellcheck's configuration for `script`."""
    rc = _nearest(workspace, script.parent, _SHELLCHECK_FILES)
    if rc is None:
        return ["--norc"]
    for line in _read(workspace, rc).splitlines():
        match = _EXTERNAL_SOURCES.search(line.split("#", 1)[0])
        if match and match[1].lower() != "false":
            raise ToolFailure(
                f"not using the shellcheck configuration {_shown(workspace, rc)}: it enables "
                "external-sources, which lets shellcheck read sourced files outside the workspace"
            )
    return [f"--rcfile={rc}"]  # used instead of searching (--norc would switch it off too)


# --- shfmt (EditorConfig) -------------------------------------------------------------------


def editorconfig_mirror(workspace: Path, start: Path, mirror: Path) -> Path:
    """Copy the `.editorconfig` files from the directory `start` up to the workspace root into
    `mirror`/workspace, below a `.editorconfig` saying root = true, and return that directory:
    a file named relative to it sees exactly the workspace's EditorConfig and nothing above it."""
    root = workspace_root(workspace)
    top = mirror / _MIRRORED_WORKSPACE
    top.mkdir()
    (mirror / ".editorconfig").write_text("root = true\n")
    directory = start
    while True:
        found = directory / ".editorconfig"
        if found.is_file():
            source = resolve_in_workspace(workspace, str(found), field="configuration file")
            copy = top / directory.relative_to(root) / ".editorconfig"
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(source.read_bytes())
        if directory == root:
            return top
        directory = directory.parent
