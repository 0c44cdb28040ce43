"""Reference policies for MPE cooperative navigation (``pz:mpe2.simple_spread_v3``).

`SpreadScriptedPolicy` is the hand-written upper reference MAPPO is measured against: every
agent solves the same optimal assignment of agents to landmarks from its own observation and
steers to its landmark. The lower reference is the uniform random policy (ludus.agents.policy.RandomPolicy).

What the scripted policy relies on (mpe2 simple_spread, full observability, discrete actions):

* observation of an agent, for N agents and N landmarks (6N floats)::

      [self_vel (2), self_pos (2), landmark_rel_pos (N x 2), other_agent_rel_pos ((N-1) x 2),
       communication ((N-1) x 2, always zero: the agents are silent)]

  relative positions are ``entity_pos - self_pos``;
* actions: 0 no-op, 1 push -x, 2 push +x, 3 push -y, 4 push +y;
* physics (mpe2 ``World.integrate_state``, dt 0.1, damping 0.25, force 5 per push, mass 1):
  ``pos += 0.1 * vel`` then ``vel = 0.75 * vel + 0.5 * push``.

Every agent sees the same geometry (relative to itself), so each computes the same assignment
(the one minimising the summed agent-landmark distance, unique almost surely) without talking.
It then picks the push whose *coasting point* lands nearest its landmark: with no further push
the agent drifts ``0.1 * vel' / (1 - 0.75) = 0.4 * vel'`` beyond its next position, so the
rest point after action u is ``pos + 0.1 * vel + 0.4 * (0.75 * vel + 0.5 * u)``. Aiming that
point, instead of the position, brakes on arrival instead of overshooting and oscillating.
"""

from __future__ import annotations

import itertools

import numpy as np

from ludus.agents.policy import ActBatch, ActOutput, zero_output

# Unit push of each discrete action (mpe2 SimpleEnv._set_action).
ACTION_DIRECTIONS = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], dtype=np.float64)
DT = 0.1
"""mpe2 World.dt."""
DAMPING = 0.25
"""mpe2 World.damping."""
PUSH_SPEED = 0.5
"""Velocity one push adds in one step: force 5 (agent accel None -> sensitivity 5) / mass 1 * dt."""
MAX_BRUTE_FORCE_AGENTS = 8
"""Largest N whose N! assignments are enumerated (40,320 per row)."""


def spread_num_agents(observation_size: int) -> int:
    """N of a simple_spread observation of 6N floats (see the module docstring)."""
    if observation_size % 6 != 0 or observation_size < 6:
        raise ValueError(f"a simple_spread observation has 6N floats (N agents); got {observation_size}: "
                         f"this policy only plays pz:mpe2.simple_spread_v3 with full observability")
    return observation_size // 6


def optimal_assignment(cost: np.ndarray) -> np.ndarray:
    """Per row, the permutation minimising sum_i cost[row, i, perm[i]], by brute force.

    cost: [R, N, N] (agent i, landmark j). Returns [R, N] int64: landmark of each agent.
    """
    _, n, _ = cost.shape
    if n > MAX_BRUTE_FORCE_AGENTS:
        raise ValueError(f"optimal_assignment enumerates N! permutations; N={n} is over "
                         f"{MAX_BRUTE_FORCE_AGENTS}: use fewer agents")
    permutations = np.array(list(itertools.permutations(range(n))), dtype=np.int64)  # [K, N]
    # totals[r, k] = sum_i cost[r, i, permutations[k, i]]
    totals = cost[:, np.arange(n)[None, :], permutations].sum(axis=2)
    return permutations[np.argmin(totals, axis=1)]


def spread_scripted_actions(obs: np.ndarray) -> np.ndarray:
    """The scripted action of each row of [R, 6N] simple_spread observations."""
    obs = np.asarray(obs, dtype=np.float64)
    rows, size = obs.shape
    n = spread_num_agents(size)
    velocity = obs[:, 0:2]
    landmarks = obs[:, 4:4 + 2 * n].reshape(rows, n, 2)  # relative to self
    others = obs[:, 4 + 2 * n:4 + 2 * n + 2 * (n - 1)].reshape(rows, n - 1, 2)
    # Agent 0 of the cost matrix is self (at the origin of the relative frame), then the others.
    agents = np.concatenate([np.zeros((rows, 1, 2)), others], axis=1)
    cost = np.linalg.norm(agents[:, :, None, :] - landmarks[:, None, :, :], axis=-1)  # [R, N agents, N lm]
    target = landmarks[np.arange(rows), optimal_assignment(cost)[:, 0]]  # [R, 2]
    # Rest point after each action (module docstring), relative to self; pick the nearest to target.
    coast = DT / DAMPING
    next_velocity = (1.0 - DAMPING) * velocity[:, None, :] + PUSH_SPEED * ACTION_DIRECTIONS[None, :, :]
    rest_point = DT * velocity[:, None, :] + coast * next_velocity  # [R, 5, 2]
    miss = np.linalg.norm(rest_point - target[:, None, :], axis=-1)
    return np.argmin(miss, axis=1).astype(np.int64)


class SpreadScriptedPolicy:
    """Optimal-assignment navigation for simple_spread (module docstring); deterministic."""

    needs_history = False

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        actions = spread_scripted_actions(np.asarray(batch.obs).reshape(len(batch), -1))
        if not np.asarray(batch.mask)[np.arange(len(actions)), actions].all():
            raise ValueError("simple_spread scripted policy: an action it chose is masked illegal; "
                             "it only plays pz:mpe2.simple_spread_v3 with discrete actions")
        return zero_output(actions)
