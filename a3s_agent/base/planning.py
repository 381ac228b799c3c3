"""Plans and goals (A3S's planning group): a plan of steps the session's model drew up for a task,
and a goal with the criteria that say it is reached.

A session keeps one plan, its latest, in step with its todo list: each step is the todo item of
the same id (`step_todo`), and a status the todo list gives an item is the step's
(`status_of_todo`). core/loop/planning.py asks the model; core/sessions/plans.py keeps the plan.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .models import Todo


class StepStatus(enum.IntEnum):
    """Numbers match the wire enum StepStatus (0, unknown, is never kept)."""

    PENDING = 1
    IN_PROGRESS = 2
    COMPLETED = 3
    FAILED = 4
    SKIPPED = 5


class Complexity(enum.IntEnum):
    """Numbers match the wire enum Complexity."""

    SIMPLE = 1
    MEDIUM = 2
    COMPLEX = 3
    VERY_COMPLEX = 4


_TODO_STATUS = {
    StepStatus.PENDING: "pending",
    StepStatus.IN_PROGRESS: "in_progress",
    StepStatus.COMPLETED: "completed",
    StepStatus.FAILED: "cancelled",
    StepStatus.SKIPPED: "cancelled",
}


@dataclass(frozen=True)
class PlanStep:
    id: str
    description: str
    tool: str | None = None
    dependencies: tuple[str, ...] = ()
    status: StepStatus = StepStatus.PENDING
    success_criteria: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "description": self.description,
            "tool": self.tool,
            "dependencies": list(self.dependencies),
            "status": self.status.name.lower(),
            "success_criteria": list(self.success_criteria),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlanStep:
        return cls(
            id=data["id"],
            description=data["description"],
            tool=data.get("tool"),
            dependencies=tuple(data.get("dependencies", ())),
            status=StepStatus[data.get("status", "pending").upper()],
            success_criteria=tuple(data.get("success_criteria", ())),
        )


@dataclass(frozen=True)
class Plan:
    goal: str
    steps: tuple[PlanStep, ...]
    complexity: Complexity = Complexity.MEDIUM
    required_tools: tuple[str, ...] = ()
    created_at: int = 0  # ms since the epoch

    @property
    def estimated_steps(self) -> int:
        return len(self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "goal": self.goal,
            "steps": [step.to_json() for step in self.steps],
            "complexity": self.complexity.name.lower(),
            "required_tools": list(self.required_tools),
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(
            goal=data["goal"],
            steps=tuple(PlanStep.from_json(step) for step in data["steps"]),
            complexity=Complexity[data.get("complexity", "medium").upper()],
            required_tools=tuple(data.get("required_tools", ())),
            created_at=data.get("created_at", 0),
        )


@dataclass(frozen=True)
class Goal:
    description: str
    success_criteria: tuple[str, ...]
    progress: float = 0.0  # 0 to 1
    achieved: bool = False
    created_at: int = 0  # ms since the epoch
    achieved_at: int | None = None


@dataclass(frozen=True)
class GoalCheck:
    """How far the session's work has come towards a goal, as its model judged it."""

    achieved: bool
    progress: float  # 0 to 1
    remaining_criteria: tuple[str, ...]


def step_todo(step: PlanStep) -> Todo:
    """The todo item that stands for `step` in the session's todo list."""
    return Todo(id=step.id, content=step.description, status=_TODO_STATUS[step.status])


def status_of_todo(step: PlanStep, todo: Todo) -> StepStatus:
    """The step's status as the todo item of its id now says (a cancelled item is a skipped step,
    unless the step had failed)."""
    if _TODO_STATUS[step.status] == todo.status:
        return step.status
    return {
        "pending": StepStatus.PENDING,
        "in_progress": StepStatus.IN_PROGRESS,
        "completed": StepStatus.COMPLETED,
    }.get(todo.status, StepStatus.SKIPPED)
