"""Space policies: the restrictive, standard and permissive presets and custom rules.

Every policy is a `PermissionPolicy` of the permission engine (`core/policy/permissions.py`): deny beats
ask, ask beats allow, `defaultDecision` when no rule matches. Operations are checked as these
engine tools, on this subject:

    createFile -> write_file (path)    readFile -> read_file (path)    editFile -> edit_file (path)
    deleteFile -> delete_file (path)   shell -> bash (command)         message -> never checked

The presets' settings become rules:

    blocked path P        deny  Read(**/P/**) Write(**/P/**) Edit(**/P/**) Delete(**/P/**)
                          (P matches any component of the path: `.*` blocks `a/.git/config`)
    read-only filesystem  deny  Write, Edit, Delete
    shell disabled        deny  Bash
    blocked command P     deny  Bash(P:*)
    approval command P    ask   Bash(P:*)

A file operation is decided on every name its file has in the workspace (`names`, found by the
runner: the symlink-resolved target and the other hard links); the strictest decision wins.

A shell command is parsed (core/policy/shell_commands.py) and the rules about bash are matched against
every program it runs, wrappers seen through and flags normalised (core/policy/shell_rules.py). A command
that cannot be parsed, or that a deny or ask rule might match only through a value known when it
runs ($VAR, globs), gets the preset's `unparsed` decision: restrictive deny, standard ask,
permissive none (the deny and ask rules matched as text, then the default); without a preset, ask
(deny with defaultDecision deny). Allow rules are matched as session policies match them
(core/policy/shell_grants.py): they must prove every program, and a command that sets a variable is never
allowed by them. Each file the command writes through a redirection or `tee` is decided as a
createFile of it (`> .env` meets the blocked path `.*`), and the strictest decision wins.
Restrictive, standard and custom policies refuse PATH, LD_PRELOAD and the like
(`is_protected_env`) in a shell operation's `env`.

Custom rules use the engine's syntax (`Bash(git push:*)`, `Write(dist/**)`); the operation
names work as tool names too (`shell(...)` is `Bash(...)`, `createFile(...)` is `Write(...)`).
A deny list on a shell is a tripwire, not a sandbox: an allowed program can do anything it can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..base.errors import InvalidArgument
from ..core.policy.matching import workspace_path
from ..core.policy.permissions import (
    DEFAULT_DECISION,
    STRENGTH,
    WRITE_TOOL,
    Evaluation,
    PermissionPolicy,
    evaluate,
    write_evaluation,
)
from ..core.policy.rules import RULE_TYPES, Decision, check_decision, check_rules, parse_rule
from ..core.policy.shell_commands import CommandLine, Unparsable, parse_command
from ..core.policy.shell_grants import FileWrite, Grant, file_writes, proving_rules
from ..core.policy.shell_rules import CommandPattern, Match, compile_pattern, match
from ..tools.registry import PATH
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
    unparsed: Decision | None  # for a command the parser cannot check; None: as if no rule matched
    protect_env: bool  # refuse PROTECTED_ENV variables in a shell operation's env


_PRIVATE_KEYS: Final = ("*.key", "*.pem", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519")
# Variables that make a shell or the programs it starts run other code (or change which programs).
PROTECTED_ENV: Final = frozenset(
    {"BASH_ENV", "ENV", "PATH", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS", "PS4", "GCONV_PATH"}
)
_PROTECTED_ENV_PREFIXES: Final = ("LD_", "DYLD_", "BASH_FUNC_")


def is_protected_env(name: str) -> bool:
    """Whether setting `name` can make the shell or its programs run other code (LD_PRELOAD, BASH_ENV...)."""
    return name in PROTECTED_ENV or name.startswith(_PROTECTED_ENV_PREFIXES)


# The Agent Spaces presets; network access is not controlled here beyond blocking curl, wget and ssh.
PRESETS: Final[Mapping[str, Preset]] = {
    "restrictive": Preset(
        read_only=True,
        shell=False,
        blocked_paths=(".*", "*.env", *_PRIVATE_KEYS),
        blocked_commands=(),
        approval_commands=(),
        timeout_ms=10_000,
        max_file_size=1 * _MB,
        unparsed="deny",
        protect_env=True,
    ),
    "standard": Preset(
        read_only=False,
        shell=True,
        blocked_paths=(".*", "*.env", *_PRIVATE_KEYS, "node_modules"),
        blocked_commands=("rm -rf /", "rm -rf ~", "sudo", "chmod", "chown", "curl", "wget", "ssh"),
        approval_commands=("rm -rf", "rm -r"),
        timeout_ms=30_000,
        max_file_size=10 * _MB,
        unparsed="ask",
        protect_env=True,
    ),
    "permissive": Preset(
        read_only=False,
        shell=True,
        blocked_paths=_PRIVATE_KEYS,
        blocked_commands=("rm -rf /", "rm -rf ~", "sudo"),
        approval_commands=("rm -rf", "rm -r", "chmod", "chown"),
        timeout_ms=300_000,
        max_file_size=100 * _MB,
        unparsed=None,
        protect_env=False,
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
    unparsed: Decision | None  # for a command that cannot be checked (see Preset)
    protect_env: bool
    _origins: dict[tuple[str, str], _Origin] = field(repr=False)  # (rule type, rule) -> origin
    _by_tool: dict[str, PermissionPolicy] = field(default_factory=dict, repr=False)

    def check(self, operation: Mapping[str, Any], names: Sequence[str] = ()) -> Verdict:
        """Decide a valid operation. `names` are the other workspace paths the file an operation's
        path reaches has (its resolved target, its hard links): the strictest decision wins."""
        engine = _ENGINE.get(operation["type"])
        if engine is None:
            return ALLOWED
        tool, key, _ = engine
        if tool == "bash":
            return self._check_shell(operation)
        path = operation[key]
        verdicts = [self._check_path(tool, operation["type"], path, name) for name in (path, *names)]
        return max(verdicts, key=lambda verdict: STRENGTH[verdict.decision])

    def _check_path(self, tool: str, kind: str, path: str, name: str) -> Verdict:
        evaluation = evaluate(self._rules_for(tool), tool, {"path": name}, subject=PATH)
        if evaluation.decision == "allow":
            return ALLOWED
        origin = self._origin(evaluation)
        via = None if workspace_path(name) == workspace_path(path) else name
        if evaluation.decision == "deny":
            return _denial(self.name, kind, "path", path, origin, via)
        return _approval(kind, origin)

    def _check_shell(self, operation: Mapping[str, Any]) -> Verdict:
        protected = sorted(name for name in operation.get("env", {}) if is_protected_env(name))
        if protected and self.protect_env:
            names = ", ".join(protected)
            return Verdict(
                "deny",
                f"The '{self.name}' policy does not let a shell operation's env set {names}",
                f"Remove {names} from env",
            )
        command = operation["command"]
        try:
            line = parse_command(command)
        except Unparsable as exc:
            return self._unchecked(command, str(exc))
        writes = [self._check_write(write) for write in file_writes(line, operation.get("cwd", "."))]
        return max([self._check_command(command, line), *writes], key=lambda v: STRENGTH[v.decision])

    def _check_command(self, command: str, line: CommandLine) -> Verdict:
        """The verdict on the programs a parsed command runs."""
        rules = self._shell_rules()
        uncertain: list[str] = []
        for rule_type in ("deny", "ask"):
            for text, pattern in rules[rule_type]:
                found = "yes" if pattern is None else _any_match(pattern, line)
                if found == "yes":
                    return self._rule_verdict(rule_type, text, command)
                if found == "maybe":
                    uncertain.append(text)
            if uncertain and self.unparsed is not None and (rule_type == "ask" or self.unparsed == "deny"):
                return self._uncertain(uncertain[0])
        if proving_rules(rules["allow"], line) is not None:
            return ALLOWED
        return self._default("shell", command)

    def _check_write(self, write: FileWrite) -> Verdict:
        """The verdict on a file a command writes through a redirection or `tee`: as createFile's."""
        evaluation = write_evaluation(self._rules_for(WRITE_TOOL), write)
        if evaluation.decision == "allow":
            return ALLOWED
        origin = self._origin(evaluation)
        if origin is not None:
            if evaluation.decision == "deny":
                return _denial(self.name, "shell", "path", write.target, origin)
            return _approval("shell", origin)
        where = (
            f"'{write.target}'" if write.path is not None else f"'{write.target}' (known only when it runs)"
        )
        if evaluation.decision == "deny":
            return Verdict(
                "deny",
                f"The command writes {where}, and no allow rule of the policy covers writing there",
                "Add a Write rule for that path to the policy's allow list",
            )
        return Verdict(
            "ask",
            f"The command writes {where}, which no rule allows, so it needs approval",
            label="defaultDecision",
        )

    def _unchecked(self, command: str, reason: str) -> Verdict:
        """The verdict for a command the parser cannot check: the deny and ask rules as text (as
        the permission engine matches them), then the policy's `unparsed` decision."""
        rules = self._rules_for("bash")
        evaluation = evaluate(
            PermissionPolicy(deny=rules.deny, ask=rules.ask, enabled=rules.enabled),
            "bash",
            {"command": command},
            subject=None,
        )
        if evaluation.decision == "deny" or (evaluation.decision == "ask" and self.unparsed != "deny"):
            return self._rule_verdict(evaluation.decision, evaluation.matching_rules[0], command)
        if self.unparsed == "deny":
            return Verdict(
                "deny",
                f"The command cannot be checked ({reason}); the '{self.name}' policy refuses commands "
                "it cannot check",
                "Write it as plain commands: no eval or bash -c of variables, case, [[ ]] or $(( ))",
            )
        if self.unparsed == "ask":
            return Verdict(
                "ask", f"The command cannot be checked ({reason}), so it needs approval", label=_UNCHECKED
            )
        return self._default("shell", command)

    def _uncertain(self, rule: str) -> Verdict:
        origin = self._origins.get(("deny", rule)) or self._origins.get(("ask", rule))
        shown = origin.subject if origin is not None else rule
        reason = f"Whether the rule '{shown}' applies depends on values known only when the command runs"
        if self.unparsed == "deny":
            return Verdict("deny", reason, "Write the command's words out instead of variables or globs")
        return Verdict("ask", reason + ", so it needs approval", label=_UNCHECKED)

    def _rule_verdict(self, rule_type: str, rule: str, command: str) -> Verdict:
        origin = self._origins[rule_type, rule]
        if rule_type == "deny":
            return _denial(self.name, "shell", "command", command, origin)
        return _approval("shell", origin)

    def _default(self, kind: str, subject: str) -> Verdict:
        decision = self.permissions.default_decision
        if decision == "allow":
            return ALLOWED
        if decision == "deny":
            return _denial(self.name, kind, "command", subject, None)
        return _approval(kind, None)

    def _origin(self, evaluation: Evaluation) -> _Origin | None:
        rule = evaluation.matching_rules[0] if evaluation.matching_rules else None
        return self._origins[evaluation.decision, rule] if rule is not None else None

    def _shell_rules(self) -> dict[str, list[Grant]]:
        """The rules about bash by type, with their patterns compiled (None: every command)."""
        rules = self._rules_for("bash")
        return {
            rule_type: [(text, _pattern(text)) for text in rules.rules(rule_type)] for rule_type in RULE_TYPES
        }

    def _rules_for(self, tool: str) -> PermissionPolicy:
        """The rules that can match `tool`: evaluating them alone is cheaper and decides the same."""
        rules = self._by_tool.get(tool)
        if rules is None:
            p = self.permissions
            covering = {t: [r for r in p.rules(t) if parse_rule(r).covers(tool)] for t in RULE_TYPES}
            rules = PermissionPolicy(**covering, default_decision=p.default_decision, enabled=p.enabled)
            self._by_tool[tool] = rules
        return rules


_UNCHECKED: Final = "shell.unparsedCommand"


def _pattern(rule: str) -> CommandPattern | None:
    pattern = parse_rule(rule).pattern
    return None if pattern is None else compile_pattern(pattern)


def _any_match(pattern: CommandPattern, line: CommandLine) -> Match:
    """A deny or ask rule against a command line: "yes" if it matches an invocation, else "maybe" if it might."""
    found = [match(pattern, invocation, strict=False) for invocation in line.invocations]
    return "yes" if "yes" in found else "maybe" if "maybe" in found else "no"


def engine_tool(kind: str) -> str | None:
    """The tool an operation type is checked and run as (shell -> bash); None for message."""
    engine = _ENGINE.get(kind)
    return engine[0] if engine else None


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
    permissions = PermissionPolicy(
        deny=lists["deny"],
        allow=lists["allow"],
        ask=lists["ask"],
        default_decision=spec.get("defaultDecision", DEFAULT_DECISION),
    )
    permissions.validate()  # the rules as the engine spells them: `shell(:*)` becomes `Bash(:*)`
    return SpacePolicy(
        name=spec.get("preset", "custom"),
        spec=spec,
        permissions=permissions,
        default_timeout_ms=spec.get("timeout", preset.timeout_ms if preset else DEFAULT_TIMEOUT_MS),
        max_file_size=spec.get("maxFileSize", preset.max_file_size if preset else DEFAULT_MAX_FILE_SIZE),
        unparsed=preset.unparsed if preset else _custom_unparsed(permissions.default_decision),
        protect_env=preset.protect_env if preset else True,
        _origins=origins,
    )


def _custom_unparsed(default: Decision) -> Decision:
    """Without a preset, a command that cannot be checked needs approval, or is denied when an
    allow list decides (defaultDecision deny): an allow list then stays a guarantee."""
    return "deny" if default == "deny" else "ask"


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
        check_rules(out.get(kind, []), f"policy.{kind}")
    check_decision(out.get("defaultDecision", DEFAULT_DECISION), "policy.defaultDecision")
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


def _denial(
    policy: str, kind: str, key: str, subject: str, origin: _Origin | None, via: str | None = None
) -> Verdict:
    if origin is None:
        return Verdict(
            "deny",
            f"No allow rule of the policy matches this {kind} operation",
            "Add an allow rule for it to the space's policy",
        )
    if origin.kind == "blocked_path":
        leads = f": it leads to '{via}'" if via is not None else ""
        return Verdict(
            "deny",
            f"Path '{subject}' is blocked{leads} (pattern '{origin.subject}')",
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
    shown = f"The {key} '{subject}'" + (f" (leading to '{via}')" if via is not None else "")
    return Verdict("deny", f"{shown} is denied by the rule '{origin.subject}'")


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
