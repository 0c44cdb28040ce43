"""Matchmaking: who plays whom. Pure functions; randomness only through an explicit Generator.

* Prioritised fictitious self-play (PFSP, Vinyals et al. 2019, "Grandmaster level in StarCraft II
  using multi-agent reinforcement learning", Methods): opponent B is drawn with probability
  proportional to f(P[A beats B]); f_hard(x) = (1 - x)^p focuses on the opponents A loses to,
  f_var(x) = x (1 - x) on opponents of A's level.
* Uniform over the pool (fictitious self-play), plain self-play, and TrueSkill match quality
  (draw probability between the two players, Herbrich et al. 2007).
* The rating scheduler spends rating games where ratings are least certain.

Everything is vectorised over the candidate pool: one call draws hundreds of opponents with a few
numpy operations, O(pool + draws), never a Python loop over pairs of players.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from ludus.league.records.payoff import PayoffTable
from ludus.league.records.ratings import RatingTable, quality_1vs1_arrays
from ludus.league.stats import wilson_interval

PfspWeighting = Literal["hard", "var", "linear", "squared"]

# w(t, eps) of a two-player win at t = eps (an even match, no draw margin): v = pdf(0)/cdf(0),
# w = v^2 = 2/pi. Used to predict how much one more game will shrink a rating's variance.
_EVEN_MATCH_W = 2.0 / math.pi


def pfsp_weights(win_probs: Sequence[float] | np.ndarray, weighting: PfspWeighting = "hard",
                 p: float = 2.0) -> np.ndarray:
    """Normalised PFSP sampling weights from P[learner beats candidate].

    Args:
        win_probs: P[learner beats each candidate], in [0, 1].
        weighting: "hard": (1 - x)^p; "var": x (1 - x); "linear": 1 - x; "squared": (1 - x)^2.
        p: exponent of the "hard" weighting.

    Returns:
        Weights summing to 1; uniform when every raw weight is zero (e.g. "hard" against a pool the
        learner always beats), so sampling never fails.
    """
    x = np.asarray(win_probs, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"win_probs must be one-dimensional, got shape {x.shape}")
    if np.any((x < 0) | (x > 1)) or not np.all(np.isfinite(x)):
        raise ValueError("win_probs must be probabilities in [0, 1]")
    if weighting == "hard":
        raw = (1.0 - x) ** p
    elif weighting == "var":
        raw = x * (1.0 - x)
    elif weighting == "linear":
        raw = 1.0 - x
    elif weighting == "squared":
        raw = (1.0 - x) ** 2
    else:
        raise ValueError(f"unknown PFSP weighting {weighting!r}; use 'hard', 'var', 'linear' or 'squared'")
    return _normalised(raw)


def _normalised(raw: np.ndarray) -> np.ndarray:
    total = raw.sum()
    if len(raw) == 0:
        return raw
    if not total > 0:
        return np.full(len(raw), 1.0 / len(raw))
    return raw / total


def sample_pfsp(rng: np.random.Generator, candidates: Sequence[str], win_probs: Sequence[float] | np.ndarray,
                weighting: PfspWeighting = "hard", p: float = 2.0) -> int:
    """Index of one candidate drawn by PFSP."""
    if len(candidates) != len(win_probs):
        raise ValueError(f"{len(candidates)} candidates but {len(win_probs)} win probabilities")
    if not candidates:
        raise ValueError("no candidates to sample from")
    return int(rng.choice(len(candidates), p=pfsp_weights(win_probs, weighting, p)))


def sample_uniform(rng: np.random.Generator, candidates: Sequence[str]) -> int:
    """Index of one candidate drawn uniformly (fictitious self-play)."""
    if not candidates:
        raise ValueError("no candidates to sample from")
    return int(rng.integers(len(candidates)))


def quality_weights(ratings: RatingTable, player_id: str, candidates: Sequence[str]) -> np.ndarray:
    """Normalised weights proportional to TrueSkill match quality between `player_id` and each candidate."""
    me = ratings.rating(player_id)
    mu, sigma = ratings.arrays(candidates)
    return _normalised(quality_1vs1_arrays(me.mu, me.sigma, mu, sigma, ratings.params))


@dataclass(frozen=True)
class MatchmakingMix:
    """How one role picks its opponents: relative weights of the methods, plus PFSP's shape.

    The league keeps one mix per role; e.g. an AlphaStar-like main agent uses
    self_play=0.35, pfsp=0.5, uniform=0.15, and an exploiter pfsp=1 with weighting "var".
    """

    self_play: float = 0.0
    """Weight of playing the learner's own current policy."""
    pfsp: float = 1.0
    """Weight of prioritised fictitious self-play against the candidate pool."""
    uniform: float = 0.0
    """Weight of a uniform draw from the candidate pool (fictitious self-play)."""
    quality: float = 0.0
    """Weight of a draw proportional to TrueSkill match quality."""
    pfsp_weighting: PfspWeighting = "hard"
    """PFSP weighting function: "hard", "var", "linear" or "squared"."""
    pfsp_p: float = 2.0
    """Exponent p of f_hard(x) = (1 - x)^p."""

    def __post_init__(self) -> None:
        weights = (self.self_play, self.pfsp, self.uniform, self.quality)
        if any(not w >= 0 for w in weights) or not sum(weights) > 0:
            raise ValueError(f"matchmaking weights must be >= 0 with a positive sum, got {weights}")
        if self.pfsp_weighting not in ("hard", "var", "linear", "squared"):
            raise ValueError(f"unknown PFSP weighting {self.pfsp_weighting!r}")

    @property
    def probabilities(self) -> np.ndarray:
        """(self_play, pfsp, uniform, quality) normalised to sum to 1."""
        weights = np.array([self.self_play, self.pfsp, self.uniform, self.quality], dtype=np.float64)
        return weights / weights.sum()


def sample_opponents(rng: np.random.Generator, mix: MatchmakingMix, learner_id: str, candidates: Sequence[str],
                     payoff: PayoffTable | None, ratings: RatingTable | None, n: int) -> list[str]:
    """Draw `n` opponents for `learner_id`: each draw picks a method by `mix`, then an opponent.

    Self-play draws return `learner_id`. With an empty pool every draw is self-play (the first
    iterations of a league, before any snapshot exists). Cost: O(len(candidates) + n) numpy work.

    Args:
        rng: the only source of randomness.
        mix: method weights of the learner's role.
        learner_id: the player the opponents are for (its payoff row and rating are used).
        candidates: the opponent pool (player ids).
        payoff: needed when mix.pfsp > 0.
        ratings: needed when mix.quality > 0.
        n: number of opponents to draw.
    """
    if n <= 0:
        return []
    if not candidates:
        return [learner_id] * n
    methods = rng.choice(4, size=n, p=mix.probabilities)
    choice = np.full(n, -1, dtype=np.int64)  # -1 = self-play
    pool = len(candidates)
    for method in (1, 2, 3):
        slots = np.flatnonzero(methods == method)
        if len(slots) == 0:
            continue
        if method == 1:
            if payoff is None:
                raise ValueError("this mix uses PFSP, which needs a payoff table")
            weights = pfsp_weights(payoff.win_probs(learner_id, candidates), mix.pfsp_weighting, mix.pfsp_p)
            choice[slots] = rng.choice(pool, size=len(slots), p=weights)
        elif method == 2:
            choice[slots] = rng.integers(pool, size=len(slots))
        else:
            if ratings is None:
                raise ValueError("this mix uses match quality, which needs a rating table")
            choice[slots] = rng.choice(pool, size=len(slots), p=quality_weights(ratings, learner_id, candidates))
    return [learner_id if c < 0 else candidates[c] for c in choice.tolist()]


def schedule_rating_matches(rng: np.random.Generator, ratings: RatingTable, players: Sequence[str],
                            n: int, sides: Sequence[int | None] | None = None) -> list[tuple[str, str]]:
    """Pick `n` rating games among `players`, most uncertain ratings first, opponents by match quality.

    Greedy: repeatedly take the player whose (predicted) rating variance is largest (ties broken
    at random) and draw its opponent among the others with probability proportional to TrueSkill
    match quality. After each pick both players' predicted variances shrink as one even game
    would shrink them (sigma^2 <- sigma^2 (1 - sigma^2 / c^2 * 2/pi)), so a new snapshot gets
    several games in a batch while settled players get few. Seat order is random. The arena's
    ladder uses the same function.

    `sides`: for a game of two different sides (predators and prey), each player's side, 0 or 1,
    or None for one that plays either (an anchor bot): opponents are then drawn from the other
    side, and each pair is returned as (side 0, side 1).

    Returns:
        `n` (first seat, second seat) pairs; fewer when no two players can meet, [] when fewer
        than two players.
    """
    if n <= 0 or len(players) < 2:
        return []
    order = rng.permutation(len(players))  # argmax takes the first maximum: random tie-breaking
    ids = [players[i] for i in order.tolist()]
    side = None if sides is None else [sides[i] for i in order.tolist()]
    mu, sigma = ratings.arrays(ids)
    predicted_var = sigma ** 2
    two_beta_sq = 2 * ratings.params.beta ** 2
    quality_cdfs: dict[int, np.ndarray] = {}  # cumulative quality weights of i's opponents
    firsts, seconds = [], []
    uniforms = rng.random(n)
    while len(firsts) < n:
        i = int(np.argmax(predicted_var))
        if not np.isfinite(predicted_var[i]):
            break  # nobody left who has an opponent
        cdf = quality_cdfs.get(i)
        if cdf is None:
            allowed = np.ones(len(ids), dtype=bool)
            allowed[i] = False
            if side is not None and side[i] is not None:
                allowed &= np.array([s != side[i] for s in side])
            if not allowed.any():  # no one can meet it: never pick it again
                predicted_var[i] = -np.inf
                continue
            row = np.where(allowed, quality_1vs1_arrays(mu[i], sigma[i], mu, sigma, ratings.params), 0.0)
            if not row.sum() > 0:  # every quality underflowed: any allowed opponent will do
                row = allowed.astype(np.float64)
            cdf = quality_cdfs[i] = np.cumsum(row)
        # inverse-cdf draw; side="right" never lands on a zero-weight entry (e.g. i itself), and
        # the target stays below the total even when u * total rounds up to it
        target = min(uniforms[len(firsts)] * cdf[-1], np.nextafter(cdf[-1], 0.0))
        j = int(np.searchsorted(cdf, target, side="right"))
        c_sq = two_beta_sq + predicted_var[i] + predicted_var[j]
        predicted_var[i] *= 1 - predicted_var[i] / c_sq * _EVEN_MATCH_W
        predicted_var[j] *= 1 - predicted_var[j] / c_sq * _EVEN_MATCH_W
        firsts.append(i)
        seconds.append(j)
    swap = rng.random(len(firsts)) < 0.5
    if side is not None:
        # the side-1 player (or the side-0 player's opponent) takes the second seat
        swap = np.array([side[a] == 1 or side[b] == 0 if side[a] is not None or side[b] is not None else s
                         for a, b, s in zip(firsts, seconds, swap.tolist())], dtype=bool)
    return [(ids[b], ids[a]) if s else (ids[a], ids[b]) for a, b, s in zip(firsts, seconds, swap.tolist())]


def sigma_converged(ratings: RatingTable, players: Sequence[str], threshold: float) -> bool:
    """True when every player's sigma is at most `threshold` (unknown players have the prior sigma)."""
    if not players:
        return True
    _, sigma = ratings.arrays(players)
    return bool(np.all(sigma <= threshold))


def snapshot_due(steps_since: int, every_n_steps: int | None, wins: float, draws: float, games: float,
                 wilson_threshold: float | None, z: float = 1.96) -> bool:
    """Whether the learner should be frozen into a new snapshot now.

    Due after `every_n_steps` environment steps since the last snapshot, or earlier when the Wilson
    lower bound of its score against the pool ((wins + draws/2) / games) reaches `wilson_threshold`
    (AlphaStar freezes a main exploiter once it beats its target 70% of the time). Either trigger
    may be disabled with None.
    """
    if every_n_steps is not None and steps_since >= every_n_steps:
        return True
    if wilson_threshold is not None and games > 0:
        lower, _ = wilson_interval(wins + draws / 2, games, z)
        return lower >= wilson_threshold
    return False
