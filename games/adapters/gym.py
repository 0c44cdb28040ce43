"""Gymnasium environments as one-player Ludus games (id ``gym:<env id>``, e.g. ``gym:CartPole-v1``).

Any registered environment with a Discrete action space works. Observations are flattened to
float32 (Discrete observations become one-hot). The episode's return is the sum of its rewards;
a `TimeLimit` cut (or our own `max_length` cap when the env has none) is a truncation.

Also home of `space_flattener`, which the PettingZoo adapter shares.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

import gymnasium
import numpy as np
from gymnasium import spaces

from ludus.games.core import GameError, GameSpec

DEFAULT_MAX_LENGTH = 1000
"""Step cap for environments that declare none (no TimeLimit, no max_cycles)."""


def space_flattener(space: spaces.Space, what: str) -> tuple[int, Callable[[Any], np.ndarray]]:
    """(flat size, function turning a sample of `space` into a flat float32 vector).

    Box is reshaped and cast (the common, fast case); Discrete becomes one-hot; other
    composite spaces go through `gymnasium.spaces.flatten`."""
    if isinstance(space, spaces.Box):
        size = int(np.prod(space.shape))
        # np.array copies: envs may reuse their observation buffer, callers may keep ours.
        return size, lambda x: np.array(x, dtype=np.float32).reshape(size)
    if isinstance(space, spaces.Discrete):
        n, start = int(space.n), int(space.start)

        def one_hot(x: Any) -> np.ndarray:
            out = np.zeros(n, dtype=np.float32)
            out[int(x) - start] = 1.0
            return out

        return n, one_hot
    try:
        size = int(spaces.flatdim(space))
    except (ValueError, NotImplementedError, TypeError) as exc:
        raise GameError(f"{what} has observation space {space} that cannot be flattened to a vector "
                        f"({exc}); Ludus needs fixed-size observations") from None
    return size, lambda x: np.asarray(spaces.flatten(space, x), dtype=np.float32).reshape(size)


def discrete_actions(space: spaces.Space, what: str) -> tuple[int, int]:
    """(number of actions, first action value) of a Discrete action space; GameError otherwise."""
    if not isinstance(space, spaces.Discrete):
        raise GameError(f"{what} has action space {space}; Ludus plays Discrete action spaces only")
    return int(space.n), int(space.start)


def _check_env_id(env_id: str) -> None:
    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error:
        ids = list(gymnasium.registry)
        close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join('gym:' + c for c in close)}?" if close else ""
        raise GameError(f"unknown Gymnasium env {env_id!r}{hint} "
                        f"(gymnasium.registry lists the {len(ids)} registered ids)") from None


class GymGame:
    """A Gymnasium env behind the Ludus `Game` protocol, as seat 0 of a one-player game."""

    def __init__(self, env_id: str):
        _check_env_id(env_id)
        try:
            env = gymnasium.make(env_id)
        except gymnasium.error.DependencyNotInstalled as exc:
            # e.g. LunarLander without Box2D: the message names the pip extra to install
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "a dependency is missing"
            raise GameError(f"Gymnasium env {env_id!r} cannot be built here: {first}") from None
        if "ansi" in env.metadata.get("render_modes", ()):
            env.close()
            env = gymnasium.make(env_id, render_mode="ansi")
        self.env = env
        self.env_id = env_id
        what = f"Gymnasium env {env_id!r}"
        self._num_actions, self._action_start = discrete_actions(env.action_space, what)
        obs_size, self._flatten = space_flattener(env.observation_space, what)
        declared = env.spec.max_episode_steps if env.spec is not None else None
        self.spec = GameSpec(
            id=f"gym:{env_id}",
            num_players=1,
            num_actions=self._num_actions,
            observation_shape=(obs_size,),
            zero_sum=False,
            utility_sum=None,
            # Gymnasium declares no reward bounds.
            min_utility=float("-inf"),
            max_utility=float("inf"),
            max_length=int(declared) if declared else DEFAULT_MAX_LENGTH,
            simultaneous=False,
            has_chance=True,
            perfect_information=True,
        )
        self._obs = np.zeros(obs_size, dtype=np.float32)
        self._mask = np.ones(self._num_actions, dtype=bool)
        self._return = 0.0
        self._history: list[int] = []
        self._terminated = False
        self._truncated = False

    def reset(self, seed: int) -> None:
        obs, info = self.env.reset(seed=int(seed))
        self._obs = self._flatten(obs)
        self._mask = self._mask_from(info)
        self._return = 0.0
        self._history = []
        self._terminated = False
        self._truncated = False

    def _mask_from(self, info: dict) -> np.ndarray:
        # Some envs (Taxi, ...) publish their legal actions in info; the rest allow every action.
        mask = info.get("action_mask") if isinstance(info, dict) else None
        if mask is None:
            return np.ones(self._num_actions, dtype=bool)
        return np.asarray(mask, dtype=bool).reshape(self._num_actions)

    def to_move(self) -> tuple[int, ...]:
        return () if (self._terminated or self._truncated) else (0,)

    def observation(self, seat: int) -> np.ndarray:
        return self._obs

    def legal_mask(self, seat: int) -> np.ndarray:
        if self._terminated or self._truncated:
            return np.zeros(self._num_actions, dtype=bool)
        return self._mask

    def step(self, actions: dict[int, int]) -> np.ndarray:
        if self._terminated or self._truncated:
            raise GameError(f"{self.spec.id}: step called on a finished game; call reset")
        if set(actions) != {0}:
            raise GameError(f"{self.spec.id}: step needs exactly one action, for seat 0; got seats "
                            f"{tuple(sorted(actions))}")
        action = int(actions[0])
        if not (0 <= action < self._num_actions and self._mask[action]):
            raise GameError(f"{self.spec.id}: action {action} is illegal here")
        obs, reward, terminated, truncated, info = self.env.step(action + self._action_start)
        self._obs = self._flatten(obs)
        self._mask = self._mask_from(info)
        self._history.append(action)
        self._return += float(reward)
        self._terminated = bool(terminated)
        self._truncated = not self._terminated and (bool(truncated) or len(self._history) >= self.spec.max_length)
        return np.array([reward], dtype=np.float32)

    def is_terminal(self) -> bool:
        return self._terminated

    def is_truncated(self) -> bool:
        return self._truncated

    def returns(self) -> np.ndarray:
        return np.array([self._return], dtype=np.float32)

    def history(self) -> tuple[int, ...]:
        return tuple(self._history)

    def render(self) -> str:
        if self.env.render_mode == "ansi":
            return str(self.env.render())
        obs = np.array2string(self._obs, precision=3, suppress_small=True)
        return f"{self.env_id} step {len(self._history)}: observation {obs}, return {self._return:.3f}"


def make_gym_game(env_id: str) -> GymGame:
    """``gym:<env_id>``: e.g. ``make_gym_game("CartPole-v1")``."""
    return GymGame(env_id.strip())
