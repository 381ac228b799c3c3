"""Permission policies: which tool calls run at once, which are refused and which need a human's yes.

A policy holds three lists of rules (permission_rules.py), deny, ask and allow, and a
`default_decision`:

- deny beats ask, ask beats allow; `default_decision` applies when no rule matches.
- `default_decision` defaults to "allow": a policy with no rules changes nothing, deny lists work
  on their own, and a host with nobody to confirm is not left waiting. Allow rules only matter
  when it is "ask" or "deny": set one of those for allow-list policies.
- A disabled policy (`enabled=False`) allows every call, whatever its rules say.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Final, cast

from ..base.errors import InvalidArgument
from ..tools.aliases import our_arguments
from .permission_rules import (
    RULE_TYPES,
    Decision,
    RuleType,
    canonical_tool_name,
    check_decision,
    check_rules,
    parse_rule,
)

# Strongest first: the first group with a matching rule decides.
PRECEDENCE: Final[tuple[Decision, ...]] = ("deny", "ask", "allow")
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
) -> Evaluation:
    """The decision for one call: the strongest group with a matching rule, else the default.

    `matching_rules` lists the deciding group's matching rules, in policy order. A3S Code's
    argument names (`file_path`...) count as ours; one given under both names with different
    values is InvalidArgument.
    """
    arguments = our_arguments(canonical_tool_name(tool_name), arguments)
    if not policy.enabled:
        return Evaluation("allow")
    for rule_type in PRECEDENCE:
        matching = tuple(
            text
            for text in policy.rules(rule_type)
            if parse_rule(text).matches(tool_name, arguments, rule_type=rule_type, workspace=workspace)
        )
        if matching:
            return Evaluation(rule_type, matching)
    return Evaluation(policy.default_decision)


async def evaluated(
    policy: PermissionPolicy,
    tool_name: str,
    arguments: Mapping[str, Any],
    workspace: str | PurePath | None = None,
) -> Evaluation:
    """`evaluate`, on a worker thread when the call has a long command: parsing one takes about
    10 µs a character, which on the event loop would hold up every session."""
    if len(str(arguments.get("command") or "")) > _PARSED_ON_THE_LOOP:
        return await asyncio.to_thread(evaluate, policy, tool_name, arguments, workspace)
    return evaluate(policy, tool_name, arguments, workspace)


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
