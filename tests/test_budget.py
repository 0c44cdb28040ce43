"""The LM benchmarks' wall-clock budget (benchmarks/lm_training.py `train_within`): iterations run
while the next one fits, the last one is shortened to the matches that fit, and a run that goes
past the budget all the same is refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import lm_training


class ClockedLeague:
    """A league whose iterations take `fixed + per_match * matches` seconds of a fake clock (the
    second part reported as the play phase), times `slowdown[i]` for the i-th."""

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
        phases = {"play": factor * self.per_match * matches, "learn": factor * self.fixed}
        return SimpleNamespace(losses={}, phase_seconds=phases), None


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(lm_training.time, "perf_counter", lambda: now[0])
    return now


def test_the_last_iteration_is_shortened_to_the_matches_that_fit(clock):
    league = ClockedLeague(clock, full=32, fixed=20.0, per_match=8.0)  # 276 s a full iteration
    seconds, iterations = lm_training.train_within(league, 1350.0)
    # after four (1104 s) 246 s are left, short of 1.5 x 276 = 414: 1.5 x (20 + 256 m / 32) <= 246
    # for m = 18 matches (164 s); then 82 s are left, too few for a quarter of an iteration
    assert league.asked == [32, 32, 32, 32, 18]
    assert (seconds, iterations) == (1268.0, 5)


def test_no_short_iteration_below_a_quarter_of_the_matches(clock):
    league = ClockedLeague(clock, full=32, fixed=20.0, per_match=8.0)
    # after three (828 s) 322 s are left: 24 matches fit (212 s); then 110 s are left, where
    # 1.5 x (20 + 256 m / 32) <= 110 for 6.7 matches, fewer than 8
    assert lm_training.train_within(league, 1150.0) == (1040.0, 4)
    assert league.asked == [32, 32, 32, 24]


def test_a_learner_whose_update_takes_as_long_whatever_the_matches(clock):
    """`text_exit` learns for a fixed number of steps: a shorter iteration is not much shorter, so
    none is played when the learning alone would not fit (taking 30% of an iteration as fixed
    once ended a run 2 s past its budget)."""
    league = ClockedLeague(clock, full=32, fixed=90.0, per_match=0.9)  # 118.8 s, 90 of them learning
    seconds, iterations = lm_training.train_within(league, 1800.0)
    # after 14 (1663 s) 137 s are left: the learning alone, 1.5 x 90 = 135 s, leaves room for 1.3 matches
    assert league.asked == [32] * 14 and seconds == pytest.approx(1663.2) and iterations == 14


def test_a_run_past_its_budget_is_refused(clock):
    league = ClockedLeague(clock, full=32, fixed=20.0, per_match=8.0, slowdown=(1.0, 1.0, 3.0))
    with pytest.raises(SystemExit, match="past its budget of 1000 s"):
        lm_training.train_within(league, 1000.0)
