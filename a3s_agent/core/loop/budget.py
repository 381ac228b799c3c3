"""A session's token budget: an optional hard cap on the tokens its model calls may use.

What counts is the session's total: prompt plus completion tokens as each provider reported them
(cache reads and writes are in the prompt, reasoning in the completion; see Usage), summed over
every model turn of every generation and the summaries compaction asked for. The agent loop checks
it before each model call, so a call that starts under the cap may end above it by that call's
tokens; the next one does not start.

The cap is the session's own (`SessionSettings.token_budget`) when it has one, else the server's
(Initialize `config.custom["token_budget"]`); 0 means no cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...base.errors import InvalidArgument
from ..store.session import Session

MAX_DIGITS = 18
"""A budget is a whole number of at most this many digits (it fits SQLite's 64-bit integers)."""


@dataclass(frozen=True)
class BudgetSpent:
    """A session whose total tokens reached its budget."""

    budget: int
    used: int

    @property
    def message(self) -> str:
        return (
            f"The session's token budget of {self.budget} tokens is spent: {self.used} tokens used"
            " (prompt + completion). Raise the session's budget to go on."
        )

    def metadata(self) -> dict[str, str]:
        return {"token_budget": str(self.budget), "token_budget_used": str(self.used)}


def parse_budget(text: str, key: str) -> int:
    """A budget given as text: a whole number of tokens, 0 for none; InvalidArgument naming `key`."""
    value = text.strip()
    if not (value.isascii() and value.isdigit() and len(value) <= MAX_DIGITS):
        raise InvalidArgument(f"{key} must be a whole number of tokens (0: no budget), not {text[:50]!r}")
    return int(value)


def effective_budget(session: Session, server_budget: int) -> int:
    """The cap that applies to `session` (0: none)."""
    own = session.settings.token_budget
    return server_budget if own is None else own


def budget_spent(session: Session, budget: int) -> BudgetSpent | None:
    """Whether `session` may not call its model again under `budget` (0: no cap)."""
    used = session.usage.total_tokens
    return BudgetSpent(budget, used) if budget and used >= budget else None
