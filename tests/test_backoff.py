"""The one backoff helper, with the numbers its two callers use: the provider's retries (0.5 s
doubling to 8 s, 75-100% of that) and the coven face's reconnects (its config, 80-100%)."""

from __future__ import annotations

import pytest

from a3s_agent.base.backoff import Backoff


@pytest.mark.parametrize(
    ("initial_s", "max_s", "jitter", "ceilings"),
    [
        (0.5, 8.0, 0.25, [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]),  # the provider's retries
        (0.5, 30.0, 0.2, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),  # coven's default reconnects
    ],
)
def test_delays_double_up_to_the_cap_each_cut_by_at_most_the_jitter(
    initial_s: float, max_s: float, jitter: float, ceilings: list[float]
) -> None:
    for _ in range(200):  # the jitter is random: many runs see its whole range
        backoff = Backoff(initial_s, max_s, jitter=jitter)
        for ceiling in ceilings:
            assert ceiling * (1 - jitter) <= backoff.next_s() <= ceiling


def test_delays_are_jittered() -> None:
    delays = {Backoff(1.0, 1.0, jitter=0.2).next_s() for _ in range(50)}
    assert len(delays) > 1 and min(delays) < 0.95


def test_reset_starts_again_from_the_first_delay() -> None:
    backoff = Backoff(0.5, 30.0, jitter=0.0)
    assert [backoff.next_s() for _ in range(4)] == [0.5, 1.0, 2.0, 4.0]
    backoff.reset()
    assert backoff.next_s() == 0.5


def test_a_long_outage_never_overflows() -> None:
    backoff = Backoff(0.5, 30.0, jitter=0.2)
    for _ in range(5000):  # more doublings than a float holds
        assert backoff.next_s() <= 30.0
