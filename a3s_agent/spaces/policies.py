"""Space policies: the restrictive, standard and permissive presets and custom rules.

Every policy is a `PermissionPolicy` of the permission engine (`core/permissions.py`), which
decides each operation: deny beats ask, ask beats allow. Operations are checked as these
engine tools, on this subject:

    createFile -> write_file (path)    readFile -> read_file (path)    editFile -> edit_file (path)
    deleteFile -> delete_file (path)   shell -> bash (command)         message -> never checked

The presets' settings become rules:

    blocked path P        deny  Read(**/P/**) Write(**/P/**) Edit(**/P/**) Delete(**/P/**)
                          (P matches any component of the path: `.*` blocks `a/.git/config`)
    read-only filesystem  deny  Write, Edit, Delete
    shell disabled        deny  Bash
    blocked command P     deny  Bash(P:*)   (a command, or any part of a compound one, that is P
                                             or starts with P and a space: `sudo:*` blocks
                                             `cd x && sudo ls`, not `echo sudo`)
    approval command P    ask   Bash(P:*)

Custom rules use the engine's syntax (`Bash(git push:*)`, `Write(dist/**)`); the operation
names work as tool names too (`shell(...)` is `Bash(...)`, `createFile(...)` is `Write(...)`).
Like every deny rule on bash, blocked commands are a tripwire, not a sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..core.errors import InvalidArgument
from ..core.permissions import RULE_TYPES, PermissionPolicy, evaluate, parse_rule
from .validation import MAX_TIMEOUT_MS, MIN_TIMEOUT_MS

PolicySpec = str | Mapping[str, Any]
DEFAULT_PRESET: Final = "standard"
DEFAULT_TIMEOUT_MS: Final = 30_000  # the protocol's default shell timeout
_MB: Final = 1024 * 1024
DEFAULT_MAX_FILE_SIZE: Final = 10 * _MB


@dataclass(frozen=True)
class Preset:
    read_only: bool
    shell: bool
    blocked_paths: tuple[str, ...]
    blocked_commands: tuple[str, ...]
    approval_commands: tuple[str, ...]
    timeout_ms: int
    max_file_size: int


# The Agent Spaces presets; network access is not controlled here beyond blocking curl, wget and ssh.
PRESETS: Final[Mapping[str, Preset]] = {
    "restrictive": Preset(
        read_only=True,
        shell=False,
        blocked_paths=(".*", "*.env", "*.key", "*.pem"),
        blocked_commands=(),
        approval_commands=(),
        timeout_ms=10_000,
        max_file_size=1 * _MB,
    ),
    "standard": Preset(
        read_only=False,
        shell=True,
        blocked_paths=(".*", "*.env", "*.key", "*.pem", "node_modules"),
        blocked_commands=("rm -rf /", "rm -rf ~", "sudo", "chmod", "chown", "curl", "wget", "ssh"),
        approval_commands=("rm -rf", "rm -r"),
        timeout_ms=30_000,
        max_file_size=10 * _MB,
    ),
    "permissive": Preset(
        read_only=False,
        shell=True,
        blocked_paths=("*.key", "*.pem"),
        blocked_commands=("rm -rf /", "rm -rf ~", "sudo"),
        approval_commands=("rm -rf", "rm -r", "chmod", "chown"),
        timeout_ms=300_000,
        max_file_size=100 * _MB,
    ),
}

# Operation type -> (engine tool, the argument the rules match, alias usable in rules).
_ENGINE: Final[Mapping[str, tuple[str, str, str]]] = {
    "createFile": ("write_file", "path", "Write"),
    "readFile": ("read_file", "path", "Read"),
    "editFile": ("edit_file", "path", "Edit"),
    "deleteFile": ("delete_file", "path", "Delete"),
    "shell": ("bash", "command", "Bash"),
}
_FILE_TOOLS: Final = ("Read", "Write", "Edit", "Delete")
_WRITE_TOOLS: Final = ("Write", "Edit", "Delete")
_RULE_ALIASES: Final = {kind.lower(): alias for kind, (_, _, alias) in _ENGINE.items()}
_SPEC_KEYS: Final = ("preset", *RULE_TYPES, "defaultDecision", "timeout", "maxFileSize")

Kind = Literal["blocked_path", "read_only", "shell_disabled", "blocked_command", "approval_command", "custom"]


@dataclass(frozen=True)
class _Origin:
    """Why a rule is in the policy, so a decision can be explained in the protocol's words."""

    kind: Kind
    subject: str  # the preset's pattern or command, or the custom rule as written


@dataclass(frozen=True)
class Verdict:
    """The policy's answer for one operation; `label` names what decided (details.policy)."""

    decision: Literal["allow", "deny", "ask"]
    reason: str = ""
    suggestion: str | None = None
    label: str = ""


ALLOWED: Final = Verdict("allow")


@dataclass
class SpacePolicy:
    """A space's policy: the engine rules plus the shell timeout default and the file size limit."""

    name: str
    spec: dict[str, Any]  # the JSON form it was built from, to store and to show
    permissions: PermissionPolicy
    default_timeout_ms: int
    max_file_size: int
    _origins: dict[tuple[str, str], _Origin] = field(repr=False)  # (rule type, rule) -> origin
    _by_tool: dict[str, PermissionPolicy] = field(default_factory=dict, repr=False)

    def check(self, operation: Mapping[str, Any]) -> Verdict:
        """Decide a valid operation."""
        engine = _ENGINE.get(operation["type"])
        if engine is None:
            return ALLOWED
        tool, key, _ = engine
        subject = operation[key]
        evaluation = evaluate(self._rules_for(tool), tool, {key: subject})
        if evaluation.decision == "allow":
            return ALLOWED
        rule = evaluation.matching_rules[0] if evaluation.matching_rules else None
        origin = self._origins[evaluation.decision, rule] if rule is not None else None
        if evaluation.decision == "deny":
            return _denial(self.name, operation["type"], key, subject, origin)
        return _approval(operation["type"], origin)

    def _rules_for(self, tool: str) -> PermissionPolicy:
        """The rules that can match `tool`: evaluating them alone is cheaper and decides the same."""
        rules = self._by_tool.get(tool)
        if rules is None:
            p = self.permissions
            covering = {t: [r for r in p.rules(t) if parse_rule(r).covers(tool)] for t in RULE_TYPES}
            rules = PermissionPolicy(**covering, default_decision=p.default_decision, enabled=p.enabled)
            self._by_tool[tool] = rules
        return rules


def build_policy(spec: PolicySpec) -> SpacePolicy:
    """A policy from a preset name or a custom spec; InvalidArgument names the fault.

    A custom spec is an object: `preset` (optional; without it there are no preset rules),
    `deny`/`ask`/`allow` (lists of engine rules), `defaultDecision` (allow, ask or deny),
    `timeout` (default shell timeout in ms) and `maxFileSize` (bytes).
    """
    spec = _normalised(spec)
    preset = PRESETS.get(spec.get("preset", ""))
    origins: dict[tuple[str, str], _Origin] = {}
    lists: dict[str, list[str]] = {kind: [] for kind in RULE_TYPES}

    def add(kind: str, rule: str, origin: _Origin) -> None:
        if (kind, rule) not in origins:
            lists[kind].append(rule)
            origins[kind, rule] = origin

    if preset is not None:
        for pattern in preset.blocked_paths:
            for tool in _FILE_TOOLS:
                add("deny", f"{tool}(**/{pattern}/**)", _Origin("blocked_path", pattern))
        for tool in _WRITE_TOOLS if preset.read_only else ():
            add("deny", tool, _Origin("read_only", tool))
        if not preset.shell:
            add("deny", "Bash", _Origin("shell_disabled", "Bash"))
        for command in preset.blocked_commands:
            add("deny", f"Bash({command}:*)", _Origin("blocked_command", command))
        for command in preset.approval_commands:
            add("ask", f"Bash({command}:*)", _Origin("approval_command", command))
    for kind in RULE_TYPES:
        for text in spec.get(kind, []):
            add(kind, _engine_rule(text), _Origin("custom", text))
    permissions = PermissionPolicy(**lists, default_decision=spec.get("defaultDecision", "allow"))
    permissions.validate()
    return SpacePolicy(
        name=spec.get("preset", "custom"),
        spec=spec,
        permissions=permissions,
        default_timeout_ms=spec.get("timeout", preset.timeout_ms if preset else DEFAULT_TIMEOUT_MS),
        max_file_size=spec.get("maxFileSize", preset.max_file_size if preset else DEFAULT_MAX_FILE_SIZE),
        _origins=origins,
    )


def _normalised(spec: PolicySpec) -> dict[str, Any]:
    """The spec as a checked JSON object: a preset name becomes {"preset": name}."""
    if isinstance(spec, str):
        spec = {"preset": spec}
    if not isinstance(spec, Mapping):
        raise InvalidArgument(f"policy must be a preset name or an object, not {type(spec).__name__}")
    unknown = sorted(set(spec) - set(_SPEC_KEYS))
    if unknown:
        raise InvalidArgument(f"policy has unknown fields: {', '.join(map(str, unknown))}")
    out = dict(spec)
    if "preset" in out and out["preset"] not in PRESETS:
        raise InvalidArgument(f"policy.preset must be one of {', '.join(PRESETS)}, not {out['preset']!r}")
    for kind in RULE_TYPES:
        rules = out.get(kind, [])
        if not isinstance(rules, list) or not all(isinstance(rule, str) for rule in rules):
            raise InvalidArgument(f"policy.{kind} must be a list of rule strings")
        for index, rule in enumerate(rules):
            try:
                parse_rule(rule)
            except InvalidArgument as exc:
                raise InvalidArgument(f"policy.{kind}[{index}]: {exc}") from None
    if out.get("defaultDecision", "allow") not in RULE_TYPES:
        raise InvalidArgument(f"policy.defaultDecision must be one of {', '.join(RULE_TYPES)}")
    timeout = out.get("timeout", MIN_TIMEOUT_MS)
    if not _is_int(timeout) or not MIN_TIMEOUT_MS <= timeout <= MAX_TIMEOUT_MS:
        raise InvalidArgument(
            f"policy.timeout must be an integer from {MIN_TIMEOUT_MS} to {MAX_TIMEOUT_MS} ms"
        )
    if not _is_int(out.get("maxFileSize", 1)) or out.get("maxFileSize", 1) < 1:
        raise InvalidArgument("policy.maxFileSize must be a positive integer number of bytes")
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _engine_rule(text: str) -> str:
    """The rule with an operation name as its tool (`shell(...)`) spelt as the engine's alias (`Bash(...)`)."""
    rule = parse_rule(text)
    alias = _RULE_ALIASES.get(rule.tool.lower())
    if alias is None:
        return text
    return alias if rule.pattern is None else f"{alias}({rule.pattern})"


def _denial(policy: str, kind: str, key: str, subject: str, origin: _Origin | None) -> Verdict:
    if origin is None:
        return Verdict(
            "deny",
            f"No allow rule of the policy matches this {kind} operation",
            "Add an allow rule for it to the space's policy",
        )
    if origin.kind == "blocked_path":
        return Verdict(
            "deny",
            f"Path '{subject}' is blocked (pattern '{origin.subject}')",
            f"Use a path that does not match '{origin.subject}'",
        )
    if origin.kind == "read_only":
        return Verdict(
            "deny",
            f"The '{policy}' policy makes the workspace read-only",
            "Use a policy that allows writes, such as standard",
        )
    if origin.kind == "shell_disabled":
        return Verdict(
            "deny",
            f"Shell commands are disabled by the '{policy}' policy",
            "Use a policy that allows shell commands, such as standard",
        )
    if origin.kind == "blocked_command":
        return Verdict(
            "deny", f"Command '{origin.subject}' is blocked", f"Remove {origin.subject} from command"
        )
    return Verdict("deny", f"The {key} '{subject}' is denied by the rule '{origin.subject}'")


def _approval(kind: str, origin: _Origin | None) -> Verdict:
    if origin is None:
        return Verdict(
            "ask",
            f"The policy requires approval for {kind} operations no rule allows",
            label="defaultDecision",
        )
    if origin.kind == "approval_command":
        return Verdict("ask", "Destructive command requires approval", label="shell.approvalRequired")
    return Verdict("ask", f"The operation matches the approval rule '{origin.subject}'", label=origin.subject)
