"""PSRO's meta-game, computed exactly, for leagues on small two-player zero-sum OpenSpiel games.

Policy-Space Response Oracles (Lanctot et al. 2017, "A unified game-theoretic approach to
multiagent reinforcement learning", Algorithm 1) grows a population of policies: each new policy
is a best response to the Nash mixture of the meta-game, the normal-form game whose pure strategies
are the population's members. A Ludus league does this when a role has `meta_nash` weight: the
manager draws that role's training opponents from `meta_strategy`, and each snapshot of
the learner is one PSRO iteration's (approximate, PPO-trained) best response.

The meta-game here is exact, not empirical: entry (i, j) is the expected return of member i
against member j computed by walking the whole game tree with OpenSpiel's
`expected_game_score.policy_value`, over each member's explicit action probabilities
(`ludus.agents.solvers.exploitability.SpielPolicyAdapter`: net snapshots and the random bot). The game's two
seats differ (Kuhn poker's first player is at a disadvantage of 1/18 at equilibrium), so each entry
is symmetrised over seat orders,

    A[i, j] = 1/2 (u_0(i, j) + u_1(j, i)) - utility_sum / 2,

where u_p(a, b) is seat p's expected return with a on seat 0 and b on seat 1. A is antisymmetric,
and its maximin mixture (`ludus.agents.solvers.exploitability.nash_mixture`, the zero-sum LP) is a symmetric Nash
equilibrium of the meta-game.

That exact Nash mixture is one meta-solver; projected replicator dynamics (PRD, the paper's other
solver, `ludus.agents.solvers.exploitability.projected_replicator_dynamics`) is the other (a role's
`meta_solver`). The chosen solver's mixture is the meta-strategy: training opponents are drawn from
it and it is the output policy.

The league's output is that mixture played as one policy: "draw member k with probability x_k,
then play it for the whole game", aggregated into a single behaviour policy by reach-weighting
(`ludus.agents.solvers.exploitability.aggregate_mixture`). Its exploitability is what PSRO reports; evaluation
attaches that measurement to a running league (evaluation/league_hooks.py).

Entries are cached per pair of members' identities (snapshot content hash, or bot name), in memory
per run directory and in ``<run>/psro_cache.json`` (written atomically): every iteration computes
only the rows of new members. The entries are deterministic functions of the snapshots' bytes, and
JSON round-trips floats exactly, so a cache changes only the time taken, never a number (resume
stays exact).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np

from ludus.games import registry
from ludus.games.core import GameSpec
from ludus.league.records.population import Member, with_absolute_paths
from ludus.errors import UserError

CACHE_FILE = "psro_cache.json"
CACHE_FORMAT_VERSION = 1
_MAX_RUNS_IN_MEMORY = 8
"""Runs whose caches stay in memory (a process rarely drives more than one league at a time)."""


class PSROError(UserError):
    """A game or population the exact meta-game cannot be computed for."""


@dataclass(frozen=True)
class MetaGame:
    """The exact, seat-symmetrised meta-game of a list of members and its Nash mixture."""

    players: tuple[str, ...]
    """Player ids of the members, in the order given."""
    payoff: np.ndarray
    """[N, N] antisymmetric: expected return of row against column, averaged over both seat orders."""
    nash: np.ndarray
    """[N] maximin mixture of `payoff` (a symmetric Nash equilibrium of the meta-game)."""
    value: float
    """The mixture's worst-case payoff against any member (0 up to LP tolerance: A is antisymmetric)."""
    strategy: np.ndarray
    """[N] the meta-solver's mixture: the meta-strategy that training opponents are drawn from and
    that the output policy plays (equal to `nash` for the 'nash' solver)."""


@dataclass(frozen=True)
class MetaSolver:
    """How PSRO turns the meta-game into its meta-strategy (a role's `meta_solver` keys)."""

    kind: Literal["nash", "prd"] = "nash"
    """'nash': the exact maximin mixture (LP); 'prd': projected replicator dynamics."""
    exploration: float = 0.05
    """PRD's gamma: the probability floor, spread over the members."""

    @classmethod
    def of(cls, role) -> "MetaSolver":
        """The solver a `ludus.league.config.RoleConfig` asks for."""
        return cls(role.meta_solver, role.prd_exploration)


def member_key(member: Member) -> str:
    """The identity of a frozen member's policy: its snapshot content hash or its bot name.

    Two members with the same key play the same function, so their payoff entries are shared."""
    if member.kind == "snapshot" and member.snapshot_id:
        return member.snapshot_id
    if member.kind == "anchor" and member.bot:
        return f"bot:{member.bot}"
    raise PSROError(f"player {member.player_id!r} is not a frozen member (a snapshot or a bot anchor); the "
                    f"meta-game has only fixed policies as strategies")


class PayoffCache:
    """Seat-ordered expected returns of pairs of policies of one game, plus their tabular forms.

    ``returns[(a, b)] = (u_0, u_1)`` with policy `a` on seat 0 and `b` on seat 1."""

    def __init__(self, game_id: str, path: Path | None):
        self.game_id = game_id
        self.path = path
        self.returns: dict[tuple[str, str], tuple[float, float]] = {}
        self.tables: dict[str, object] = {}
        """Tabular policies (open_spiel TabularPolicy) by member key, built on first use."""
        self.strategies: dict[tuple, np.ndarray] = {}
        """PRD mixtures by (member keys, solver): the integration takes ~0.1 s, the LP ~1 ms."""
        self.computed = 0
        """policy_value evaluations done by this process (cache misses)."""
        if path is not None and path.is_file():
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
            if data.get("format_version") != CACHE_FORMAT_VERSION or data.get("game") != self.game_id:
                return  # another format or game: recompute (the numbers are deterministic)
            for entry in data["entries"]:
                a, b, u0, u1 = entry
                self.returns[(str(a), str(b))] = (float(u0), float(u1))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            # A damaged cache only costs time: every entry can be recomputed exactly.
            self.returns.clear()

    def save(self) -> None:
        if self.path is None:
            return
        from ludus.files import atomic_write_json

        entries = [[a, b, u0, u1] for (a, b), (u0, u1) in sorted(self.returns.items())]
        atomic_write_json(self.path, {"format_version": CACHE_FORMAT_VERSION, "game": self.game_id,
                                      "entries": entries})


_CACHES: OrderedDict[tuple[str, str], PayoffCache] = OrderedDict()


def payoff_cache(game_id: str, run_dir: str | os.PathLike | None) -> PayoffCache:
    """The cache of a run directory (loaded from its psro_cache.json once), or a fresh in-memory
    cache when `run_dir` is None."""
    if run_dir is None:
        return PayoffCache(game_id, None)
    root = Path(run_dir).resolve()
    key = (str(root), game_id)
    cache = _CACHES.get(key)
    if cache is None:
        cache = PayoffCache(game_id, root / CACHE_FILE)
        _CACHES[key] = cache
        if len(_CACHES) > _MAX_RUNS_IN_MEMORY:
            _CACHES.popitem(last=False)
    else:
        _CACHES.move_to_end(key)
    return cache


def clear_payoff_caches() -> None:
    """Forget every in-memory cache (the next use of a run reads its psro_cache.json again)."""
    _CACHES.clear()


def _check_game(spec: GameSpec) -> None:
    if not registry.reaches_game_tree(spec.id) or spec.num_players != 2 or not spec.zero_sum:
        raise PSROError(f"the exact meta-game (meta_nash) needs a two-player zero-sum OpenSpiel game such as "
                        f"spiel:kuhn_poker, not {spec.id!r}; set the role's meta_nash to 0 for this game")


def member_table(spec: GameSpec, member: Member, cache: PayoffCache):
    """A frozen member's policy as an OpenSpiel TabularPolicy (built once per key and cache)."""
    key = member_key(member)
    table = cache.tables.get(key)
    if table is None:
        from ludus.agents.solvers.exploitability import as_tabular
        from ludus.league.records.population import load_member_policy

        table = as_tabular(spec.id, load_member_policy(member, spec))
        cache.tables[key] = table
    return table


def _seat_returns(spec: GameSpec, first, second) -> tuple[float, float]:
    """Exact expected returns of both seats with `first` on seat 0 and `second` on seat 1."""
    from open_spiel.python.algorithms.expected_game_score import policy_value

    from ludus.agents.solvers.exploitability import spiel_game_of

    game = spiel_game_of(spec.id)
    values = policy_value(game.new_initial_state(), [first, second])
    return float(values[0]), float(values[1])


def meta_game(spec: GameSpec, members: Sequence[Member], run_dir: str | os.PathLike | None,
              save_cache: bool = True, solver: MetaSolver = MetaSolver()) -> MetaGame:
    """The exact symmetrised payoff matrix of `members`, its Nash mixture and the solver's mixture.

    Args:
        spec: a two-player zero-sum ``spiel:`` game.
        members: frozen members (snapshots, bot anchors); snapshot paths may be relative to `run_dir`.
        run_dir: the run directory whose cache to use (None: a throwaway cache).
        save_cache: write new entries to ``<run_dir>/psro_cache.json``; readers of a run that
            another process writes pass False (only the manager writes to a run directory).
        solver: the meta-solver whose mixture is `MetaGame.strategy`.
    """
    from ludus.agents.solvers.exploitability import nash_mixture, projected_replicator_dynamics

    _check_game(spec)
    if not members:
        raise PSROError("the meta-game needs at least one frozen member")
    cache = payoff_cache(spec.id, run_dir)
    resolved = with_absolute_paths(members, run_dir) if run_dir is not None else list(members)
    keys = [member_key(m) for m in resolved]
    by_key = dict(zip(keys, resolved))
    computed_before = cache.computed
    unique = list(by_key)
    for a in unique:
        for b in unique:
            if a == b or (a, b) in cache.returns:
                continue
            cache.returns[(a, b)] = _seat_returns(spec, member_table(spec, by_key[a], cache),
                                                  member_table(spec, by_key[b], cache))
            cache.computed += 1
    if save_cache and cache.computed > computed_before:
        cache.save()
    offset = (spec.utility_sum or 0.0) / 2.0
    n = len(keys)
    payoff = np.zeros((n, n))
    for i, a in enumerate(keys):
        for j, b in enumerate(keys):
            if a != b:  # a policy against itself scores the game's value sum over seats: exactly 0 here
                payoff[i, j] = 0.5 * (cache.returns[(a, b)][0] + cache.returns[(b, a)][1]) - offset
    nash, value = nash_mixture(payoff)
    strategy = nash
    if solver.kind == "prd":
        memo = (tuple(keys), solver)
        strategy = cache.strategies.get(memo)
        if strategy is None:
            strategy = cache.strategies[memo] = projected_replicator_dynamics(payoff, solver.exploration)
    return MetaGame(tuple(m.player_id for m in members), payoff, nash, value, strategy)


def meta_strategy(spec: GameSpec, members: list[Member], run_dir: Path, solver: MetaSolver = MetaSolver()) -> np.ndarray:
    """PSRO's meta-strategy: the solver's probabilities over `members`, in order (see `meta_game`)."""
    return meta_game(spec, members, run_dir, solver=solver).strategy


def league_output_policy(spec: GameSpec, members: Sequence[Member], run_dir: str | os.PathLike | None,
                         save_cache: bool = True, solver: MetaSolver = MetaSolver()):
    """PSRO's output policy: the meta-strategy over `members` as one OpenSpiel TabularPolicy."""
    game = meta_game(spec, members, run_dir, save_cache, solver)
    return aggregate_members(spec, [(m, float(w)) for m, w in zip(members, game.strategy) if w > 0], run_dir)


def aggregate_members(spec: GameSpec, weighted: Sequence[tuple[Member, float]], run_dir: str | os.PathLike | None):
    """A mixture of frozen members (paths may be relative to `run_dir`) aggregated reach-weighted
    into one OpenSpiel TabularPolicy (`ludus.agents.solvers.exploitability.aggregate_mixture`)."""
    from ludus.agents.solvers.exploitability import aggregate_mixture

    cache = payoff_cache(spec.id, run_dir)
    members = [member for member, _ in weighted]
    resolved = with_absolute_paths(members, run_dir) if run_dir is not None else members
    tables = [member_table(spec, member, cache) for member in resolved]
    return aggregate_mixture(spec.id, tables, [weight for _, weight in weighted])
