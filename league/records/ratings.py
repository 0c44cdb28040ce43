"""TrueSkill ratings derived from the match ledger.

TrueSkill (Herbrich, Minka & Graepel, NIPS 2007) models each player's skill as a Gaussian
N(mu, sigma^2); a game's performances are skill + N(0, beta^2) noise, and a result truncates the
performance difference (win: d > eps, draw: |d| <= eps, with the draw margin eps set from the
game's draw probability).

The general case (n seats, teams, multi-way ranks) goes through the `trueskill` package's factor
graph. Two-player games, the bulk of a league's rating matches, take an exact closed-form fast
path (Herbrich et al. 2007, eqs. for the two-player update; Moser, "Computing your skill", 2010):

    c^2    = 2 beta^2 + sigma_w^2 + sigma_l^2
    mu_w  += sigma_w^2 / c * v(t, e)          mu_l -= sigma_l^2 / c * v(t, e)
    sigma^2 *= 1 - sigma^2 / c^2 * w(t, e)    t = (mu_w - mu_l) / c,  e = eps / c

with v, w the truncated-Gaussian correction functions for a win or a draw. The normal cdf/pdf/ppf
are copied from trueskill's default backend (`trueskill.backends`: a Chebyshev erfc good to
~1.2e-7, and its Newton-refined erfcinv), not `math.erf`, because matching `trueskill.rate_1vs1`
to 1e-9 means matching its approximation, not the true normal distribution.

Ratings are a pure function of the ledger: `rebuild_ratings` replays it in seq order through
the same `RatingTable.update` and reproduces the live table bit for bit.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import trueskill

from ludus.league.records.ledger import MatchResult, RatingRecord, Store
from ludus.league.records.player_index import PlayerIndex
from ludus.errors import UserError

PARAMS_META_KEY = "trueskill_params"
"""Ledger meta key under which the TrueSkill parameters of a run are stored."""


class RatingParamsError(UserError, ValueError):
    """Invalid TrueSkill parameters, or parameters that differ from the ones a ledger was rated with."""


@dataclass(frozen=True)
class TrueSkillParams:
    """TrueSkill constants of one game. Stored in the ledger meta so a rebuild uses the same ones."""

    mu: float = 25.0
    """Prior mean of a new player's skill."""
    sigma: float = 25.0 / 3.0
    """Prior standard deviation of a new player's skill."""
    beta: float = 25.0 / 6.0
    """Performance noise: a skill gap of beta means about a 76% chance of winning."""
    tau: float = 0.0
    """Skill drift added before each update; 0 because snapshots are frozen and do not change."""
    draw_probability: float = 0.1
    """Prior probability that a game between equals is drawn; sets the draw margin. Must be > 0:
    even games that cannot draw by their rules end drawn when truncated, and TrueSkill's draw
    update is degenerate at a zero margin."""

    def __post_init__(self) -> None:
        if not (self.sigma > 0 and self.beta > 0 and self.tau >= 0):
            raise RatingParamsError(f"TrueSkill needs sigma > 0, beta > 0, tau >= 0; got {self}")
        if not 0.0 < self.draw_probability < 1.0:
            raise RatingParamsError(
                f"draw_probability must be in (0, 1), got {self.draw_probability}; use a small value "
                f"such as 0.01 for games that rarely draw")

    @functools.cached_property
    def env(self) -> trueskill.TrueSkill:
        """A `trueskill.TrueSkill` environment with these constants (default backend)."""
        return trueskill.TrueSkill(mu=self.mu, sigma=self.sigma, beta=self.beta, tau=self.tau,
                                   draw_probability=self.draw_probability)

    @functools.cached_property
    def draw_margin_1vs1(self) -> float:
        """The draw margin eps of a two-player game, exactly as `trueskill.calc_draw_margin(p, 2)`."""
        return _ppf((self.draw_probability + 1) / 2.0) * math.sqrt(2) * self.beta

    def to_json(self) -> dict[str, float]:
        return {"mu": self.mu, "sigma": self.sigma, "beta": self.beta, "tau": self.tau,
                "draw_probability": self.draw_probability}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TrueSkillParams":
        expected = {"mu", "sigma", "beta", "tau", "draw_probability"}
        if set(data) != expected:
            raise RatingParamsError(f"TrueSkill parameters need exactly the keys {sorted(expected)}, got {sorted(data)}")
        return cls(**{k: float(v) for k, v in data.items()})


def ensure_params(store: Store, params: TrueSkillParams) -> TrueSkillParams:
    """Check `params` against the ones the ledger was rated with; store them if it has none yet.

    Raises `RatingParamsError` when the ledger was rated with different parameters, since mixing
    them would make the stored ratings history impossible to reproduce.
    """
    stored = store.get_meta(PARAMS_META_KEY)
    if stored is None:
        store.set_meta(PARAMS_META_KEY, params.to_json())
        return params
    stored_params = TrueSkillParams.from_json(stored)
    if stored_params != params:
        raise RatingParamsError(f"the ledger in {store.directory} was rated with {stored_params}, not {params}; "
                                f"use the stored parameters or a new run directory")
    return stored_params


def load_params(store: Store) -> TrueSkillParams | None:
    """The TrueSkill parameters stored in the ledger meta, or None."""
    stored = store.get_meta(PARAMS_META_KEY)
    return None if stored is None else TrueSkillParams.from_json(stored)


@dataclass(frozen=True)
class Rating:
    """A player's skill belief N(mu, sigma^2)."""

    mu: float
    """Mean skill."""
    sigma: float
    """Standard deviation of the skill belief."""

    @property
    def conservative(self) -> float:
        """mu - 3 sigma: a skill the player exceeds with ~99.9% probability (leaderboard key)."""
        return conservative(self.mu, self.sigma)


def conservative(mu: float | np.ndarray, sigma: float | np.ndarray) -> float | np.ndarray:
    """Conservative skill estimate mu - 3 sigma (floats or arrays)."""
    return mu - 3.0 * sigma


# ---------------------------------------------------------------------------------------------
# trueskill's default backend, reproduced (scalar and numpy)
# ---------------------------------------------------------------------------------------------

_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


def _erfc(x: float) -> float:
    """trueskill.backends.erfc: Numerical Recipes' erfcc (Chebyshev fit, |rel. error| < 1.2e-7)."""
    z = abs(x)
    t = 1. / (1. + z / 2.)
    r = t * math.exp(-z * z - 1.26551223 + t * (1.00002368 + t * (
        0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
            0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
                -0.82215223 + t * 0.17087277)))))))))
    return 2. - r if x < 0 else r


def _cdf(x: float) -> float:
    return 0.5 * _erfc(-x / math.sqrt(2))


def _pdf(x: float) -> float:
    return _INV_SQRT_2PI * math.exp(-(x ** 2 / 2))


def _ppf(p: float) -> float:
    """trueskill.backends ppf: inverse of `_cdf` via its erfcinv (initial guess + 2 Newton steps)."""
    y = 2 * p
    if y >= 2:
        erfcinv = -100.
    elif y <= 0:
        erfcinv = 100.
    else:
        zero_point = y < 1
        if not zero_point:
            y = 2 - y
        t = math.sqrt(-2 * math.log(y / 2.))
        x = -0.70711 * ((2.30753 + t * 0.27061) / (1. + t * (0.99229 + t * 0.04481)) - t)
        for _ in range(2):
            err = _erfc(x) - y
            x += err / (1.12837916709551257 * math.exp(-(x ** 2)) - x * err)
        erfcinv = x if zero_point else -x
    return -math.sqrt(2) * erfcinv


def _floating_point_error() -> FloatingPointError:
    # Same condition and type as trueskill: the result is an upset so extreme (>~38 performance
    # standard deviations) that the truncated Gaussian underflows in double precision.
    return FloatingPointError("TrueSkill update underflowed: the result is too improbable under the current ratings")


def _v_win(diff: float, draw_margin: float) -> float:
    x = diff - draw_margin
    denom = _cdf(x)
    return (_pdf(x) / denom) if denom else -x


def _w_win(diff: float, draw_margin: float) -> float:
    x = diff - draw_margin
    v = _v_win(diff, draw_margin)
    w = v * (v + x)
    if 0 < w < 1:
        return w
    raise _floating_point_error()


def _v_draw(diff: float, draw_margin: float) -> float:
    abs_diff = abs(diff)
    a, b = draw_margin - abs_diff, -draw_margin - abs_diff
    denom = _cdf(a) - _cdf(b)
    numer = _pdf(b) - _pdf(a)
    return ((numer / denom) if denom else a) * (-1 if diff < 0 else +1)


def _w_draw(diff: float, draw_margin: float) -> float:
    abs_diff = abs(diff)
    a, b = draw_margin - abs_diff, -draw_margin - abs_diff
    denom = _cdf(a) - _cdf(b)
    if not denom:
        raise _floating_point_error()
    v = _v_draw(abs_diff, draw_margin)
    return (v ** 2) + (a * _pdf(a) - b * _pdf(b)) / denom


def _erfc_np(x: np.ndarray) -> np.ndarray:
    z = np.abs(x)
    t = 1. / (1. + z / 2.)
    r = t * np.exp(-z * z - 1.26551223 + t * (1.00002368 + t * (
        0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
            0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
                -0.82215223 + t * 0.17087277)))))))))
    return np.where(x < 0, 2. - r, r)


def _cdf_np(x: np.ndarray) -> np.ndarray:
    return 0.5 * _erfc_np(-x / math.sqrt(2))


def _pdf_np(x: np.ndarray) -> np.ndarray:
    return _INV_SQRT_2PI * np.exp(-(x ** 2 / 2))


# ---------------------------------------------------------------------------------------------
# Two-player updates
# ---------------------------------------------------------------------------------------------


def rate_1vs1(first: Rating, second: Rating, drawn: bool, params: TrueSkillParams) -> tuple[Rating, Rating]:
    """Exact two-player TrueSkill update; `first` won unless `drawn`. Equals `trueskill.rate_1vs1`.

    Raises FloatingPointError exactly when trueskill does (an upset beyond double precision).
    """
    tau_sq = params.tau ** 2
    var1 = first.sigma ** 2 + tau_sq
    var2 = second.sigma ** 2 + tau_sq
    c_sq = 2 * params.beta ** 2 + var1 + var2
    c = math.sqrt(c_sq)
    t = (first.mu - second.mu) / c
    eps = params.draw_margin_1vs1 / c
    if drawn:
        v, w = _v_draw(t, eps), _w_draw(t, eps)
    else:
        v, w = _v_win(t, eps), _w_win(t, eps)
    return (Rating(first.mu + var1 / c * v, math.sqrt(var1 * (1 - var1 / c_sq * w))),
            Rating(second.mu - var2 / c * v, math.sqrt(var2 * (1 - var2 / c_sq * w))))


def rate_1vs1_batch(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray,
                    drawn: np.ndarray, params: TrueSkillParams
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`rate_1vs1` over arrays of independent pairs (player 1 won unless `drawn`).

    For what-if analysis and pairs that share no player (e.g. one ladder round). numpy's exp
    differs from libm's in the last bit for some inputs, so this agrees with `rate_1vs1` to
    ~1e-15 relative, not bit for bit; a table that must be rebuilt exactly uses `RatingTable.update`.

    Returns:
        (new_mu1, new_sigma1, new_mu2, new_sigma2).
    """
    mu1, sigma1, mu2, sigma2 = (np.asarray(a, dtype=np.float64) for a in (mu1, sigma1, mu2, sigma2))
    drawn = np.asarray(drawn, dtype=bool)
    tau_sq = params.tau ** 2
    var1 = sigma1 ** 2 + tau_sq
    var2 = sigma2 ** 2 + tau_sq
    c_sq = 2 * params.beta ** 2 + var1 + var2
    c = np.sqrt(c_sq)
    t = (mu1 - mu2) / c
    eps = params.draw_margin_1vs1 / c
    with np.errstate(divide="ignore", invalid="ignore"):
        # win: v = pdf(x) / cdf(x), x = t - eps; w = v (v + x)
        x = t - eps
        cdf_x = _cdf_np(x)
        v_win = np.where(cdf_x != 0, _pdf_np(x) / cdf_x, -x)
        w_win = v_win * (v_win + x)
        # draw: truncation to |d| <= eps, evaluated at |t| and signed back
        abs_t = np.abs(t)
        a, b = eps - abs_t, -eps - abs_t
        pdf_a, pdf_b = _pdf_np(a), _pdf_np(b)
        denom = _cdf_np(a) - _cdf_np(b)
        v_draw_abs = np.where(denom != 0, (pdf_b - pdf_a) / denom, a)
        w_draw = v_draw_abs ** 2 + (a * pdf_a - b * pdf_b) / denom
        v_draw = v_draw_abs * np.where(t < 0, -1.0, 1.0)
    v = np.where(drawn, v_draw, v_win)
    w = np.where(drawn, w_draw, w_win)
    bad = np.where(drawn, denom == 0, ~((w_win > 0) & (w_win < 1)))
    if np.any(bad):
        raise _floating_point_error()
    return (mu1 + var1 / c * v, np.sqrt(var1 * (1 - var1 / c_sq * w)),
            mu2 - var2 / c * v, np.sqrt(var2 * (1 - var2 / c_sq * w)))


# ---------------------------------------------------------------------------------------------
# Match quality
# ---------------------------------------------------------------------------------------------


def quality_1vs1(first: Rating, second: Rating, params: TrueSkillParams) -> float:
    """TrueSkill match quality (draw probability relative to equals) of a two-player game.

    q = sqrt(2 beta^2 / c^2) exp(-(mu1 - mu2)^2 / (2 c^2)), c^2 = 2 beta^2 + sigma1^2 + sigma2^2
    (Herbrich et al. 2007, eq. for two players); equals `trueskill.quality_1vs1`.
    """
    two_beta_sq = 2 * params.beta ** 2
    c_sq = two_beta_sq + first.sigma ** 2 + second.sigma ** 2
    return math.sqrt(two_beta_sq / c_sq) * math.exp(-((first.mu - second.mu) ** 2) / (2 * c_sq))


def quality_1vs1_arrays(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray,
                        params: TrueSkillParams) -> np.ndarray:
    """`quality_1vs1` elementwise over broadcastable arrays."""
    two_beta_sq = 2 * params.beta ** 2
    c_sq = two_beta_sq + np.square(sigma1) + np.square(sigma2)
    return np.sqrt(two_beta_sq / c_sq) * np.exp(-np.square(np.subtract(mu1, mu2)) / (2 * c_sq))


def match_quality(teams: Sequence[Sequence[Rating]], params: TrueSkillParams) -> float:
    """TrueSkill match quality of any number of teams (closed form for one-vs-one)."""
    if len(teams) == 2 and len(teams[0]) == 1 and len(teams[1]) == 1:
        return quality_1vs1(teams[0][0], teams[1][0], params)
    groups = [tuple(trueskill.Rating(r.mu, r.sigma) for r in team) for team in teams]
    return float(params.env.quality(groups))


# ---------------------------------------------------------------------------------------------
# The rating table
# ---------------------------------------------------------------------------------------------


def is_rateable(match: MatchResult) -> bool:
    """Whether a match can update TrueSkill ratings.

    Not when every seat failed (no information), when there is a single team (nothing to rank),
    or when one player sits on two teams (self-play: one player cannot take two posteriors). One
    player on several seats of the same team (a parameter-shared team) is fine.
    """
    team_of_player: dict[str, int] = {}
    for seat in match.seats:
        if team_of_player.setdefault(seat.player_id, seat.team) != seat.team:
            return False
    return match.has_result and len(match.team_outcomes()) >= 2


class RatingTable(PlayerIndex):
    """player_id -> Rating, updated one match at a time.

    Players appear with the prior (params.mu, params.sigma) on first use. Values live in growable
    numpy arrays so that matchmaking reads many players' ratings in one vectorised call.
    """

    def __init__(self, params: TrueSkillParams | None = None):
        super().__init__()
        self.params = params if params is not None else TrueSkillParams()
        self._mu = np.empty(16, dtype=np.float64)
        self._sigma = np.empty(16, dtype=np.float64)

    def add(self, player_id: str) -> None:
        """Enter a player with the prior rating (no-op if present); amortised O(1)."""
        if player_id in self._index:
            return
        n = len(self._ids)
        if n == len(self._mu):
            self._mu = np.concatenate([self._mu, np.empty_like(self._mu)])
            self._sigma = np.concatenate([self._sigma, np.empty_like(self._sigma)])
        self._mu[n] = self.params.mu
        self._sigma[n] = self.params.sigma
        self._index[player_id] = n
        self._ids.append(player_id)

    def rating(self, player_id: str) -> Rating:
        """The player's rating; the prior for a player not in the table (without adding it)."""
        i = self._index.get(player_id)
        if i is None:
            return Rating(self.params.mu, self.params.sigma)
        return Rating(float(self._mu[i]), float(self._sigma[i]))

    def arrays(self, player_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(mu, sigma) arrays for these players, the prior for unknown ones."""
        index = np.fromiter((self._index.get(p, -1) for p in player_ids), dtype=np.int64, count=len(player_ids))
        known = index >= 0
        mu = np.full(len(player_ids), self.params.mu)
        sigma = np.full(len(player_ids), self.params.sigma)
        mu[known] = self._mu[index[known]]
        sigma[known] = self._sigma[index[known]]
        return mu, sigma

    def as_dict(self) -> dict[str, Rating]:
        """All ratings, in table order."""
        return {p: Rating(float(self._mu[i]), float(self._sigma[i])) for i, p in enumerate(self._ids)}

    def leaderboard(self) -> list[tuple[str, Rating]]:
        """Players sorted by conservative rating (mu - 3 sigma), best first; ties by id."""
        return sorted(self.as_dict().items(), key=lambda item: (-item[1].conservative, item[0]))

    def _set(self, player_id: str, rating: Rating) -> None:
        self.add(player_id)
        i = self._index[player_id]
        self._mu[i] = rating.mu
        self._sigma[i] = rating.sigma

    def update(self, match: MatchResult) -> dict[str, Rating]:
        """Apply one match's result; return the new ratings of its players ({} if not rateable).

        Seats of one team form a TrueSkill rating group; teams are ranked by their outcome (higher
        is better, equal is a tie). Two single-seat teams use the exact closed form, anything else
        `trueskill.TrueSkill.rate`.
        """
        if not is_rateable(match):
            return {}
        teams: dict[int, list[str]] = {}
        for seat in match.seats:
            members = teams.setdefault(seat.team, [])
            # A team whose seats share one policy (parameter-shared MAPPO) is one player.
            if seat.player_id not in members:
                members.append(seat.player_id)
        outcomes = match.team_outcomes()
        if len(teams) == 2 and all(len(members) == 1 for members in teams.values()):
            (team_a, (player_a,)), (team_b, (player_b,)) = teams.items()
            if outcomes[team_a] >= outcomes[team_b]:
                winner, loser = player_a, player_b
            else:
                winner, loser = player_b, player_a
            new_winner, new_loser = rate_1vs1(self.rating(winner), self.rating(loser),
                                              outcomes[team_a] == outcomes[team_b], self.params)
            self._set(winner, new_winner)
            self._set(loser, new_loser)
            return {player_a: self.rating(player_a), player_b: self.rating(player_b)}
        groups = [tuple(trueskill.Rating(*_as_tuple(self.rating(p))) for p in members) for members in teams.values()]
        ranks = [-outcomes[team] for team in teams]  # trueskill: lower rank is better
        rated = self.params.env.rate(groups, ranks=ranks)
        new: dict[str, Rating] = {}
        for members, group in zip(teams.values(), rated):
            for player_id, r in zip(members, group):
                new[player_id] = Rating(float(r.mu), float(r.sigma))
                self._set(player_id, new[player_id])
        return {p: new[p] for p in match.player_ids}

    def to_json(self) -> dict[str, Any]:
        """Exact JSON form (floats round-trip through JSON's shortest repr)."""
        return {"params": self.params.to_json(),
                "ratings": [[p, float(self._mu[i]), float(self._sigma[i])] for i, p in enumerate(self._ids)]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RatingTable":
        table = cls(TrueSkillParams.from_json(data["params"]))
        for player_id, mu, sigma in data["ratings"]:
            table._set(player_id, Rating(float(mu), float(sigma)))
        return table

    def _truncate(self, n_players: int) -> None:
        """Forget the players that entered after the first `n_players` (undo of a failed batch)."""
        for player_id in self._ids[n_players:]:
            del self._index[player_id]
        del self._ids[n_players:]


def _as_tuple(r: Rating) -> tuple[float, float]:
    return r.mu, r.sigma


def rate_and_record(store: Store, table: RatingTable, results: Sequence[MatchResult],
                    kinds: Iterable[str] = ("rating",)) -> list[int]:
    """Record a batch in the ledger and rate its matches of `kinds`, atomically.

    Updates `table` in batch (= ledger) order and writes the matches together with the ratings
    they produced in one transaction. If the write fails (e.g. a duplicate match id) the table
    is restored, so the table and the ledger never disagree.

    Returns:
        The seq of each match.
    """
    kinds = frozenset((kinds,) if isinstance(kinds, str) else kinds)
    first_seq = store.next_seq()
    n_players_before = len(table)
    previous: dict[str, Rating] = {}
    records: list[RatingRecord] = []
    try:
        for i, match in enumerate(results):
            if match.kind not in kinds:
                continue
            for player_id in match.player_ids:
                if table._index.get(player_id, n_players_before) < n_players_before and player_id not in previous:
                    previous[player_id] = table.rating(player_id)
            for player_id, r in table.update(match).items():
                records.append(RatingRecord(first_seq + i, player_id, r.mu, r.sigma))
        return store.record_matches(results, records)
    except BaseException:
        table._truncate(n_players_before)
        for player_id, r in previous.items():
            table._set(player_id, r)
        raise


def rebuild_ratings(store: Store, params: TrueSkillParams, kinds: Iterable[str] = ("rating",)) -> RatingTable:
    """Replay the ledger's matches of `kinds` in seq order into a fresh table.

    Bit-for-bit equal to a live table that saw the same matches through `update` in ledger order.
    """
    table = RatingTable(params)
    for recorded in store.iter_matches(kinds=tuple(kinds)):
        table.update(recorded.result)
    return table


# ---------------------------------------------------------------------------------------------
# Placement of a new player against frozen ratings
# ---------------------------------------------------------------------------------------------


def placement_results(matches: Iterable[MatchResult], player_id: str) -> list[tuple[str, float]]:
    """(opponent id, outcome for `player_id`) of each rateable two-team, one-vs-one match it played."""
    results = []
    for match in matches:
        if not is_rateable(match) or len(match.seats) != 2 or match.seats[0].team == match.seats[1].team:
            continue
        ids = match.player_ids
        if player_id not in ids:
            continue
        me = ids.index(player_id)
        results.append((ids[1 - me], match.seats[me].outcome))
    return results


def fit_placement(results_vs_frozen: Sequence[tuple[str, float]],
                  frozen_ratings: Mapping[str, Rating] | RatingTable,
                  params: TrueSkillParams, max_iterations: int = 100, tolerance: float = 1e-10) -> Rating:
    """Rate a newcomer from its games against players whose ratings stay fixed.

    Expectation propagation on the newcomer's skill alone: each game is a truncation factor
    against N(mu_opp, sigma_opp^2 + beta^2); pass i replaces game i's message using the cavity
    (posterior without game i). The first pass is exactly the sequential TrueSkill update of the
    newcomer only (opponents' uncertainty counted, opponents not changed); further passes remove
    the dependence on game order, stopping when mu and sigma move less than `tolerance`.
    No skill drift (tau) is applied: the newcomer is a fixed policy.

    Args:
        results_vs_frozen: (opponent id, newcomer's outcome: 1 win, 0.5 draw, 0 loss) per game.
        frozen_ratings: the opponents' ratings (a mapping or a RatingTable).
        params: TrueSkill constants; the newcomer starts from the prior (mu, sigma).
        max_iterations: passes over the games (1 = plain sequential TrueSkill).
        tolerance: convergence threshold on the change of mu and sigma over one pass.
    """
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be >= 1, got {max_iterations}")
    opponents = []
    for opponent_id, outcome in results_vs_frozen:
        if outcome not in (0.0, 0.5, 1.0):
            raise ValueError(f"placement outcomes must be 0, 0.5 or 1, got {outcome} against {opponent_id!r}")
        if isinstance(frozen_ratings, RatingTable):
            if opponent_id not in frozen_ratings:
                raise KeyError(f"no rating for placement opponent {opponent_id!r}")
            opponents.append((frozen_ratings.rating(opponent_id), outcome))
        else:
            opponents.append((frozen_ratings[opponent_id], outcome))
    two_beta_sq = 2 * params.beta ** 2
    post_pi, post_tau = params.sigma ** -2, params.mu * params.sigma ** -2
    msg_pi = [0.0] * len(opponents)
    msg_tau = [0.0] * len(opponents)
    for _ in range(max_iterations):
        start_mu, start_sigma = post_tau / post_pi, post_pi ** -0.5
        for i, (opponent, outcome) in enumerate(opponents):
            cav_pi, cav_tau = post_pi - msg_pi[i], post_tau - msg_tau[i]
            cav_var, cav_mu = 1.0 / cav_pi, cav_tau / cav_pi
            c_sq = two_beta_sq + cav_var + opponent.sigma ** 2
            c = math.sqrt(c_sq)
            eps = params.draw_margin_1vs1 / c
            if outcome == 0.5:
                t = (cav_mu - opponent.mu) / c
                v, w, sign = _v_draw(t, eps), _w_draw(t, eps), 1.0
            else:
                sign = 1.0 if outcome == 1.0 else -1.0
                t = sign * (cav_mu - opponent.mu) / c
                v, w = _v_win(t, eps), _w_win(t, eps)
            new_mu = cav_mu + sign * cav_var / c * v
            new_pi = 1.0 / (cav_var * (1 - cav_var / c_sq * w))
            new_tau = new_mu * new_pi
            msg_pi[i], msg_tau[i] = new_pi - cav_pi, new_tau - cav_tau
            post_pi, post_tau = new_pi, new_tau
        mu, sigma = post_tau / post_pi, post_pi ** -0.5
        if abs(mu - start_mu) < tolerance and abs(sigma - start_sigma) < tolerance:
            break
    return Rating(post_tau / post_pi, post_pi ** -0.5)
