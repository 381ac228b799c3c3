"""A3S Code's tool backends (`backend: {type: binary|script|http, ...}`) in our terms.

A3S Code names a skill tool's backend in a nested mapping tagged by `type`; ours names it by the
key the tool holds (core/skills/frontmatter.py). The same meaning, in our words:

- `binary`: `path` is the program, `args_template` the arguments (`--name ${name}`). The template
  is split into words first (quotes group words, as a shell would), and each `${...}` is then
  filled within its word: a value is always one argument, or part of one, and never reaches a
  shell. (`url`, a program to download, is refused.)
- `script`: `interpreter` and `interpreter_args` make our interpreter command line; the arguments
  arrive in the environment (`TOOL_ARGS`, `TOOL_ARG_<NAME>`) as in A3S Code.
- `http`: `url`, `method`, `headers`, `body_template` (our string `body`) and `timeout_ms` (the
  tool's timeout).
- `builtin` names one of A3S Code's own tools and is refused.
"""

from __future__ import annotations

import shlex
from typing import Any

from ...tools.skill_backends import FieldPath

# A3S Code's fields of each backend type.
_FIELDS = {
    "binary": ("type", "path", "args_template", "url"),
    "script": ("type", "interpreter", "interpreter_args", "script"),
    "http": ("type", "url", "method", "headers", "body_template", "timeout_ms"),
}
_REQUIRED = {"binary": (), "script": ("script",), "http": ("url",)}  # binary: path, or the refused url


def from_a3s_code(entry: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[FieldPath, str]]]:
    """The tool definition with its `backend` mapping rewritten as one of our backends, and the
    problems found (field path within the tool, message), all of them."""
    tool = {key: value for key, value in entry.items() if key != "backend"}
    backend = entry["backend"]
    if not isinstance(backend, dict):
        return tool, [(("backend",), "must be a mapping with a type (binary, script or http)")]
    kind = backend.get("type")
    if not isinstance(kind, str) or kind not in _FIELDS:
        said = (
            "builtin tools are A3S Code's own and cannot be defined by a skill; " if kind == "builtin" else ""
        )
        return tool, [(("backend", "type"), f"{said}must be binary, script or http, not {kind!r}")]
    problems: list[tuple[FieldPath, str]] = [
        (("backend", str(key)), f"unknown field {str(key)!r} (known: {', '.join(sorted(_FIELDS[kind]))})")
        for key in backend
        if key not in _FIELDS[kind]
    ] + [(("backend",), f"missing required field {key!r}") for key in _REQUIRED[kind] if key not in backend]
    if kind == "binary":
        ours, found = _binary(backend)
    elif kind == "script":
        ours, found = _script(backend)
    else:
        ours, found = _http(backend, tool)
    return {**tool, **ours}, problems + found


def _binary(backend: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[FieldPath, str]]]:
    problems: list[tuple[FieldPath, str]] = []
    if "url" in backend:
        problems.append(
            (("backend", "url"), "downloading a program is not supported; install it and give its path")
        )
    path, template = backend.get("path"), backend.get("args_template", "")
    if not isinstance(path, str) or not path.strip():
        problems.append((("backend", "path"), "must name the program to run"))
    words: list[str] = []
    if not isinstance(template, str):
        problems.append((("backend", "args_template"), "must be a string of arguments"))
    else:
        try:
            words = shlex.split(template)
        except ValueError as exc:  # No closing quotation
            problems.append((("backend", "args_template"), f"cannot be split into arguments: {exc}"))
    return {"binary": [path, *words]}, problems


def _script(backend: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[FieldPath, str]]]:
    interpreter, extra = backend.get("interpreter", ""), backend.get("interpreter_args", [])
    ours: dict[str, Any] = {key: value for key, value in backend.items() if key == "script"}
    if not isinstance(interpreter, str):
        return ours, [(("backend", "interpreter"), "must be a command such as bash or python3")]
    if not isinstance(extra, list) or not all(isinstance(arg, str) for arg in extra):
        return ours, [(("backend", "interpreter_args"), "must be a list of strings")]
    if interpreter.strip() or extra:
        ours["interpreter"] = shlex.join([interpreter.strip(), *extra]) if extra else interpreter
    return ours, []


def _http(
    backend: dict[str, Any], tool: dict[str, Any]
) -> tuple[dict[str, Any], list[tuple[FieldPath, str]]]:
    names = {"url": "url", "method": "method", "headers": "headers", "body_template": "body"}
    ours = {names[key]: value for key, value in backend.items() if key in names}
    if "timeout_ms" not in backend:
        return {"http": ours}, []
    if "timeout_ms" in tool:
        return {"http": ours}, [
            (("backend", "timeout_ms"), "give timeout_ms once, in the tool or its backend")
        ]
    return {"http": ours, "timeout_ms": backend["timeout_ms"]}, []
