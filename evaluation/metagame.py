"""The population's meta-game: empirical payoffs, Nash mixture, alpha-rank and non-transitive cycles.

The meta-game treats each frozen member as one pure strategy of a symmetric two-player game whose
payoff is the empirical head-to-head score (Wellman 2006, empirical game-theoretic analysis):

* `payoff_matrix_from_ledger` — mean outcome (win 1, draw .5, loss 0) of row vs column over the
  ledger's matches (undecayed, unlike the league's PFSP payoff table);
* `ludus.agents.solvers.exploitability.nash_mixture` — the maximin strategy of the zero-sum game A = 2P - 1
  (what PSRO's meta-solver computes, Lanctot et al. 2017), as the linear program that OpenSpiel's
  `lp_solver.solve_zero_sum_matrix_game` states, solved with scipy's HiGHS (OpenSpiel's solver
  needs cvxpy, which Ludus does not install);
* `alpha_rank` — OpenSpiel's `egt.alpharank` (Omidshafiei et al. 2019): the stationary
  distribution of an evolutionary process, unique even when Nash is not;
* `three_cycles` — every A > B > C > A among observed pairs, with its margins: a cycle means the
  population is non-transitive and a single rating cannot order it.

Pairs never played are estimated with a Beta(1, 1) prior, P = (wins + draws/2 + 1) / (games + 2)
(exactly as league/records/payoff.py does), so the solvers always see a complete matrix; cycles are only
read from pairs that were played.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ludus.agents.solvers.exploitability import MatrixGameError, nash_mixture


class MetaGameError(MatrixGameError):
    """A payoff matrix the meta-game solvers cannot use."""


@dataclass(frozen=True)
class PayoffMatrix:
    """Head-to-head record of a set of players."""

    players: tuple[str, ...]
    score_sum: np.ndarray
    """[N, N] sum of row's outcomes (1 win, .5 draw, 0 loss) in its games against column."""
    games: np.ndarray
    """[N, N] games between row and column (symmetric)."""

    @property
    def score(self) -> np.ndarray:
        """[N, N] mean outcome of row vs column; NaN where they never met (and on the diagonal)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.games > 0, self.score_sum / np.maximum(self.games, 1), np.nan)

    @property
    def win_probability(self) -> np.ndarray:
        """[N, N] Beta(1, 1)-smoothed P[row beats column]: (score_sum + 1) / (games + 2); 0.5 on the diagonal."""
        p = (self.score_sum + 1.0) / (self.games + 2.0)
        np.fill_diagonal(p, 0.5)
        return p

    def subset(self, players: Sequence[str]) -> "PayoffMatrix":
        """The record of some of the players, in the given order."""
        index = [self.players.index(p) for p in players]
        return PayoffMatrix(tuple(players), self.score_sum[np.ix_(index, index)], self.games[np.ix_(index, index)])

    @staticmethod
    def from_scores(players: Sequence[str], scores: np.ndarray | Sequence[Sequence[float]],
                    games: float = 1.0) -> "PayoffMatrix":
        """A matrix from known scores (e.g. rock-paper-scissors), as if from `games` games per pair."""
        scores = np.asarray(scores, dtype=np.float64)
        n = len(players)
        if scores.shape != (n, n):
            raise MetaGameError(f"scores must be {n}x{n}, got shape {scores.shape}")
        off = ~np.eye(n, dtype=bool)
        if not np.allclose((scores + scores.T)[off], 1.0):
            raise MetaGameError("scores must satisfy P[i, j] + P[j, i] = 1 (a win for one is a loss for the other)")
        counts = np.full((n, n), float(games))
        np.fill_diagonal(counts, 0.0)
        return PayoffMatrix(tuple(players), np.where(off, scores * games, 0.0), counts)

    def to_json(self) -> dict:
        score = self.score
        return {"players": list(self.players), "games": self.games.tolist(),
                "score": [[None if np.isnan(v) else float(v) for v in row] for row in score]}


def payoff_matrix(matches, players: Sequence[str]) -> PayoffMatrix:
    """Head-to-head record of `players` over matches (other players' games are ignored).

    Every pair of seats on different teams played by two distinct listed players counts once, as in
    `ludus.league.records.payoff.pair_results`; matches in which every seat failed are skipped.
    """
    record = PayoffRecorder(players)
    for match in matches:
        record.add(match)
    return record.matrix()


class PayoffRecorder:
    """Accumulates a `PayoffMatrix` one match at a time (one pass over a ledger of any size)."""

    def __init__(self, players: Sequence[str]):
        self.players = tuple(players)
        self.index = {p: i for i, p in enumerate(self.players)}
        n = len(self.players)
        self.score_sum, self.games = np.zeros((n, n)), np.zeros((n, n))

    def add(self, match) -> None:
        """Count one `MatchResult`."""
        from ludus.league.records.payoff import pair_results

        for home, away, score in pair_results((match,)):
            i, j = self.index.get(home), self.index.get(away)
            if i is None or j is None:
                continue
            self.score_sum[i, j] += score
            self.score_sum[j, i] += 1.0 - score
            self.games[i, j] += 1
            self.games[j, i] += 1

    def matrix(self) -> PayoffMatrix:
        return PayoffMatrix(self.players, self.score_sum.copy(), self.games.copy())


def payoff_matrix_from_ledger(run_dir: str | os.PathLike, kinds: Sequence[str] = ("training", "rating", "evaluation"),
                              players: Sequence[str] | None = None, include_learners: bool = False) -> PayoffMatrix:
    """The run's empirical payoff matrix, read from its ledger (read-only).

    Args:
        kinds: match kinds to count (training matches hold the learners' games, rating matches the
            frozen members' games against each other).
        players: whom to include, in order; None means the frozen members (snapshots and anchors)
            in joining order, plus the live learners when `include_learners`.
        include_learners: a learner's row mixes all its versions, so it is not a strategy of the
            meta-game; include it to see whom it played and how it fared.
    """
    from ludus.league.rundata import open_ledger, read_run

    run = read_run(run_dir)
    if players is None:
        players = [m.player_id for m in run.members if m.kind != "learner" or include_learners]
    with open_ledger(run.run_dir) as store:
        return payoff_matrix((r.result for r in store.iter_matches(kinds=tuple(kinds))), players)


# ---------------------------------------------------------------------------------------------
# Solvers


def alpha_rank(win_probability: np.ndarray, alpha: float = 100.0, population_size: int = 50) -> np.ndarray:
    """Single-population alpha-rank (OpenSpiel `egt.alpharank.compute`) of a symmetric game whose
    payoff is P[row beats column]; returns the stationary distribution over players."""
    from open_spiel.python.egt import alpharank

    table = np.asarray(win_probability, dtype=np.float64)
    # alpharank's fixation probability (1 - e^-u) / (1 - e^-mu) overflows to the right limit
    # for strongly selected pairs; the overflow is expected, not an error.
    with np.errstate(over="ignore"):
        _, _, pi, _, _ = alpharank.compute([table], m=population_size, alpha=alpha)
    pi = np.asarray(pi, dtype=np.float64)
    if not np.all(np.isfinite(pi)):
        raise MetaGameError("alpha-rank produced a non-finite distribution; lower alpha")
    return pi / pi.sum()


@dataclass(frozen=True)
class Cycle:
    """A non-transitive triple: first beats second, second beats third, third beats first."""

    players: tuple[str, str, str]
    scores: tuple[float, float, float]
    """Mean scores of the three edges (first vs second, second vs third, third vs first), each > 0.5."""

    @property
    def margin(self) -> float:
        """The weakest edge's margin over an even score."""
        return min(self.scores) - 0.5


def three_cycles(matrix: PayoffMatrix, limit: int | None = 20, min_games: int = 1) -> tuple[list[Cycle], int]:
    """The strongest 3-cycles among pairs that met at least `min_games` times, and how many there are.

    Each cycle is listed once (rotated so its first player comes first in `matrix.players`),
    sorted by margin, largest first; `limit` bounds the list, not the count.
    """
    score = matrix.score
    beats = (matrix.games >= min_games) & (np.nan_to_num(score, nan=0.5) > 0.5)
    n = len(matrix.players)
    found: list[Cycle] = []
    count = 0
    for a in range(n):
        later = np.arange(n) > a
        for b in np.nonzero(beats[a] & later)[0]:
            # c beats a and b beats c; c > a so the rotation starting at a is the canonical one.
            for c in np.nonzero(beats[b] & beats[:, a] & later)[0]:
                count += 1
                found.append(Cycle((matrix.players[a], matrix.players[b], matrix.players[c]),
                                   (float(score[a, b]), float(score[b, c]), float(score[c, a]))))
    found.sort(key=lambda cycle: (-cycle.margin, cycle.players))
    return (found if limit is None else found[:limit]), count


@dataclass(frozen=True)
class MetaGameReport:
    """Solutions of a population's meta-game."""

    players: tuple[str, ...]
    nash: tuple[float, ...]
    """Maximin (symmetric Nash) mixture over players."""
    nash_value: float
    """Its value in the zero-sum game 2P - 1 (0 for a symmetric game, up to solver tolerance)."""
    alpharank: tuple[float, ...]
    """alpha-rank stationary distribution over players."""
    cycles: tuple[Cycle, ...]
    """The strongest 3-cycles (see `three_cycles`)."""
    num_cycles: int
    """All 3-cycles among played pairs."""
    unplayed_pairs: int
    """Pairs of distinct players that never met (estimated at 0.5 by the prior)."""

    def to_json(self) -> dict:
        return {"players": list(self.players), "nash": list(self.nash), "nash_value": self.nash_value,
                "alpharank": list(self.alpharank), "num_cycles": self.num_cycles,
                "unplayed_pairs": self.unplayed_pairs,
                "cycles": [{"players": list(c.players), "scores": list(c.scores), "margin": c.margin}
                           for c in self.cycles]}


def solve_metagame(matrix: PayoffMatrix, cycle_limit: int = 20, alpha: float = 100.0) -> MetaGameReport:
    """Nash mixture, alpha-rank and 3-cycles of a payoff matrix."""
    if len(matrix.players) < 2:
        raise MetaGameError(f"a meta-game needs at least two players, got {len(matrix.players)}")
    p = matrix.win_probability
    nash, value = nash_mixture(2.0 * p - 1.0)
    ranks = alpha_rank(p, alpha=alpha)
    cycles, count = three_cycles(matrix, limit=cycle_limit)
    n = len(matrix.players)
    unplayed = int(((matrix.games == 0) & ~np.eye(n, dtype=bool)).sum() // 2)
    return MetaGameReport(matrix.players, tuple(float(v) for v in nash), value, tuple(float(v) for v in ranks),
                          tuple(cycles), count, unplayed)


def format_metagame(report: MetaGameReport) -> str:
    width = max(len(p) for p in report.players)
    lines = [f"{'player':<{width}} {'nash':>7} {'alpharank':>9}"]
    for player, x, r in zip(report.players, report.nash, report.alpharank):
        lines.append(f"{player:<{width}} {x:7.3f} {r:9.3f}")
    lines.append(f"3-cycles among played pairs: {report.num_cycles}"
                 + (f" (strongest {len(report.cycles)} listed)" if report.num_cycles > len(report.cycles) else ""))
    for c in report.cycles:
        a, b, d = c.players
        lines.append(f"  {a} > {b} ({c.scores[0]:.2f}) > {d} ({c.scores[1]:.2f}) > {a} ({c.scores[2]:.2f}); "
                     f"margin {c.margin:.2f}")
    return "\n".join(lines)
