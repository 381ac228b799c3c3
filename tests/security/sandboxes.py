"""Running a test under each sandbox mechanism: parametrize it with `MECHANISMS` (ids bwrap and
landlock); a mechanism that cannot work on this machine is skipped, the reason given."""

from __future__ import annotations

import pytest

from a3s_agent.tools.sandbox import bwrap, landlock


def _mechanism(name: str, problem: str | None) -> object:
    reason = f"{name} cannot sandbox commands here: {problem}"
    return pytest.param(name, id=name, marks=pytest.mark.skipif(problem is not None, reason=reason))


MECHANISMS = [_mechanism("bwrap", bwrap.problem()), _mechanism("landlock", landlock.problem())]
"""`--sandbox` values, for `pytest.mark.parametrize` or a fixture's `params`."""
