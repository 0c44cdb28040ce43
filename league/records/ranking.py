"""Rating views people can trust: Bradley-Terry with bootstrap intervals, Nash averaging, rank
stability and rule-breaking apart from skill (issue 78). Pure compute on lists of game records.

* `fit` — Bradley-Terry (Bradley & Terry 1952; Zermelo 1929): P(i beats j) = s_i / (s_i + s_j).
  A draw counts as half a win for each side (the common "ties as half wins" convention), so a
  game of score x in [0, 1] adds x wins to i and 1 - x to j. The log-strengths theta maximise the
  log-likelihood minus alpha * sum(theta**2), exactly choix's `opt_pairwise(..., alpha)` objective:
  the tiny Gaussian prior keeps an undefeated player, or a group never compared with the rest,
  finite (plain ML sends them to infinity) and makes the optimum unique with mean(theta) = 0.
  We use Newton's method with a backtracking line search on the aggregated win matrix (the
  objective is strictly convex, so it converges in a few steps; Zermelo/MM iteration is slower).
  Ratings are reported on the Elo-like scale 1000 + 400/ln(10) * theta, anchored at mean 1000.
* `bootstrap_intervals` — the nonparametric bootstrap over games, as LMArena (Chiang et al. 2024):
  resample the games with replacement, refit, take percentiles of each rating and each rank.
* `nash_average` — Balduzzi et al. 2018, "Re-evaluating evaluation": scores against the
  maximum-entropy Nash equilibrium of the antisymmetric meta-game, blind to redundant copies.
* `rank_stability` — Huang, Shen, Wei & Broderick 2025, "Dropping just a handful of preferences
  can change top large language model rankings": how few games must go to reorder the top.
* `forfeit_rates`, `ratings_without_forfeits`, `forfeit_dependence_warnings` — rule-breaking
  (errors, timeouts, invalid answers) measured apart from skill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from scipy import sparse
from scipy.linalg import null_space
from scipy.optimize import linprog, minimize
from scipy.special import expit

from ludus.errors import UserError

ALPHA = 0.01
"""Default prior strength: a Gaussian prior of variance 1 / (2 alpha) = 50 on each log-strength,
negligible once a player has a few games, enough that ten straight wins stay near +850."""
SCALE = 400.0 / math.log(10.0)
"""Elo points per unit of log-strength: a 400-point gap is 10:1 odds."""
CENTRE = 1000.0


class RankingError(UserError):
    """Game records or a payoff matrix the rating views cannot use."""


@dataclass(frozen=True)
class Game:
    """One game: a's score (1 win, 0.5 draw, 0 loss) against b, its weight and its game kind."""

    a: str
    b: str
    score_a: float
    weight: float = 1.0
    game: str = ""


@dataclass(frozen=True, eq=False)
class Ratings:
    """Bradley-Terry fit: log-strengths (mean 0), Elo-like ratings (mean 1000), games per player."""

    players: tuple[str, ...]
    log_strength: np.ndarray
    rating: np.ndarray
    games: np.ndarray
    alpha: float

    def order(self) -> np.ndarray:
        """Player indices from best to worst (ties keep the players' order)."""
        return np.argsort(-self.log_strength, kind="stable")

    def ranks(self) -> dict[str, int]:
        """Place of each player, 1 = best."""
        return {self.players[i]: place + 1 for place, i in enumerate(self.order())}


# ---------------------------------------------------------------------------------------- fitting

def _index(games: Sequence[Game], players: Sequence[str] | None = None):
    """Players and games as arrays (a, b, score, weight); refuses what the model cannot read."""
    if not games:
        raise RankingError("no games to rate: record some games first")
    names = tuple(players) if players is not None else tuple(sorted({g.a for g in games} | {g.b for g in games}))
    where = {p: i for i, p in enumerate(names)}
    for g in games:
        if g.a == g.b:
            raise RankingError(f"game of {g.a!r} against itself: drop self-play games before rating")
        if g.a not in where or g.b not in where:
            raise RankingError(f"game {g.a!r} vs {g.b!r} names a player not in `players`: add it")
        if not 0.0 <= g.score_a <= 1.0 or not g.weight > 0.0:
            raise RankingError(f"game {g.a!r} vs {g.b!r}: score must be in [0, 1] and weight > 0, "
                               f"got {g.score_a}, {g.weight}")
    ia = np.array([where[g.a] for g in games])
    ib = np.array([where[g.b] for g in games])
    return names, ia, ib, np.array([g.score_a for g in games], float), np.array([g.weight for g in games], float)


def _by_game_weights(games: Sequence[Game], w: np.ndarray) -> np.ndarray:
    """Reweight so every game kind carries the same total weight (Kaggle Game Arena's combined
    board): a kind with many games does not drown one with few. The total is unchanged, so alpha
    means the same thing."""
    kinds = np.array([g.game for g in games])
    out = w.copy()
    names = np.unique(kinds)
    for kind in names:
        mine = kinds == kind
        out[mine] *= w.sum() / (len(names) * w[mine].sum())
    return out


def _cells(ia, ib, s, w):
    """Distinct (a, b, score, weight) cells with a < b, each game's cell and the counts."""
    swap = ia > ib
    rows = np.column_stack([np.where(swap, ib, ia), np.where(swap, ia, ib), np.where(swap, 1 - s, s), w])
    cells, inverse, counts = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
    return cells, inverse.reshape(-1), counts.astype(float)


def _win_map(cells: np.ndarray, n: int) -> sparse.csr_matrix:
    """[C, n*n] map from cell counts to the flattened win matrix W[i, j] (i's wins over j)."""
    a, b, s, w = cells[:, 0].astype(int), cells[:, 1].astype(int), cells[:, 2], cells[:, 3]
    rows = np.concatenate([np.arange(len(cells))] * 2)
    return sparse.csr_matrix((np.concatenate([w * s, w * (1 - s)]), (rows, np.concatenate([a * n + b, b * n + a]))),
                             shape=(len(cells), n * n))


def _wins(counts: np.ndarray, win_map: sparse.csr_matrix, n: int) -> np.ndarray:
    """Win matrices [B, n, n] from cell counts [B, C] (or [C], giving B = 1)."""
    return np.asarray(win_map.T @ np.atleast_2d(counts).T).T.reshape(-1, n, n)


def _objective(theta, W, alpha):
    d = theta[:, :, None] - theta[:, None, :]
    return alpha * (theta ** 2).sum(-1) + (W * np.logaddexp(0.0, -d)).sum((-2, -1))


def _hessian(theta, N, alpha):
    p = expit(theta[:, :, None] - theta[:, None, :])
    q = N * p * (1 - p)
    H = -q
    idx = np.arange(theta.shape[1])
    H[:, idx, idx] += q.sum(-1) + 2 * alpha
    return H, p


def _newton(W: np.ndarray, alpha: float, theta0: np.ndarray | None = None, max_iter: int = 200) -> np.ndarray:
    """Penalised ML log-strengths for a batch of win matrices [B, n, n] (Newton + Armijo backtracking).

    Gradient: expected minus observed wins plus the prior, 2 alpha theta + sum_j N_ij p_ij - W_ij;
    Hessian: the Laplacian of N_ij p_ij (1 - p_ij) plus 2 alpha I, positive definite for alpha > 0.
    The optimum has mean 0 (the gradient sums to 2 alpha sum(theta)) and shifts leave the
    likelihood alone, so we iterate on mean-zero theta: the Hessian gets 1/n along the all-ones
    direction (else only 2 alpha, and rounding error would wander along it) and theta is re-centred."""
    B, n, _ = W.shape
    N = W + W.transpose(0, 2, 1)
    theta = np.zeros((B, n)) if theta0 is None else np.broadcast_to(theta0, (B, n)).copy()
    theta -= theta.mean(-1, keepdims=True)
    for _ in range(max_iter):
        H, p = _hessian(theta, N, alpha)
        g = 2 * alpha * theta + (N * p).sum(-1) - W.sum(-1)
        step = np.linalg.solve(H + 1.0 / n, g[..., None])[..., 0]
        f0, decrement, t = _objective(theta, W, alpha), (g * step).sum(-1), np.ones(B)
        for _ in range(60):
            trial = theta - t[:, None] * step
            bad = _objective(trial, W, alpha) > f0 - 1e-4 * t * decrement + 1e-12 * np.abs(f0)
            if not bad.any():
                break
            t = np.where(bad, t / 2, t)
        theta = trial - trial.mean(-1, keepdims=True)
        if np.abs(t[:, None] * step).max() < 1e-10 or np.abs(g).max() < 1e-12 * (1 + W.sum((-2, -1)).max()):
            return theta
    raise RuntimeError("Bradley-Terry Newton iteration did not converge (a bug: the objective is convex)")


def _ratings(names, theta, ia, ib, alpha) -> Ratings:
    played = np.bincount(ia, minlength=len(names)) + np.bincount(ib, minlength=len(names))
    return Ratings(names, theta - theta.mean(), CENTRE + SCALE * (theta - theta.mean()), played, alpha)


def fit(games: Sequence[Game], *, alpha: float = ALPHA, by_game: bool = False,
        players: Sequence[str] | None = None) -> Ratings:
    """Bradley-Terry ratings of `games` (Bradley & Terry 1952), a draw counting as half a win for
    each side; penalised ML with choix's alpha prior, mean rating 1000 (see the module docstring).

    by_game=True weights each game so every distinct `Game.game` contributes the same total weight;
    a per-game board is `fit([g for g in games if g.game == kind])`. `players` fixes the order and
    may name players without games (they sit at the mean, where the prior puts them)."""
    if not alpha > 0:
        raise RankingError(f"alpha must be > 0 (got {alpha}): plain ML diverges for undefeated players")
    names, ia, ib, s, w = _index(games, players)
    if by_game:
        w = _by_game_weights(games, w)
    cells, _, counts = _cells(ia, ib, s, w)
    theta = _newton(_wins(counts, _win_map(cells, len(names)), len(names)), alpha)[0]
    return _ratings(names, theta, ia, ib, alpha)


@dataclass(frozen=True, eq=False)
class Intervals:
    """Bootstrap percentile intervals of each player's rating and rank (rank 1 = best)."""

    ratings: Ratings
    low: np.ndarray
    high: np.ndarray
    rank_low: np.ndarray
    rank_high: np.ndarray
    rounds: int
    level: float


def bootstrap_intervals(games: Sequence[Game], rounds: int = 1000, seed: int | np.random.Generator = 0,
                        level: float = 0.95, *, alpha: float = ALPHA, by_game: bool = False) -> Intervals:
    """Nonparametric bootstrap over games (LMArena's): `rounds` resamples of the game list with
    replacement, each refitted; the interval is the central `level` of the bootstrap ratings, and
    the rank interval the same percentiles of the player's rank. Resampling games is multinomial
    counts over the distinct (a, b, score, weight) cells, so one round costs one small fit, and all
    rounds are fitted together as a batch, warm-started at the point estimate."""
    if rounds < 1 or not 0 < level < 1:
        raise RankingError(f"need rounds >= 1 and 0 < level < 1, got {rounds}, {level}")
    point = fit(games, alpha=alpha, by_game=by_game)
    names, ia, ib, s, w = _index(games)
    if by_game:
        w = _by_game_weights(games, w)
    cells, _, counts = _cells(ia, ib, s, w)
    n, win_map = len(names), _win_map(cells, len(names))
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(int(counts.sum()), counts / counts.sum(), size=rounds).astype(float)
    batch = max(1, 1_000_000 // (n * n))
    theta = np.concatenate([_newton(_wins(draws[k:k + batch], win_map, n), alpha, point.log_strength)
                            for k in range(0, rounds, batch)])
    elo = CENTRE + SCALE * (theta - theta.mean(1, keepdims=True))
    ranks = np.argsort(np.argsort(-elo, axis=1, kind="stable"), axis=1, kind="stable") + 1
    q = 50 * (1 - level)
    low, high = np.percentile(elo, [q, 100 - q], axis=0)
    return Intervals(point, low, high, np.percentile(ranks, q, axis=0, method="lower").astype(int),
                     np.percentile(ranks, 100 - q, axis=0, method="higher").astype(int), rounds, level)


# ------------------------------------------------------------------------------- Nash averaging

@dataclass(frozen=True, eq=False)
class NashAveraging:
    """Maximum-entropy Nash mixture of the meta-game and each player's score against it (<= 0;
    exactly 0 for the players in the equilibrium's support)."""

    players: tuple[str, ...]
    weights: np.ndarray
    scores: np.ndarray


def payoff_matrix(games: Sequence[Game], players: Sequence[str] | None = None):
    """(players, P): P[i, j] = i's weighted mean score against j; NaN where they never met, 0.5 on the diagonal."""
    names, ia, ib, s, w = _index(games, players)
    n = len(names)
    total, played = np.zeros((n, n)), np.zeros((n, n))
    np.add.at(total, (ia, ib), w * s)
    np.add.at(total, (ib, ia), w * (1 - s))
    np.add.at(played, (ia, ib), w)
    np.add.at(played, (ib, ia), w)
    with np.errstate(invalid="ignore"):
        P = np.where(played > 0, total / np.where(played > 0, played, 1), np.nan)
    np.fill_diagonal(P, 0.5)
    return names, P


def nash_average(players: Sequence[str], payoff, unknown: str = "refuse") -> NashAveraging:
    """Nash averaging (Balduzzi et al. 2018). A = (P - P^T) / 2, which is P - 1/2 for a constant-sum
    P (P + P^T = 1, draws as halves) and antisymmetric in any case, so the game is symmetric
    zero-sum with value 0. Its Nash set is {p in simplex : A p <= 0}; the paper picks the maximum
    entropy point of it, the one that treats equivalent agents alike, which is why adding copies
    of an agent cannot change anyone's score (exactly so when the equilibrium without copies is
    unique, the generic case for empirical payoffs). Unplayed pairs (NaN) are refused, or with
    unknown="even" counted as 0.5.

    Solved in two steps: linear programs (HiGHS) find the union S of all equilibria's supports
    (max p_i over the Nash set, for each i not yet seen in a support); the max-entropy point has
    support exactly S and (A p)_S = 0, so it is found by SLSQP on the affine set
    {sum p = 1, A_SS p_S = 0} (parametrised by its null space) with p >= 0 and A_out,S p_S <= 0."""
    names = tuple(players)
    P = np.array(payoff, dtype=float)
    n = len(names)
    if P.shape != (n, n):
        raise RankingError(f"payoff must be {n}x{n} for {n} players, got shape {P.shape}")
    np.fill_diagonal(P, 0.5)
    if np.isnan(P).any():
        if unknown != "even":
            i, j = np.argwhere(np.isnan(P))[0]
            raise RankingError(f"no games between {names[i]!r} and {names[j]!r}: play them, "
                               f"or pass unknown='even' to count unplayed pairs as 0.5")
        P = np.where(np.isnan(P), 0.5, P)
    A = (P - P.T) / 2
    tol, support, vertices = 1e-9, np.zeros(n, bool), []
    options = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
    for i in range(n):
        if support[i]:
            continue
        lp = linprog(-np.eye(n)[i], A_ub=A, b_ub=np.zeros(n), A_eq=np.ones((1, n)), b_eq=[1.0],
                     bounds=(0, None), method="highs", options=options)
        if lp.status != 0:
            raise RuntimeError(f"Nash LP failed ({lp.message}): a bug, the symmetric game always has one")
        vertices.append(np.clip(lp.x, 0, None))
        support |= vertices[-1] > tol
    S, out = np.flatnonzero(support), np.flatnonzero(~support)
    p0 = np.mean(vertices, axis=0)[S]
    p0 /= p0.sum()
    basis = null_space(np.vstack([A[np.ix_(S, S)], np.ones((1, len(S)))]))
    if basis.shape[1]:
        def entropy(z):  # negative entropy and its gradient, at p clipped away from 0
            p = np.clip(p0 + basis @ z, 1e-300, None)
            return float(p @ np.log(p)), basis.T @ (np.log(p) + 1)
        constraints = [{"type": "ineq", "fun": lambda z: p0 + basis @ z, "jac": lambda z: basis}]
        if len(out):
            outside = A[np.ix_(out, S)]
            constraints.append({"type": "ineq", "fun": lambda z: -outside @ (p0 + basis @ z),
                                "jac": lambda z: -outside @ basis})
        z = minimize(entropy, np.zeros(basis.shape[1]), jac=True, method="SLSQP", constraints=constraints,
                     options={"ftol": 1e-15, "maxiter": 1000}).x
        p0 = np.clip(p0 + basis @ z, 0, None)
    weights = np.zeros(n)
    weights[S] = p0 / p0.sum()
    return NashAveraging(names, weights, A @ weights)


# -------------------------------------------------------------------------------- rank stability

@dataclass(frozen=True)
class RankStability:
    """Fewest games found whose removal flips an adjacent pair of the top places (None: no flip
    within max_removals), the pair (better first), its places and the removed games; `per_pair`
    holds (better, worse, count) for every adjacent pair of the top."""

    count: int | None
    pair: tuple[str, str] | None
    places: tuple[int, int] | None
    removed: tuple[Game, ...]
    per_pair: tuple[tuple[str, str, int | None], ...]


def rank_stability(games: Sequence[Game], top: int = 3, *, alpha: float = ALPHA, shortlist: int = 64,
                   max_removals: int | None = None) -> RankStability:
    """How many games must go to reorder the top `top` places (Huang et al. 2025)?

    Any change of the top's order flips some pair that was adjacent, so for each adjacent pair
    (i, i+1) we greedily remove one game at a time, the one whose removal most shrinks the gap
    theta_i - theta_(i+1), until the gap is <= 0 (a tie counts: the data no longer put i above
    i+1). Candidates are the `shortlist` cells ranked by their first-order influence on the gap
    (implicit-function derivative, as the paper's AMIP approximation), each then refitted exactly.
    Greedy, so each count is an upper bound on the fewest; the answer is the minimum over pairs."""
    if top < 2:
        raise RankingError(f"top must be >= 2 to have an order to flip, got {top}")
    names, ia, ib, s, w = _index(games)
    cells, inverse, counts = _cells(ia, ib, s, w)
    n, win_map = len(names), _win_map(cells, len(names))
    members = [list(np.flatnonzero(inverse == c)) for c in range(len(cells))]
    theta = _newton(_wins(counts, win_map, n), alpha)[0]
    order = np.argsort(-theta, kind="stable")
    a, b = cells[:, 0].astype(int), cells[:, 1].astype(int)
    best, per_pair = None, []
    for place in range(min(top, n) - 1):
        i, j = order[place], order[place + 1]
        left, removed, th = counts.copy(), [], theta
        while th[i] - th[j] > 1e-9 and (max_removals is None or len(removed) < max_removals):
            W = _wins(left, win_map, n)
            H, p = _hessian(th[None], W + W.transpose(0, 2, 1), alpha)
            v = np.linalg.solve(H[0], np.eye(n)[i] - np.eye(n)[j])
            influence = -cells[:, 3] * (cells[:, 2] - p[0, a, b]) * (v[a] - v[b])
            influence[left == 0] = np.inf
            candidates = np.argsort(influence, kind="stable")[:min(shortlist, int((left > 0).sum()))]
            trial = left[None].repeat(len(candidates), 0)
            trial[np.arange(len(candidates)), candidates] -= 1
            fits = _newton(_wins(trial, win_map, n), alpha, th)
            k = int(np.argmin(fits[:, i] - fits[:, j]))
            left, th = trial[k], fits[k]
            removed.append(games[members[candidates[k]][int(counts[candidates[k]] - left[candidates[k]]) - 1]])
        count = len(removed) if th[i] - th[j] <= 1e-9 else None
        per_pair.append((names[i], names[j], count))
        if count is not None and (best is None or count < best[0]):
            best = (count, (names[i], names[j]), (place + 1, place + 2), tuple(removed))
    if best is None:
        return RankStability(None, None, None, (), tuple(per_pair))
    return RankStability(*best, tuple(per_pair))


# ------------------------------------------------------------------------ rule-breaking vs skill

@dataclass(frozen=True)
class Match:
    """A finished match: player's score against opponent, how it ended ("ok", or "ERROR",
    "TIMEOUT", "INVALID", ...: a forfeit) and who was at fault (None: nobody, or unknown)."""

    player: str
    opponent: str
    score: float
    status: str = "ok"
    faulty: str | None = None
    game: str = ""

    @property
    def forfeit(self) -> bool:
        return self.status.lower() != "ok"


@dataclass(frozen=True)
class ForfeitRates:
    """Per player: matches played and the fraction of them it lost by its own rule-breaking."""

    player: str
    matches: int
    forfeits: int
    forfeit_rate: float
    error_rate: float
    timeout_rate: float
    invalid_rate: float


@dataclass(frozen=True)
class ForfeitWarning:
    player: str
    rank_with: int
    rank_without: int
    text: str


def _checked(records: Sequence[Match]) -> Sequence[Match]:
    for r in records:
        if r.faulty is not None and r.faulty not in (r.player, r.opponent):
            raise RankingError(f"match {r.player!r} vs {r.opponent!r} blames {r.faulty!r}, who did not play it: "
                               f"set faulty to one of the two players or None")
    return records


def forfeit_rates(records: Sequence[Match]) -> tuple[ForfeitRates, ...]:
    """Forfeits each player caused, overall and by kind (ERROR, TIMEOUT, INVALID), per match it
    played: rule-breaking as its own number, not folded into a rating."""
    players = sorted({r.player for r in _checked(records)} | {r.opponent for r in records})
    out = []
    for p in players:
        mine = [r for r in records if p in (r.player, r.opponent)]
        caused = [r.status.upper() for r in mine if r.forfeit and r.faulty == p]
        out.append(ForfeitRates(p, len(mine), len(caused), len(caused) / len(mine),
                                *(caused.count(kind) / len(mine) for kind in ("ERROR", "TIMEOUT", "INVALID"))))
    return tuple(out)


def ratings_without_forfeits(records: Sequence[Match], *, alpha: float = ALPHA) -> tuple[Ratings, Ratings]:
    """Bradley-Terry fitted on all matches and on the matches played to the end (same players,
    same order); a player with only forfeited matches sits at the mean in the second."""
    players = sorted({r.player for r in _checked(records)} | {r.opponent for r in records})
    games = [Game(r.player, r.opponent, r.score, game=r.game) for r in records]
    clean = [g for g, r in zip(games, records) if not r.forfeit]
    if not clean:
        raise RankingError("every match ended by a forfeit: there is no play to rate")
    return fit(games, alpha=alpha, players=players), fit(clean, alpha=alpha, players=players)


def forfeit_dependence_warnings(records: Sequence[Match], *, alpha: float = ALPHA) -> tuple[ForfeitWarning, ...]:
    """Players whose rank moves when the forfeited matches are dropped: their place comes from
    rule-breaking (theirs or their opponents'), not only from play."""
    return rank_moves(*ratings_without_forfeits(records, alpha=alpha))


def rank_moves(with_: Ratings, without: Ratings) -> tuple[ForfeitWarning, ...]:
    """`forfeit_dependence_warnings` from the two fits of `ratings_without_forfeits`."""
    r1, r2 = with_.ranks(), without.ranks()
    return tuple(ForfeitWarning(p, r1[p], r2[p], f"{p}: rank {r1[p]} counting forfeits, {r2[p]} without them; "
                                                 f"its place depends on rule-breaking, not only on play")
                 for p in with_.players if r1[p] != r2[p])


# ---------------------------------------------------------------------------------------- output

def format_ranking(ratings: Ratings, intervals: Intervals | None = None,
                   nash: NashAveraging | None = None) -> list[str]:
    """Plain-text table, best first: place, player, rating, interval, rank interval, Nash score, games."""
    pct = f"{round(100 * intervals.level)}%" if intervals else "95%"
    lines = [f"{'#':>3}  {'player':<24} {'rating':>7}  {pct + ' interval':<15} {'ranks':<7} {'nash':>7} {'games':>6}"]
    nash_of = dict(zip(nash.players, nash.scores)) if nash else {}
    for place, i in enumerate(ratings.order()):
        p = ratings.players[i]
        span = f"{intervals.low[i]:.0f}..{intervals.high[i]:.0f}" if intervals else "-"
        ranks = f"{intervals.rank_low[i]}-{intervals.rank_high[i]}" if intervals else "-"
        score = f"{nash_of[p]:+.3f}" if p in nash_of else "-"
        lines.append(f"{place + 1:>3}  {p:<24} {ratings.rating[i]:>7.1f}  {span:<15} {ranks:<7} {score:>7} "
                     f"{ratings.games[i]:>6}")
    return lines


# ------------------------------------------------------------------------------- from the ledger

@dataclass(frozen=True)
class LedgerRecords:
    """A ledger's matches as the rating views read them: one `Game` per cross-team pair of two
    players (`ludus.league.records.payoff.pair_results`, the pairing of the league's payoff table) and the same
    pairs as `Match` records that say which seat broke the rules."""

    games: tuple[Game, ...]
    matches: tuple[Match, ...]
    skipped: int
    """Matches left out: every seat failed (nothing about skill), or no pair of listed players."""
    answers: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Text agents: player -> (turns, invalid answers) over every match, from the seats' ledger
    metadata (`ludus.league.records.recorder.answer_counts`); players with no text turns absent."""


def ledger_records(matches, players=None) -> LedgerRecords:
    """Turn ledger `MatchResult`s into rating records, keeping pairs whose both players are in
    `players` (None: everyone). A pair's game kind is the match's `game_id`, so a ledger of several
    games gives per-game and combined boards. A pair is a forfeit when either player's seat ended
    with a status other than "ok"; that player is the faulty one (the first, if both failed).

    One implementation for `ludus ratings`, the report, `ludus evaluate` and the arena's
    leaderboard, so the four agree on what a game is."""
    from ludus.league.records.payoff import pair_results

    keep = None if players is None else set(players)
    games, records, skipped = [], [], 0
    answers: dict[str, list[int]] = {}
    for match in matches:
        status: dict[str, str] = {}
        for seat in match.seats:
            turns = seat.metadata.get("turns") if isinstance(seat.metadata, Mapping) else None
            if isinstance(turns, int) and turns > 0 and (keep is None or seat.player_id in keep):
                counts = answers.setdefault(seat.player_id, [0, 0])
                counts[0] += turns
                counts[1] += int(seat.metadata.get("invalid", 0) or 0)
            if status.get(seat.player_id, "ok") == "ok":
                status[seat.player_id] = seat.status
        pairs = [(a, b, s) for a, b, s in pair_results((match,)) if keep is None or (a in keep and b in keep)]
        if not pairs:
            skipped += 1
        for a, b, score in pairs:
            faulty = a if status[a] != "ok" else b if status[b] != "ok" else None
            games.append(Game(a, b, score, game=match.game_id))
            records.append(Match(a, b, score, "ok" if faulty is None else status[faulty], faulty, match.game_id))
    return LedgerRecords(tuple(games), tuple(records), skipped, {p: (t, k) for p, (t, k) in answers.items()})


# ----------------------------------------------------------------------------- all views at once

BOOTSTRAP_ROUNDS = 1000
"""Bootstrap resamples behind every interval the CLI and the pages show."""
STABILITY_TOP = 3
"""Places whose order the rank-stability figure guards."""
TIES = "ties count as half a win for each side"
"""How every Bradley-Terry board here reads a draw (stated in each header)."""


@dataclass(frozen=True, eq=False)
class Board:
    """One Bradley-Terry board: a game's (`game` its id) or the combined one (`game` empty)."""

    game: str
    ratings: Ratings
    intervals: Intervals | None
    games: int


@dataclass(frozen=True, eq=False)
class RankingViews:
    """Every rating view of one set of games, computed together so that they agree.

    `board` is the main ranking: with one game kind the plain Bradley-Terry fit, with several the
    combined board (every game kind carries the same total weight, as Kaggle's Game Arena);
    `per_game` then holds each kind's own board. Nash averaging counts pairs that never met as
    even (0.5); rank stability and the forfeit views use the pooled games.

    The bootstrap, Nash averaging and the stability search cost far more than the point fit; a
    page rebuilt every second may carry them over from an earlier computation
    (`with_point_fit`), and `slow_games` then says how many games they rest on."""

    board: Board
    nash: NashAveraging | None
    stability: RankStability | None
    top: int
    forfeits: tuple[ForfeitRates, ...]
    without_forfeits: Ratings | None
    """Bradley-Terry on the matches played to the end (None when there are no forfeits or no such matches)."""
    warnings: tuple[ForfeitWarning, ...]
    per_game: tuple[Board, ...]
    rounds: int
    seed: int
    slow_games: int
    """Games the intervals, Nash averaging, stability and per-game boards were computed on."""
    answers: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Text agents: player -> (turns, invalid answers) (`LedgerRecords.answers`)."""

    @property
    def ratings(self) -> Ratings:
        return self.board.ratings

    @property
    def intervals(self) -> Intervals | None:
        return self.board.intervals

    @property
    def multi_game(self) -> bool:
        return len(self.per_game) > 1

    @property
    def stale(self) -> bool:
        """The slow views rest on fewer games than the point fit (see `with_point_fit`)."""
        return self.slow_games != self.board.games

    def with_point_fit(self, fresh: "RankingViews") -> "RankingViews":
        """`fresh` (point fits of newer games) with this computation's slow views carried over."""
        board = Board(fresh.board.game, fresh.board.ratings, self.board.intervals, fresh.board.games)
        return RankingViews(board, self.nash, self.stability, self.top, fresh.forfeits, fresh.without_forfeits,
                            fresh.warnings, self.per_game, self.rounds, self.seed, self.slow_games)

    def rows(self) -> list[dict]:
        """Per player, best first: place, rating, interval, rank interval, Nash score, games,
        rating without forfeits, forfeit rates and per-game ratings (JSON-ready)."""
        r, iv = self.board.ratings, self.board.intervals
        at = {p: k for k, p in enumerate(iv.ratings.players)} if iv is not None else {}
        nash = dict(zip(self.nash.players, self.nash.scores)) if self.nash else {}
        clean = dict(zip(self.without_forfeits.players, self.without_forfeits.rating)) if self.without_forfeits else {}
        clean_rank = self.without_forfeits.ranks() if self.without_forfeits else {}
        faults = {f.player: f for f in self.forfeits}
        out = []
        for place, i in enumerate(r.order(), 1):
            p = r.players[i]
            f, k = faults.get(p), at.get(p)
            per_game = {}
            for b in self.per_game:
                if p in b.ratings.players:
                    j = b.ratings.players.index(p)
                    per_game[b.game] = {"rating": float(b.ratings.rating[j]), "games": int(b.ratings.games[j]),
                                        "low": None if b.intervals is None else float(b.intervals.low[j]),
                                        "high": None if b.intervals is None else float(b.intervals.high[j])}
            out.append({
                "place": place, "player": p, "rating": float(r.rating[i]), "games": int(r.games[i]),
                "low": None if k is None else float(iv.low[k]), "high": None if k is None else float(iv.high[k]),
                "rank_low": None if k is None else int(iv.rank_low[k]),
                "rank_high": None if k is None else int(iv.rank_high[k]),
                "nash": None if p not in nash else float(nash[p]),
                "rating_without_forfeits": None if p not in clean else float(clean[p]),
                "rank_without_forfeits": clean_rank.get(p),
                "forfeits": 0 if f is None else f.forfeits,
                "forfeit_rate": None if f is None else f.forfeit_rate,
                "error_rate": None if f is None else f.error_rate,
                "timeout_rate": None if f is None else f.timeout_rate,
                "invalid_rate": None if f is None else f.invalid_rate,
                "invalid_answer_rate": (self.answers[p][1] / self.answers[p][0]) if p in self.answers else None,
                **({"per_game": per_game} if self.multi_game else {})})
        return out

    def stability_text(self) -> str:
        return format_stability(self.stability, self.top)

    def to_json(self) -> dict:
        s = self.stability
        return {
            "model": "bradley-terry", "ties": "half a win", "scale": "elo-like, mean 1000",
            "rounds": self.rounds, "seed": self.seed, "level": None if self.intervals is None else self.intervals.level,
            "games": self.board.games, "slow_views_games": self.slow_games,
            "combined_equal_weight_per_game": self.multi_game,
            "players": self.rows(),
            "stability": None if s is None else {
                "top": self.top, "removals": s.count, "pair": None if s.pair is None else list(s.pair),
                "places": None if s.places is None else list(s.places), "search": "greedy (an upper bound)",
                "per_pair": [{"better": a, "worse": b, "removals": n} for a, b, n in s.per_pair],
                "text": self.stability_text()},
            "forfeit_warnings": [w.text for w in self.warnings],
            "per_game": [{"game": b.game, "games": b.games, "players": list(b.ratings.players),
                          "rating": [float(v) for v in b.ratings.rating]} for b in self.per_game],
        }


def format_stability(stability: RankStability | None, top: int = STABILITY_TOP) -> str:
    """One line: how few games must go for the top places to change order (greedy: an upper bound)."""
    if stability is None:
        return "rank stability: fewer than two rated players"
    places = min(top, len(stability.per_pair) + 1)
    if stability.count is None:
        return (f"rank stability: no removal of games found that changes the order of the top {places} "
                f"(greedy search)")
    a, b = stability.pair
    return (f"rank stability: the order of the top {places} changes after removing {stability.count} game"
            f"{'' if stability.count == 1 else 's'} ({b} passes {a} at places {stability.places[0]}-"
            f"{stability.places[1]}; greedy search: an upper bound)")


def ranking_views(records: LedgerRecords, *, rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0,
                  top: int = STABILITY_TOP, alpha: float = ALPHA, slow: bool = True) -> RankingViews:
    """All the rating views of a ledger's records (see `RankingViews`); deterministic for a given
    seed. slow=False computes the point fits and the forfeit views alone (~25 ms for 2,000 games
    among 12 players, against ~0.7 s with the 1,000-round bootstrap, Nash averaging and the
    stability search): what a page rebuilt every second affords between full computations."""
    games = list(records.games)
    if not games:
        raise RankingError("no games between two rated players yet: nothing to rank")
    kinds = sorted({g.game for g in games})
    multi = len(kinds) > 1
    iv = bootstrap_intervals(games, rounds, seed, alpha=alpha, by_game=multi) if slow else None
    board = Board("", iv.ratings if iv else fit(games, alpha=alpha, by_game=multi), iv, len(games))
    per_game, nash, stable = [], None, None
    if slow:
        if multi:
            for k, kind in enumerate(kinds):
                mine = [g for g in games if g.game == kind]
                kiv = bootstrap_intervals(mine, rounds, [seed, k], alpha=alpha)
                per_game.append(Board(kind, kiv.ratings, kiv, len(mine)))
        names, payoff = payoff_matrix(games)
        if len(names) >= 2:
            nash = nash_average(names, payoff, unknown="even")
            stable = rank_stability(games, top, alpha=alpha)
    forfeits = forfeit_rates(records.matches)
    without, warnings = None, ()
    if any(m.forfeit for m in records.matches) and not all(m.forfeit for m in records.matches):
        with_, without = ratings_without_forfeits(records.matches, alpha=alpha)
        warnings = rank_moves(with_, without)
    return RankingViews(board, nash, stable, top, forfeits, without, warnings, tuple(per_game), rounds, seed,
                        len(games) if slow else 0, dict(records.answers))


def format_views(views: RankingViews, trueskill=None, label: str = "player") -> list[str]:
    """The ranking as text: one row per player, best Bradley-Terry first, with its TrueSkill
    (`trueskill`: player -> object with mu, sigma, conservative) beside it, then the stability
    line, forfeit rates (players with any) and forfeit-dependence warnings; with several games a
    member x game table follows."""
    iv = views.intervals
    pct = f"{round(100 * iv.level)}%" if iv else "95%"
    rows = views.rows()
    width = max([len(label), *(len(r["player"]) for r in rows)])
    ts = trueskill or {}
    lines = [f"{'#':>3}  {label:<{width}} {'mu':>7} {'sigma':>6} {'mu-3s':>7}  {'BT':>6}  {pct + ' interval':<13} "
             f"{'ranks':<6} {'nash':>7} {'games':>6}"]
    for r in rows:
        t = ts.get(r["player"])
        mu = f"{t.mu:7.2f} {t.sigma:6.2f} {t.conservative:7.2f}" if t is not None else f"{'-':>7} {'-':>6} {'-':>7}"
        span = f"{r['low']:.0f}..{r['high']:.0f}" if r["low"] is not None else "-"
        ranks = f"{r['rank_low']}-{r['rank_high']}" if r["rank_low"] is not None else "-"
        nash = f"{r['nash']:+.3f}" if r["nash"] is not None else "-"
        lines.append(f"{r['place']:>3}  {r['player']:<{width}} {mu}  {r['rating']:6.0f}  {span:<13} {ranks:<6} "
                     f"{nash:>7} {r['games']:>6}")
    lines.append(views.stability_text())
    faulty = [f for f in views.forfeits if f.forfeits]
    if faulty:
        lines.append("forfeits (share of its matches it lost by its own fault: all, error, timeout, invalid):")
        for f in faulty:
            lines.append(f"  {f.player:<{width}} {f.forfeit_rate:6.1%} {f.error_rate:6.1%} {f.timeout_rate:6.1%} "
                         f"{f.invalid_rate:6.1%}  ({f.forfeits} of {f.matches})")
        if views.without_forfeits is not None:
            clean = views.without_forfeits
            lines.append("without forfeited matches: " + ", ".join(
                f"{clean.players[i]} {clean.rating[i]:.0f}" for i in clean.order()))
    if views.answers:
        lines.append("invalid answers (responses that did not count, retries and moves the game refused "
                     "included, per turn):")
        for p, (turns, invalid) in sorted(views.answers.items()):
            lines.append(f"  {p:<{width}} {invalid / turns:6.2f}  ({invalid} in {turns} turns)")
    for w in views.warnings:
        lines.append(f"warning: {w.text}")
    if views.multi_game:
        lines += format_game_table(views, label)
    return lines


def format_game_table(views: RankingViews, label: str = "player") -> list[str]:
    """Member x game: each game's own Bradley-Terry rating (and games), and the combined board."""
    kinds = [b.game for b in views.per_game]
    rows = views.rows()
    width = max([len(label), *(len(r["player"]) for r in rows)])
    cols = [max(len(k), 12) for k in kinds]
    lines = [f"per game (each game's own fit; 'combined': every game the same total weight):",
             f"  {label:<{width}} " + " ".join(f"{k:>{c}}" for k, c in zip(kinds, cols)) + f" {'combined':>9}"]
    for r in rows:
        cells = []
        for k, c in zip(kinds, cols):
            g = r.get("per_game", {}).get(k)
            cells.append(f"{g['rating']:.0f} ({g['games']})".rjust(c) if g else "-".rjust(c))
        lines.append(f"  {r['player']:<{width}} " + " ".join(cells) + f" {r['rating']:9.0f}")
    return lines
