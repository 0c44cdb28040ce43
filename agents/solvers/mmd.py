"""Magnetic mirror descent on a two-player game's exact tree (plain functions on policy tables).

Magnetic mirror descent (MMD; Sokota et al. 2023, "A Unified Approach to Reinforcement Learning,
Quantal Response Equilibria, and Two-Player Zero-Sum Games", arXiv 2206.05825) updates a policy
at every information state s by

    pi_{t+1}(s) ∝ [pi_t(s) * rho(s)^(alpha eta) * exp(eta Q_t(s))]^(1 / (1 + alpha eta))

with Q_t(s, a) the value of action a at s under pi_t for both players (self-play), rho a magnet
policy, alpha the magnet's weight and eta the step size. Unlike plain self-play policy gradient,
whose iterates cycle around an equilibrium of a zero-sum game, MMD's *last* iterate converges to
the quantal response equilibrium of the game regularised towards rho (Sokota et al., Theorem
3.4), whose exploitability shrinks with alpha: no average over past policies is needed, so the
policy that comes out is one policy — one set of LoRA adapters for an LM (agents/lm/text_mmd.py).

Here Q_t(s, a) is the counterfactual value of a at s divided by the counterfactual reach of s
(the opponent's and chance's share of the probability of reaching s): the expected return of a
given that s was reached, under the beliefs pi_t implies (the behavioural-form variant of the
paper's experiments), computed by OpenSpiel's tree walk. `tabular_mmd` runs the update on a
table; tests pin its exploitability on Kuhn poker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyspiel
from open_spiel.python import policy as spiel_policy
from open_spiel.python.algorithms import exploitability
from open_spiel.python.algorithms.action_value import TreeWalkCalculator


@dataclass(frozen=True)
class InformationStates:
    """The decision points of a game, one row per information state in OpenSpiel's `TabularPolicy`
    order (a table [S, A] over them is that class's `action_probability_array`), with what a Ludus
    policy reads at each."""

    keys: tuple[str, ...]
    """OpenSpiel information-state strings."""
    players: np.ndarray
    """[S] the player who acts at each."""
    observations: np.ndarray
    """[S, ...] the Ludus observation of that player at a representative state."""
    masks: np.ndarray
    """[S, A] legal actions."""

    def __len__(self) -> int:
        return len(self.keys)


def information_states(game: pyspiel.Game, observe: Callable[[pyspiel.State, int], np.ndarray]) -> InformationStates:
    """Every information state of `game`, observed with `observe(state, player)` (an observation is
    a function of the information state, so one representative state each suffices)."""
    states = spiel_policy.TabularPolicy(game).states
    players = np.array([s.current_player() for s in states], dtype=np.int64)
    masks = np.zeros((len(states), game.num_distinct_actions()), dtype=bool)
    for i, (state, player) in enumerate(zip(states, players)):
        masks[i, state.legal_actions(int(player))] = True
    observations = np.stack([observe(s, int(p)) for s, p in zip(states, players)])
    return InformationStates(tuple(s.information_state_string() for s in states), players, observations, masks)


def as_table_policy(game: pyspiel.Game, policy: np.ndarray) -> "spiel_policy.TabularPolicy":
    """A table [S, A] in `information_states` order as OpenSpiel's `TabularPolicy` (the same order)."""
    table = spiel_policy.TabularPolicy(game)
    table.action_probability_array[:] = policy
    return table


def action_values(game: pyspiel.Game, policy: np.ndarray) -> np.ndarray:
    """[S, A] expected return of each action at each information state given that it was reached,
    under the table `policy` for both players: the counterfactual action values over the
    counterfactual reach (OpenSpiel's `TreeWalkCalculator`; 0 at a state `policy` never reaches)."""
    table = as_table_policy(game, policy)
    values = TreeWalkCalculator(game)([table] * game.num_players(), table).action_values
    return np.asarray(values, dtype=np.float64)


def mmd_target(policy: np.ndarray, values: np.ndarray, magnet: np.ndarray, mask: np.ndarray, alpha: float,
               eta: float) -> np.ndarray:
    """MMD's next policy in closed form (negative entropy as the mirror map): the normalised
    [pi * rho^(alpha eta) * exp(eta Q)]^(1 / (1 + alpha eta)) over the legal actions of each row."""
    with np.errstate(divide="ignore"):
        logits = (np.log(policy) + alpha * eta * np.log(magnet) + eta * values) / (1.0 + alpha * eta)
    logits = np.where(mask, logits, -np.inf)
    target = np.exp(logits - logits.max(axis=1, keepdims=True))
    return target / target.sum(axis=1, keepdims=True)


def tabular_mmd(game: pyspiel.Game, masks: np.ndarray, magnet: np.ndarray, alpha: float, eta: float,
                iterations: int) -> np.ndarray:
    """MMD self-play on a table, starting from the magnet: the last iterate after `iterations` updates."""
    policy = magnet.copy()
    for _ in range(iterations):
        policy = mmd_target(policy, action_values(game, policy), magnet, masks, alpha, eta)
    return policy


def table_exploitability(game: pyspiel.Game, policy: np.ndarray) -> float:
    """OpenSpiel's exploitability of a table [S, A] in `information_states` order."""
    return float(exploitability.exploitability(game, as_table_policy(game, policy)))
