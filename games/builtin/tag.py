"""`simple_tag`: MPE predator-prey (mpe2 `simple_tag_v3`) as a team-vs-team game with a winner.

Three adversaries (team 0, seats 0-2) chase one agent (team 1, seat 3) among obstacles
(Lowe et al. 2017). MPE's rewards are shaped: every adversary gets +10 per collision with the
prey, the prey gets -10 per collision and a penalty for straying beyond the arena (mpe2's
`bound`: 0 inside 0.9 radii, up to 10 per coordinate per step far out). On those returns alone
the prey could never finish above the predators, so the game adds one terminal reward: at the
end of an episode without a tag, every predator gets -10 and the prey +10.

The winner, as for every game, is the team with the higher mean return
(`ludus.league.records.ledger.outcomes_from_returns`), which here means:

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

The world is mpe2's, batched: `TagWorlds` steps B worlds at once in numpy, operation for operation
as mpe2's `World.step` and `simple_tag` scenario do for one (the same reset draws from the same
seeded generator, the same contact forces added in the same order), so its positions, rewards and
observations are mpe2's bit for bit (tests/test_team_league.py compares them). Stepping mpe2's
objects one game at a time took ~80% of a simple_tag league's time; the single game (`SimpleTag`)
is the same code with B = 1, and the vector game (`SimpleTagVector`) runs a runner's games in one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ludus.games.core import GameError, GameSpec, SeedSource, TimeStep
from ludus.games.registry import GameEntry

SURVIVAL_BONUS = 10.0
"""Reward to the prey (and minus it to each predator) for an episode without a tag."""

CLOCK_FIELDS = ("steps_left_fraction", "tagged")
"""What the global state adds after mpe2's state (see the module docstring)."""

NUM_PREDATORS = 3
NUM_AGENTS = NUM_PREDATORS + 1
PREY = NUM_PREDATORS
"""Seat (and agent index) of the prey."""

# mpe2's constants (`_mpe_utils/core.py` World, `simple_tag/simple_tag.py` make_world).
DT = 0.1
DAMPING = 0.25
CONTACT_FORCE = 1e2
CONTACT_MARGIN = 1e-3
SIZES = (0.075, 0.075, 0.075, 0.05)
"""Radii of the predators and the prey; obstacles have OBSTACLE_SIZE."""
OBSTACLE_SIZE = 0.2
ACCEL = (3.0, 3.0, 3.0, 4.0)
MAX_SPEED = (1.0, 1.0, 1.0, 1.3)
NUM_ACTIONS = 5
"""0 stay, 1 left, 2 right, 3 down, 4 up."""


class TagWorlds:
    """B simple_tag worlds: positions, velocities and mpe2's physics, batched over the first axis.

    Entities are in mpe2's order: the predators, the prey, then the obstacles (which do not move).
    Every float is float64 as in mpe2, and each operation is the one mpe2 performs on one world, in
    its order: a sum of forces is added up entity by entity exactly as its pair loop does.
    """

    def __init__(self, num_games: int, num_obstacles: int):
        self.num_games = num_games
        self.num_obstacles = num_obstacles
        entities = NUM_AGENTS + num_obstacles
        self.pos = np.zeros((num_games, entities, 2))
        self.vel = np.zeros((num_games, NUM_AGENTS, 2))
        sizes = list(SIZES) + [OBSTACLE_SIZE] * num_obstacles
        # mpe2 computes entity_a.size + entity_b.size per pair; the sum is symmetric in floats.
        self._dist_min = np.array([[a + b for b in sizes] for a in sizes])
        self._accel = np.array(ACCEL)[None, :]
        self._max_speed = np.array(MAX_SPEED)[None, :]

    def reset(self, slots: Sequence[int], seeds: Sequence[int]) -> None:
        """New worlds in `slots`, each drawn as mpe2's `reset(seed=...)` draws it (gymnasium's
        `np_random(seed)`: PCG64 on SeedSequence(seed); agents in [-1, 1]^2, obstacles in [-0.9, 0.9]^2)."""
        for slot, seed in zip(slots, seeds):
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed))))
            for i in range(NUM_AGENTS):
                self.pos[slot, i] = rng.uniform(-1, +1, 2)
            for k in range(self.num_obstacles):
                self.pos[slot, NUM_AGENTS + k] = rng.uniform(-0.9, +0.9, 2)
            self.vel[slot] = 0.0

    def step(self, actions: np.ndarray) -> np.ndarray:
        """Move every world by one step ([B, 4] actions); returns mpe2's rewards [B, 4] float64."""
        # The action force (mpe2 `_set_action`: a unit push scaled by the agent's accel).
        u = np.zeros((self.num_games, NUM_AGENTS, 2))
        u[..., 0] = np.where(actions == 1, -1.0, np.where(actions == 2, 1.0, 0.0))
        u[..., 1] = np.where(actions == 3, -1.0, np.where(actions == 4, 1.0, 0.0))
        force = u * self._accel[..., None] + 0.0  # + the motor noise, 0.0 in simple_tag
        # Contact forces (mpe2 `get_collision_force`), all pairs, soft penetration. Agent i's sum
        # takes the other entities j in increasing order, as mpe2's loop over pairs a < b adds
        # them (its -F(j, i) equals F(i, j) exactly: the delta's sign flips without rounding).
        for i in range(NUM_AGENTS):
            for j in range(self.pos.shape[1]):
                if j == i:
                    continue
                delta = self.pos[:, i] - self.pos[:, j]
                dist = np.sqrt(np.square(delta[:, 0]) + np.square(delta[:, 1]))
                penetration = np.logaddexp(0, -(dist - self._dist_min[i, j]) / CONTACT_MARGIN) * CONTACT_MARGIN
                force[:, i] = (CONTACT_FORCE * delta / dist[:, None] * penetration[:, None]) + force[:, i]
        # Integration (mpe2 `integrate_state`; mass 1), then the speed limit.
        agents = self.pos[:, :NUM_AGENTS]
        agents += self.vel * DT
        self.vel = self.vel * (1 - DAMPING)
        self.vel += (force / 1.0) * DT
        speed = np.sqrt(np.square(self.vel[..., 0]) + np.square(self.vel[..., 1]))
        fast = np.nonzero(speed > self._max_speed)
        if fast[0].size:
            limit = np.broadcast_to(self._max_speed, speed.shape)
            self.vel[fast] = self.vel[fast] / speed[fast][:, None] * limit[fast][:, None]
        return self._rewards()

    def _rewards(self) -> np.ndarray:
        """mpe2's `adversary_reward` and `agent_reward` (unshaped)."""
        delta = self.pos[:, :NUM_PREDATORS] - self.pos[:, PREY:PREY + 1]
        dist = np.sqrt(np.square(delta[..., 0]) + np.square(delta[..., 1]))
        tags = (dist < self._dist_min[:NUM_PREDATORS, PREY]).sum(axis=1)
        rewards = np.empty((self.num_games, NUM_AGENTS))
        rewards[:, :NUM_PREDATORS] = (10 * tags)[:, None]  # every predator: +10 per tag by any predator
        prey = -10.0 * tags
        for p in range(2):  # leaving the arena: mpe2's `bound` per coordinate
            x = np.abs(self.pos[:, PREY, p])
            prey = prey - np.where(x < 0.9, 0.0, np.where(x < 1.0, (x - 0.9) * 10, np.minimum(np.exp(2 * x - 2), 10)))
        rewards[:, PREY] = prey
        return rewards

    def observations(self) -> list[np.ndarray]:
        """mpe2's observation of each agent, float32 [B, 16] for a predator (with two obstacles) and
        [B, 14] for the prey: own velocity, own position, the obstacles' and the other agents'
        positions relative to it, then (predators only) the prey's velocity."""
        out = []
        for i in range(NUM_AGENTS):
            own = self.pos[:, i:i + 1]
            parts = [self.vel[:, i], self.pos[:, i],
                     (self.pos[:, NUM_AGENTS:] - own).reshape(self.num_games, -1),
                     (self.pos[:, [j for j in range(NUM_AGENTS) if j != i]] - own).reshape(self.num_games, -1)]
            if i != PREY:
                parts.append(self.vel[:, PREY])
            out.append(np.concatenate(parts, axis=1).astype(np.float32))
        return out


class _TagGames:
    """B games of simple_tag: `TagWorlds` plus the clock, the tags, the returns and the histories."""

    def __init__(self, num_games: int, max_cycles: int, num_obstacles: int):
        if max_cycles < 1 or num_obstacles < 0:
            raise GameError(f"simple_tag needs max_cycles >= 1 and num_obstacles >= 0, "
                            f"got {max_cycles} and {num_obstacles}")
        self.worlds = TagWorlds(num_games, num_obstacles)
        obs_size = 4 + 2 * num_obstacles + 2 * (NUM_AGENTS - 1) + 2
        self.spec = GameSpec(
            id=f"simple_tag(max_cycles={max_cycles},num_obstacles={num_obstacles})"
            if (max_cycles, num_obstacles) != (25, 2) else "simple_tag",
            num_players=NUM_AGENTS, num_actions=NUM_ACTIONS, observation_shape=(obs_size,),
            teams=(0,) * NUM_PREDATORS + (1,), zero_sum=False, utility_sum=None, min_utility=-np.inf,
            max_utility=np.inf, max_length=max_cycles, simultaneous=True, has_chance=True,
            perfect_information=True, state_shape=(NUM_AGENTS * obs_size - 2 + len(CLOCK_FIELDS),))
        self.num_games = num_games
        self.steps = np.zeros(num_games, dtype=np.int64)
        self.tags = np.zeros(num_games, dtype=np.int64)
        self.returns = np.zeros((num_games, NUM_AGENTS))
        self.histories: list[list[int]] = [[] for _ in range(num_games)]

    def reset(self, slots: Sequence[int], seeds: Sequence[int]) -> None:
        self.worlds.reset(slots, seeds)
        for slot in slots:
            self.steps[slot] = 0
            self.tags[slot] = 0
            self.returns[slot] = 0.0
            self.histories[slot] = []

    def check_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions)
        if actions.shape != (self.num_games, NUM_AGENTS) or not np.issubdtype(actions.dtype, np.integer):
            raise GameError(f"simple_tag needs integer actions of shape ({self.num_games}, {NUM_AGENTS}), "
                            f"got {actions.dtype} {actions.shape}")
        if actions.min() < 0 or actions.max() >= NUM_ACTIONS:
            raise GameError(f"simple_tag actions must be in 0..{NUM_ACTIONS - 1}, got {actions.min()}..{actions.max()}")
        if (self.steps >= self.spec.max_length).any():
            raise GameError("simple_tag: a game that is over cannot step; reset it")
        return actions

    def step(self, actions: np.ndarray) -> np.ndarray:
        """One step of every game; returns the rewards [B, 4] float64 with the survival bonus paid
        at the last step of a game without a tag."""
        # Step rewards are float32, as every game's; the returns sum them in float64.
        rewards = self.worlds.step(actions).astype(np.float32).astype(np.float64)
        # Every predator's reward is +10 per predator-prey collision this step, so it counts tags.
        self.tags += np.rint(rewards[:, 0] / 10.0).astype(np.int64)
        self.steps += 1
        survived = (self.steps >= self.spec.max_length) & (self.tags == 0)
        rewards[survived, :NUM_PREDATORS] -= SURVIVAL_BONUS
        rewards[survived, PREY] += SURVIVAL_BONUS
        self.returns += rewards
        for history, row in zip(self.histories, actions.tolist()):
            history.extend(row)
        return rewards

    def over(self) -> np.ndarray:
        return self.steps >= self.spec.max_length

    def observations(self) -> np.ndarray:
        """[B, 4, obs_size] float32; the prey's two missing entries (no prey velocity) are zero."""
        obs = np.zeros((self.num_games, NUM_AGENTS, self.spec.observation_shape[0]), dtype=np.float32)
        for i, o in enumerate(self.worlds.observations()):
            obs[:, i, :o.shape[1]] = o
        return obs

    def global_states(self) -> np.ndarray:
        """mpe2's `state()` (the four observations side by side, unpadded), then the clock."""
        clock = np.stack([1.0 - self.steps / self.spec.max_length, (self.tags > 0).astype(np.float64)], axis=1)
        return np.concatenate(self.worlds.observations() + [clock.astype(np.float32)], axis=1)

    def render(self, slot: int) -> str:
        names = [f"predator {i}" for i in range(NUM_PREDATORS)] + ["prey"]
        pos, vel = self.worlds.pos[slot], self.worlds.vel[slot]
        lines = [f"step {self.steps[slot]}/{self.spec.max_length}, tags so far: {self.tags[slot]}"]
        lines += [f"{name}: position ({pos[i, 0]:+.2f}, {pos[i, 1]:+.2f}) velocity ({vel[i, 0]:+.2f}, {vel[i, 1]:+.2f})"
                  for i, name in enumerate(names)]
        lines += [f"obstacle {k}: position ({p[0]:+.2f}, {p[1]:+.2f})" for k, p in enumerate(pos[NUM_AGENTS:])]
        return "\n".join(lines)


class SimpleTag:
    """One game of simple_tag (the `Game` protocol) on `TagWorlds` with B = 1."""

    def __init__(self, max_cycles: int = 25, num_obstacles: int = 2):
        self._games = _TagGames(1, max_cycles, num_obstacles)
        self.spec = self._games.spec
        self._games.steps[0] = max_cycles  # over until reset

    def reset(self, seed: int) -> None:
        self._games.reset([0], [seed])

    def to_move(self) -> tuple[int, ...]:
        return () if self._games.over()[0] else tuple(range(NUM_AGENTS))

    def observation(self, seat: int) -> np.ndarray:
        return self._games.observations()[0, seat]

    def legal_mask(self, seat: int) -> np.ndarray:
        return np.full(NUM_ACTIONS, not self._games.over()[0], dtype=bool)

    def global_state(self) -> np.ndarray:
        return self._games.global_states()[0]

    def step(self, actions: dict[int, int]) -> np.ndarray:
        if sorted(actions) != list(range(NUM_AGENTS)):
            raise GameError(f"simple_tag: all four seats move at once, got actions for seats {sorted(actions)}")
        row = np.array([[int(actions[s]) for s in range(NUM_AGENTS)]], dtype=np.int64)
        return self._games.step(self._games.check_actions(row))[0].astype(np.float32)

    def is_terminal(self) -> bool:
        # The step limit ends the game by its rules (the winner is decided and the survival bonus
        # paid there), so it is terminal. A learner must not bootstrap past it: with the bonus
        # paid on the last step, a critic that bootstraps from its own estimate of the state
        # before the end chases V = r + gamma V.
        return bool(self._games.over()[0])

    def is_truncated(self) -> bool:
        return False

    def returns(self) -> np.ndarray:
        return self._games.returns[0].astype(np.float32)

    def history(self) -> tuple[int, ...]:
        return tuple(self._games.histories[0])

    def render(self) -> str:
        return self._games.render(0)


class SimpleTagVector:
    """B games of simple_tag stepped together (the `VectorGame` protocol), with auto-reset."""

    def __init__(self, num_games: int, seed: int = 0, max_cycles: int = 25, num_obstacles: int = 2):
        from ludus.games.builtin.native import fast_counter_seed_source

        if num_games < 1:
            raise GameError(f"num_games must be >= 1, got {num_games}")
        self._games = _TagGames(num_games, max_cycles, num_obstacles)
        self.spec = self._games.spec
        self.num_games = num_games
        self.seed_source: SeedSource = fast_counter_seed_source(seed)

    def reset(self, seeds: Sequence[int] | np.ndarray) -> TimeStep:
        seeds = np.asarray(seeds)
        if seeds.shape != (self.num_games,) or not np.issubdtype(seeds.dtype, np.integer):
            raise GameError(f"reset needs {self.num_games} integer seeds, got {seeds.dtype} of shape {seeds.shape}")
        self._games.reset(range(self.num_games), seeds.tolist())
        b = self.num_games
        return self._timestep(np.zeros((b, NUM_AGENTS), np.float32), np.zeros(b, bool),
                              np.zeros((b, NUM_AGENTS), np.float32), np.zeros(b, np.int64))

    def step(self, actions: np.ndarray) -> TimeStep:
        games = self._games
        rewards = games.step(games.check_actions(actions))
        done = games.over()
        final_returns = np.where(done[:, None], games.returns, 0.0).astype(np.float32)
        final_lengths = np.where(done, games.steps, 0)
        if done.any():
            ended = np.flatnonzero(done)
            games.reset(ended.tolist(), self.seed_source(len(ended)).tolist())
        return self._timestep(rewards.astype(np.float32), done, final_returns, final_lengths)

    def _timestep(self, rewards: np.ndarray, done: np.ndarray, final_returns: np.ndarray,
                  final_lengths: np.ndarray) -> TimeStep:
        b = self.num_games
        return TimeStep(obs=self._games.observations(), mask=np.ones((b, NUM_AGENTS, NUM_ACTIONS), bool),
                        acting=np.ones((b, NUM_AGENTS), bool), rewards=rewards, done=done,
                        truncated=np.zeros(b, bool), final_returns=final_returns, final_lengths=final_lengths)

    def history(self, b: int) -> tuple[int, ...]:
        return tuple(self._games.histories[b])

    def render(self, b: int) -> str:
        return self._games.render(b)

    def global_states(self) -> np.ndarray:
        return self._games.global_states()


SIMPLE_TAG_ENTRY = GameEntry(
    "simple_tag", SimpleTag, SimpleTagVector,
    "MPE predator-prey, 3 predators (team 0) vs 1 prey (team 1); predators win by one tag",
    layout="observation: float32 [16] (mpe2 simple_tag_v3): own velocity (2), own position (2), the obstacles' "
           "positions relative to it (2 each), the other agents' relative positions (2 each, seat order), then "
           "for a predator the prey's velocity (2); the prey's 14 entries are zero-padded to 16.\n"
           "actions: 0 stay, 1 left, 2 right, 3 down, 4 up (all seats move at once).\n"
           "seats 0-2 are the predators (team 0), seat 3 the prey (team 1).\n"
           "global state: float32 [64]: mpe2's state (the four observations side by side, the prey's 14 unpadded), "
           "then the fraction of the steps left (1 at the start, 0 at the end) and 1 if a predator has tagged the "
           "prey already, else 0.")
