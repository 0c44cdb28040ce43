"""Any turn-based Ludus game as a PettingZoo AEC environment.

``to_aec_env("connect_four")`` gives an `AECEnv` with agents ``player_0``, ``player_1``, ... (seat
order), a `Discrete(num_actions)` action space and, like PettingZoo's classic board games, a
``Dict(observation=Box, action_mask=Box(int8))`` observation space. Rewards arrive on the step
that pays them; when the game is over every agent is terminated (or truncated, on a step limit)
and steps ``None`` once to leave, in seat order after the last mover (PettingZoo's dead-step
protocol). The export passes ``pettingzoo.test.api_test`` and ``seed_test``.
"""

from __future__ import annotations

import gymnasium
import numpy as np
from pettingzoo import AECEnv

from ludus.games import registry
from ludus.games.core import Game, GameError, is_over


def _observation_box(game: Game) -> gymnasium.spaces.Box:
    spec = game.spec
    dtype = np.dtype(spec.observation_dtype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        default_low, default_high = info.min, info.max
    else:
        default_low, default_high = -np.inf, np.inf
    low = default_low if spec.observation_low is None else spec.observation_low
    high = default_high if spec.observation_high is None else spec.observation_high
    return gymnasium.spaces.Box(low=low, high=high, shape=spec.observation_shape, dtype=dtype)


class GameAECEnv(AECEnv):
    """A PettingZoo AEC view of one `Game` (turn-based: one seat acts per step)."""

    metadata = {"render_modes": ["human", "ansi"], "is_parallelizable": False}

    def __init__(self, game: Game, render_mode: str | None = None):
        super().__init__()
        if game.spec.simultaneous:
            raise GameError(f"{game.spec.id} is a simultaneous-move game: AEC export needs one seat per step "
                            f"(use a parallel env instead)")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise GameError(f"render_mode {render_mode!r} is not one of {self.metadata['render_modes']}")
        self.game = game
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "name": f"ludus_{game.spec.id}"}
        spec = game.spec
        self.possible_agents = [f"player_{seat}" for seat in range(spec.num_players)]
        self._seat = {agent: seat for seat, agent in enumerate(self.possible_agents)}
        mask_box = gymnasium.spaces.Box(low=0, high=1, shape=(spec.num_actions,), dtype=np.int8)
        self.observation_spaces = {
            agent: gymnasium.spaces.Dict({"observation": _observation_box(game), "action_mask": mask_box})
            for agent in self.possible_agents
        }
        self.action_spaces = {agent: gymnasium.spaces.Discrete(spec.num_actions) for agent in self.possible_agents}
        # Seeds for reset(seed=None) come from fresh OS entropy, never from global RNG state.
        self._unseeded = np.random.default_rng()

    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is None:
            seed = int(self._unseeded.integers(2**63))
        self.game.reset(seed)
        self.agents = list(self.possible_agents)
        self.rewards = {agent: 0.0 for agent in self.agents}
        self._cumulative_rewards = {agent: 0.0 for agent in self.agents}
        self.terminations = {agent: False for agent in self.agents}
        self.truncations = {agent: False for agent in self.agents}
        self.infos = {agent: {} for agent in self.agents}
        self._select_mover()

    def _select_mover(self) -> None:
        movers = self.game.to_move()
        if not movers:
            raise GameError(f"{self.game.spec.id} is over right after reset: nothing to export")
        if len(movers) != 1:
            raise GameError(f"{self.game.spec.id} has {len(movers)} seats acting at once: AEC export needs one")
        self.agent_selection = self.possible_agents[movers[0]]

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        seat = self._seat[agent]
        return {
            "observation": self.game.observation(seat),
            "action_mask": self.game.legal_mask(seat).astype(np.int8),
        }

    def step(self, action: int | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        seat = self._seat[agent]
        self._cumulative_rewards[agent] = 0.0
        rewards = self.game.step({seat: int(action)})
        self.rewards = {a: float(rewards[self._seat[a]]) for a in self.agents}
        if is_over(self.game):
            terminal = self.game.is_terminal()
            self.terminations = {a: terminal for a in self.agents}
            self.truncations = {a: not terminal for a in self.agents}
            # dead agents then step None in seat order, starting after the last mover
            order = self.possible_agents
            self.agent_selection = order[(seat + 1) % len(order)]
        else:
            self._select_mover()
        self._accumulate_rewards()
        if self.render_mode == "human":
            print(self.render())

    def render(self) -> str:
        """The board as text (what `Game.render` gives)."""
        return self.game.render()

    def close(self) -> None:
        pass


def to_aec_env(game_id: str, render_mode: str | None = None) -> GameAECEnv:
    """The game with this registry id as a PettingZoo AEC env (e.g. ``to_aec_env("connect_four")``)."""
    return GameAECEnv(registry.make(game_id), render_mode=render_mode)
