"""The LM benchmarks' wall-clock budget (benchmarks/lm_training.py `train_within`): iterations run
while the next one fits, the last one is shortened to the matches that fit, and a run that goes
past the budget all the same is refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import lm_training


class ClockedLeague:
    """A league whose iterations take `fixed + per_match * matches` seconds of a fake clock, times
    `slowdown[i]` for the i-th."""

    def __init__(self, clock: list[float], full: int, fixed: float, per_match: float,
                 slowdown: tuple[float, ...] = ()):
        self.config = SimpleNamespace(matches_per_iteration=full)
        self.clock, self.fixed, self.per_match, self.slowdown = clock, fixed, per_match, slowdown
        self.asked: list[int] = []

    def step(self, matches=None):
        matches = self.config.matches_per_iteration if matches is None else matches
        factor = self.slowdown[len(self.asked)] if len(self.asked) < len(self.slowdown) else 1.0
        self.asked.append(matches)
        self.clock[0] += factor * (self.fixed + self.per_match * matches)
        return SimpleNamespace(losses={}, phase_seconds={}), None


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(lm_training.time, "perf_counter", lambda: now[0])
    return now


def test_the_last_iteration_is_shortened_to_the_matches_that_fit(clock):
    league = ClockedLeague(clock, full=32, fixed=20.0, per_match=8.0)  # 276 s a full iteration
    seconds, iterations = lm_training.train_within(league, 1350.0)
    # after four (1104 s) 246 s are left, short of 1.5 x 276 = 414: 32 x (246 / 414 - 0.3) / 0.7
    # = 13.4 matches fit (124 s); then 122 s are left, too few for a quarter of an iteration
    assert league.asked == [32, 32, 32, 32, 13]
    assert (seconds, iterations) == (1228.0, 5)


def test_no_short_iteration_below_a_quarter_of_the_matches(clock):
    league = ClockedLeague(clock, full=32, fixed=20.0, per_match=8.0)
    # after four, 196 s are left: 7.9 matches would fit, fewer than 8
    assert lm_training.train_within(league, 1300.0) == (1104.0, 4)
    assert league.asked == [32] * 4


def test_a_run_past_its_budget_is_refused(clock):
    league = ClockedLeague(clock, full=32, fixed=20.0, per_match=8.0, slowdown=(1.0, 1.0, 3.0))
    with pytest.raises(SystemExit, match="past its budget of 1000 s"):
        lm_training.train_within(league, 1000.0)
