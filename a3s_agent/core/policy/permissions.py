"""Permission policies: which tool calls run at once, which are refused and which need a human's yes.

A policy holds three lists of rules (rules.py), deny, ask and allow, and a
`default_decision`:

- deny beats ask, ask beats allow; `default_decision` applies when no rule matches.
- `default_decision` defaults to "allow": a policy with no rules changes nothing, deny lists work
  on their own, and a host with nobody to confirm is not left waiting. Allow rules only matter
  when it is "ask" or "deny": set one of those for allow-list policies.
- A disabled policy (`enabled=False`) allows every call, whatever its rules say.

A bash command is decided on what it runs and on the files it writes through redirections (`>`,
`>>`, `>|`, `&>`, `>&`, `<>`) and `tee` (shell_grants.py): each such file is decided as a
write_file call on it, and the strictest decision wins. So an allow rule for a program does not
cover `echo x > f`: unless a rule allows writing `f` (`Write(f)`, `Write(out/**)`; outside the
workspace only one whose pattern is an absolute path, `Write(/tmp/**)`), the default decides it,
and a deny or ask rule on writing `f` (`Write(.env)`) holds against the shell too. A write whose
path is known only when it runs (`> $F`, `> ~/x`, a relative path after `cd`), and any write of a
command the parser cannot read, is allowed by no rule.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Final, cast

from ...base.errors import InvalidArgument
from ...tools.aliases import our_arguments
from ...tools.registry import PATH, RuleSubject
from .matching import bash_allowing_rules, beyond_workspace, text_argument, workspace_path
from .rules import (
    RULE_TYPES,
    Decision,
    RuleType,
    canonical_tool_name,
    check_decision,
    check_rules,
    parse_rule,
)
from .shell_grants import FileWrite, file_writes, parsed_line

# Strongest first: the first group with a matching rule decides.
PRECEDENCE: Final[tuple[Decision, ...]] = ("deny", "ask", "allow")
STRENGTH: Final[Mapping[Decision, int]] = {"allow": 0, "ask": 1, "deny": 2}
WRITE_TOOL: Final = "write_file"
"""The tool whose rules decide the files a bash command writes."""
DEFAULT_DECISION: Final[Decision] = "allow"
_PARSED_ON_THE_LOOP: Final = 4096
"""The longest command whose rules are matched on the event loop (see `evaluated`)."""


@dataclass(frozen=True)
class Evaluation:
    """A decision and the rules behind it (as given), empty when the default or a disabled policy decided."""

    decision: Decision
    matching_rules: tuple[str, ...] = ()


@dataclass
class PermissionPolicy:
    """Rules by the decision they lead to; see the module docstring for how they combine."""

    deny: list[str] = field(default_factory=list)
    allow: list[str] = field(default_factory=list)
    ask: list[str] = field(default_factory=list)
    default_decision: Decision = DEFAULT_DECISION
    enabled: bool = True

    def rules(self, rule_type: RuleType) -> list[str]:
        return cast(list[str], getattr(self, rule_type))

    def validate(self) -> None:
        """Raise InvalidArgument naming the first bad field or rule."""
        check_decision(self.default_decision, "default_decision")
        if not isinstance(self.enabled, bool):
            raise InvalidArgument(f"enabled must be true or false, not {self.enabled!r}")
        for rule_type in RULE_TYPES:
            check_rules(self.rules(rule_type), rule_type)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict that `from_dict` turns back into an equal policy."""
        return {
            "enabled": self.enabled,
            "default_decision": self.default_decision,
            "deny": list(self.deny),
            "allow": list(self.allow),
            "ask": list(self.ask),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PermissionPolicy:
        """A validated policy from `to_dict`'s shape; missing keys take their defaults."""
        if not isinstance(data, Mapping):
            raise InvalidArgument(f"permission policy must be an object, not {type(data).__name__}")
        unknown = sorted(set(data) - {"enabled", "default_decision", *RULE_TYPES})
        if unknown:
            raise InvalidArgument(f"unknown permission policy fields: {', '.join(map(str, unknown))}")
        policy = cls(
            deny=_copied(data.get("deny", [])),
            allow=_copied(data.get("allow", [])),
            ask=_copied(data.get("ask", [])),
            default_decision=data.get("default_decision", DEFAULT_DECISION),
            enabled=data.get("enabled", True),
        )
        policy.validate()
        return policy


def _copied(rules: Any) -> Any:
    """A list's copy, so the policy does not share it; anything else is left for validate() to name."""
    return list(rules) if isinstance(rules, list) else rules


def evaluate(
    policy: PermissionPolicy,
    tool_name: str,
    arguments: Mapping[str, Any],
    workspace: str | PurePath | None = None,
    *,
    subject: RuleSubject | None,
) -> Evaluation:
    """The decision for one call: the strongest group with a matching rule, else the default.

    `subject` is what the tool declares its rules' patterns are matched against (its
    `rule_subject`; None: its arguments as JSON text). `matching_rules` lists the deciding group's
    matching rules, in policy order. A bash command is also decided on each file it writes (see
    the module's docstring). A3S Code's argument names (`file_path`...) count as ours; one given
    under both names with different values is InvalidArgument.
    """
    tool = canonical_tool_name(tool_name)
    arguments = our_arguments(tool, arguments)
    if not policy.enabled:
        return Evaluation("allow")
    decided = _by_rules(policy, tool_name, arguments, workspace, subject)
    if tool != "bash" or not _writes_can_matter(policy):
        return decided
    line = parsed_line(text_argument(arguments, "command"))
    writes = (
        file_writes(line, text_argument(arguments, "cwd") or ".")
        if line is not None
        else [FileWrite("(a command the parser cannot read)", None)]
    )
    return strictest(decided, *(write_evaluation(policy, write, workspace) for write in writes))


def write_evaluation(
    policy: PermissionPolicy, write: FileWrite, workspace: str | PurePath | None = None
) -> Evaluation:
    """The decision for a file a command writes: that of write_file on it, except that outside the
    workspace only an allow rule whose pattern is an absolute path allows it (the file tools refuse
    such paths, so `Write` alone means the workspace). One whose path is known only when the
    command runs is denied or asked by the rules about every write (`Write`, `*`) and allowed by
    none, as it may be outside the workspace."""
    if write.path is not None:
        decided = _by_rules(policy, WRITE_TOOL, {"path": write.path}, workspace, PATH)
        if decided.decision != "allow" or not beyond_workspace(workspace_path(write.path, workspace)):
            return decided
        # Outside the workspace, only a rule naming an absolute path allows the write.
        reaching = tuple(
            rule for rule in decided.matching_rules if (parse_rule(rule).pattern or "").startswith("/")
        )
        return Evaluation("allow", reaching) if reaching else Evaluation(policy.default_decision)
    for rule_type in ("deny", "ask"):
        matching = tuple(
            text
            for text in policy.rules(rule_type)
            if parse_rule(text).pattern is None and parse_rule(text).covers(WRITE_TOOL)
        )
        if matching:
            return Evaluation(rule_type, matching)
    return Evaluation(policy.default_decision)


def strictest(first: Evaluation, *others: Evaluation) -> Evaluation:
    """The strictest of several decisions on one call (the first of equals); when all allow, with
    every rule that allowed a part."""
    found = (first, *others)
    decided = max(found, key=lambda evaluation: STRENGTH[evaluation.decision])
    if decided.decision != "allow":
        return decided
    return Evaluation("allow", tuple(dict.fromkeys(rule for e in found for rule in e.matching_rules)))


def _by_rules(
    policy: PermissionPolicy,
    tool_name: str,
    arguments: Mapping[str, Any],
    workspace: str | PurePath | None,
    subject: RuleSubject | None,
) -> Evaluation:
    for rule_type in PRECEDENCE:
        matching = _matching(policy, rule_type, tool_name, arguments, workspace, subject)
        if matching:
            return Evaluation(rule_type, matching)
    return Evaluation(policy.default_decision)


def _matching(
    policy: PermissionPolicy,
    rule_type: RuleType,
    tool_name: str,
    arguments: Mapping[str, Any],
    workspace: str | PurePath | None,
    subject: RuleSubject | None,
) -> tuple[str, ...]:
    """The rules of one group that match the call; bash's allow rules together (each program the
    command runs proved by one of them)."""
    rules = policy.rules(rule_type)
    if rule_type == "allow" and canonical_tool_name(tool_name) == "bash":
        grants = [(text, parse_rule(text).pattern) for text in rules if parse_rule(text).covers(tool_name)]
        return bash_allowing_rules(grants, text_argument(arguments, "command")) if grants else ()
    return tuple(
        text
        for text in rules
        if parse_rule(text).matches(
            tool_name, arguments, rule_type=rule_type, subject=subject, workspace=workspace
        )
    )


def _writes_can_matter(policy: PermissionPolicy) -> bool:
    """Whether deciding a command's writes can change its decision: not when every write is
    allowed (the default allows, and no deny or ask rule is about writes)."""
    return policy.default_decision != "allow" or any(
        parse_rule(text).covers(WRITE_TOOL)
        for rule_type in ("deny", "ask")
        for text in policy.rules(rule_type)
    )


async def evaluated(
    policy: PermissionPolicy,
    tool_name: str,
    arguments: Mapping[str, Any],
    workspace: str | PurePath | None = None,
    *,
    subject: RuleSubject | None,
) -> Evaluation:
    """`evaluate`, on a worker thread when the call has a long command: parsing one takes about
    10 µs a character, which on the event loop would hold up every session."""
    if len(str(arguments.get("command") or "")) > _PARSED_ON_THE_LOOP:
        return await asyncio.to_thread(evaluate, policy, tool_name, arguments, workspace, subject=subject)
    return evaluate(policy, tool_name, arguments, workspace, subject=subject)


def add_rule(policy: PermissionPolicy, rule_type: str, rule: str) -> PermissionPolicy:
    """A copy of `policy` with `rule` appended to the `rule_type` list (allow, deny or ask).

    `rule_type` is case-insensitive. Adding a rule the list already has changes nothing.
    """
    kind = rule_type.strip().lower() if isinstance(rule_type, str) else rule_type
    if kind not in RULE_TYPES:
        raise InvalidArgument(f"rule_type must be one of {', '.join(RULE_TYPES)}, not {rule_type!r}")
    parse_rule(rule)
    lists = {name: list(policy.rules(name)) for name in RULE_TYPES}
    if rule not in lists[kind]:
        lists[kind].append(rule)
    return PermissionPolicy(**lists, default_decision=policy.default_decision, enabled=policy.enabled)
