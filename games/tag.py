"""`simple_tag`: MPE predator-prey (mpe2 `simple_tag_v3`) as a team-vs-team game with a winner.

Three adversaries (team 0, seats 0-2) chase one agent (team 1, seat 3) among obstacles
(Lowe et al. 2017). MPE's rewards are shaped: every adversary gets +10 per collision with the
prey, the prey gets -10 per collision and a penalty for straying beyond the arena (mpe2's
`bound`: 0 inside 0.9 radii, up to 10 per coordinate per step far out). On those returns alone
the prey could never finish above the predators, so the game adds one terminal reward: at the
end of an episode without a tag, every predator gets -10 and the prey +10.

The winner, as for every game, is the team with the higher mean return
(`league.ledger.outcomes_from_returns`), which here means:

* the predators win if they tag the prey at least once (they have >= +10, the prey <= -10);
* otherwise the prey wins if its boundary penalties stay under 20 in total — it survived
  inside the arena — and loses (or draws at exactly 20) if it fled too far.

The step rewards still sum to the returns, so `check_game` holds. The step limit (`max_cycles`)
ends the game by these rules, so it is a terminal step, not a truncation: learners do not
bootstrap past it.

Those rules make the step count and whether a tag has happened part of the game's state: what is
left to win depends on both (the end pays -10 per predator only if nobody has tagged yet), and
neither is in mpe2's observations or its `state()`. So the global state, which a centralised
critic reads (MAPPO, Yu et al. 2022), is mpe2's state followed by the fraction of the steps left
and a 0/1 flag for "tagged already"; without them the state is not Markov and a value function
on it cannot tell the last step from the first (Pardo et al. 2018, "Time Limits in Reinforcement
Learning", arXiv 1712.00378). The seats' observations stay mpe2's.
"""

from __future__ import annotations

import numpy as np

from games.core import GameSpec, is_over
from games.registry import GameEntry

SURVIVAL_BONUS = 10.0
"""Reward to the prey (and minus it to each predator) for an episode without a tag."""

CLOCK_FIELDS = ("steps_left_fraction", "tagged")
"""What the global state adds after mpe2's state (see the module docstring)."""


class SimpleTag:
    """The PettingZoo Parallel adapter of `mpe2.simple_tag_v3` plus the winner rule above."""

    def __init__(self, max_cycles: int = 25, num_obstacles: int = 2):
        from games.pz import make_pettingzoo_game

        self._game = make_pettingzoo_game(
            f"mpe2.simple_tag_v3(num_good=1,num_adversaries=3,num_obstacles={num_obstacles},max_cycles={max_cycles})")
        inner = self._game.spec
        self.spec = GameSpec(
            id=f"simple_tag(max_cycles={max_cycles},num_obstacles={num_obstacles})"
            if (max_cycles, num_obstacles) != (25, 2) else "simple_tag",
            num_players=4, num_actions=inner.num_actions, observation_shape=inner.observation_shape,
            teams=(0, 0, 0, 1), zero_sum=False, utility_sum=None, min_utility=-np.inf, max_utility=np.inf,
            max_length=inner.max_length, simultaneous=True, has_chance=True, perfect_information=True,
            state_shape=(inner.state_shape[0] + len(CLOCK_FIELDS),))
        self._tags = 0
        self._steps = 0

    def reset(self, seed: int) -> None:
        self._game.reset(seed)
        self._tags = 0
        self._steps = 0
        self._returns = np.zeros(4)

    def to_move(self) -> tuple[int, ...]:
        return self._game.to_move()

    def observation(self, seat: int) -> np.ndarray:
        return self._game.observation(seat)

    def legal_mask(self, seat: int) -> np.ndarray:
        return self._game.legal_mask(seat)

    def global_state(self) -> np.ndarray:
        clock = np.array([1.0 - self._steps / self.spec.max_length, float(self._tags > 0)], dtype=np.float32)
        return np.concatenate([self._game.global_state(), clock])

    def step(self, actions: dict[int, int]) -> np.ndarray:
        rewards = np.asarray(self._game.step(actions), dtype=np.float64).copy()
        # Every predator gets +10 per predator-prey collision this step and nothing else
        # (mpe2 simple_tag `adversary_reward`, unshaped), so its reward counts the tags.
        self._tags += int(round(rewards[0] / 10.0))
        self._steps += 1
        if is_over(self._game) and self._tags == 0:
            rewards[:3] -= SURVIVAL_BONUS
            rewards[3] += SURVIVAL_BONUS
        self._returns += rewards
        return rewards.astype(np.float32)

    def is_terminal(self) -> bool:
        # MPE stops the episode at max_cycles by truncation; here that step ends the game by its
        # rules (the winner is decided and the survival bonus paid there), so it is terminal. A
        # learner must not bootstrap past it: with the bonus paid on the last step, a critic that
        # bootstraps from its own estimate of the state before the end chases V = r + gamma V.
        return is_over(self._game)

    def is_truncated(self) -> bool:
        return False

    def returns(self) -> np.ndarray:
        return self._returns.astype(np.float32)

    def history(self) -> tuple[int, ...]:
        return self._game.history()

    def render(self) -> str:
        return f"tags so far: {self._tags}\n{self._game.render()}"


SIMPLE_TAG_ENTRY = GameEntry(
    "simple_tag", SimpleTag, None,
    "MPE predator-prey, 3 predators (team 0) vs 1 prey (team 1); predators win by one tag",
    layout="observation: float32 [16] (mpe2 simple_tag_v3): own velocity (2), own position (2), the obstacles' "
           "positions relative to it (2 each), the other agents' relative positions (2 each, seat order), then "
           "for a predator the prey's velocity (2); the prey's 14 entries are zero-padded to 16.\n"
           "actions: 0 stay, 1 left, 2 right, 3 down, 4 up (all seats move at once).\n"
           "seats 0-2 are the predators (team 0), seat 3 the prey (team 1).\n"
           "global state: float32 [64]: mpe2's state (the four observations side by side, the prey's 14 unpadded), "
           "then the fraction of the steps left (1 at the start, 0 at the end) and 1 if a predator has tagged the "
           "prey already, else 0.")
