"""PettingZoo environments as Ludus games (id ``pz:<module path>``, e.g.
``pz:pettingzoo.classic.tictactoe_v3`` or ``pz:mpe2.simple_spread_v3(N=2)``).

The module is imported by path. A module offering ``parallel_env()`` is played through the
Parallel API (simultaneous moves: every live agent acts in each step; MPE is Parallel-first);
otherwise ``env()`` is played through the AEC API (one agent per step; classic board and card
games). Seats follow ``possible_agents``. Parameters in parentheses go to the constructor.

Observations are flattened to float32 and zero-padded to the largest agent's size; legal actions
come from ``obs["action_mask"]``, else ``infos[agent]["action_mask"]``, else all actions. Only
Discrete action spaces are supported. Rewards are read from ``env.rewards`` after every env step
(including the internal steps of finished agents, which PettingZoo requires to be stepped with
None), so their sum is the game's return.

PettingZoo does not say whether a game is zero-sum or how long it lasts; `KNOWN_FACTS` records it
for the environments we have checked, and anything else is taken as general-sum, unbounded,
with chance, imperfect information, and `max_cycles` (or `DEFAULT_MAX_LENGTH`) as the step cap.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import numpy as np

from ludus.games.core import GameError, GameSpec
from ludus.games.adapters.gym import DEFAULT_MAX_LENGTH, discrete_actions, space_flattener
from ludus.games.registry import parse_params


@dataclass(frozen=True)
class KnownFacts:
    """What PettingZoo does not declare about an environment, checked by hand (and by check_game)."""

    zero_sum: bool
    """Final returns always sum to `utility_sum`."""
    utility_sum: float | None
    """That sum, or None when not zero-sum."""
    min_utility: float
    """Lowest final return of a seat."""
    max_utility: float
    """Highest final return of a seat."""
    max_length: int | None
    """Most steps a game can take; None to use max_cycles / DEFAULT_MAX_LENGTH."""
    has_chance: bool
    """The game draws random events."""
    perfect_information: bool
    """Every seat sees the whole position."""
    one_team: bool = False
    """All seats play as one team (cooperative games); else one team per seat."""
    ends_by_truncation: bool = False
    """The game's rules end it after a fixed number of rounds, which PettingZoo reports as a
    truncation: here that end is terminal (a learner must not bootstrap past it)."""


_INF = float("inf")
KNOWN_FACTS: dict[str, KnownFacts] = {
    "pettingzoo.classic.tictactoe_v3": KnownFacts(True, 0.0, -1.0, 1.0, 9, False, True),
    "pettingzoo.classic.connect_four_v3": KnownFacts(True, 0.0, -1.0, 1.0, 42, False, True),
    # rlcard limit hold'em pays chips / big blind (2). Each of 4 rounds allows 4 raises of 2, 2, 4, 4
    # chips over the big blind's 2, so a seat can lose at most 2 + 8 + 8 + 16 + 16 = 50 chips = 25,
    # and a round holds at most 6 decisions (check/call, 4 raises, call): 24 steps.
    "pettingzoo.classic.texas_holdem_v4": KnownFacts(True, 0.0, -25.0, 25.0, 24, True, False),
    # Cooperative navigation: every agent shares the team reward and sees every agent and landmark
    # (relative to itself) (Lowe et al. 2017).
    "mpe2.simple_spread_v3": KnownFacts(False, None, -_INF, _INF, None, True, True, one_team=True),
    # Rock-paper-scissors is max_cycles rounds by its rules (PettingZoo then truncates); +-1 per round.
    "pettingzoo.classic.rps_v2": KnownFacts(True, 0.0, -_INF, _INF, None, False, False, ends_by_truncation=True),
}

_ID_RE = re.compile(r"^(?P<module>[A-Za-z_][\w.]*)(\((?P<params>.*)\))?$")


def _import_env_module(module_path: str) -> ModuleType:
    try:
        return importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not (module_path == missing or module_path.startswith(missing + ".")):
            # A dependency of the environment is missing, not the environment module itself.
            raise GameError(f"PettingZoo env {module_path!r} needs the package {missing!r}: "
                            f"pip install it (or the env's extra, e.g. pettingzoo[{_family(module_path)}])"
                            ) from None
        parent, _, name = module_path.rpartition(".")
        siblings: list[str] = []
        if parent:
            try:
                package = importlib.import_module(parent)
                siblings = [m.name for m in pkgutil.iter_modules(getattr(package, "__path__", []))]
            except ImportError:
                pass
        close = difflib.get_close_matches(name, siblings, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(f'pz:{parent}.{c}' for c in close)}?" if close else ""
        raise GameError(f"no PettingZoo env module {module_path!r}{hint} (give the import path, "
                        f"e.g. pz:pettingzoo.classic.tictactoe_v3 or pz:mpe2.simple_spread_v3)") from None
    except ImportError as exc:  # the module exists but refuses to import (pettingzoo.mpe: moved to mpe2)
        reason = str(exc).splitlines()[0].rstrip(". ") if str(exc) else type(exc).__name__
        moved = (f"; try pz:mpe2.{module_path.removeprefix('pettingzoo.mpe.')}"
                 if module_path.startswith("pettingzoo.mpe.") else "")
        raise GameError(f"PettingZoo env module {module_path!r} cannot be imported: {reason}{moved}") from None


def _family(module_path: str) -> str:
    parts = module_path.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "pettingzoo" else "all"


@dataclass(frozen=True)
class _SeatView:
    """How to read one agent's observation, mask and actions."""

    agent: str
    num_actions: int
    action_start: int
    obs_size: int
    flatten: Callable[[Any], np.ndarray]
    dict_obs: bool
    """Observations are dicts holding "observation" (and usually "action_mask")."""


class _PettingZooGame:
    """What the AEC and Parallel adapters share: seats, spec, observation reading, results.

    Subclasses define the API-specific part: reset, to_move, observation, legal_mask, step."""

    def __init__(self, module_path: str, env: Any, parallel: bool, params: dict[str, Any], game_id: str):
        self.env = env
        self.module_path = module_path
        agents = list(env.possible_agents)
        self._agents = agents
        self._seat = {agent: i for i, agent in enumerate(agents)}
        views = []
        for agent in agents:
            what = f"PettingZoo env {module_path!r} (agent {agent!r})"
            n, start = discrete_actions(env.action_space(agent), what)
            space = env.observation_space(agent)
            dict_obs = hasattr(space, "spaces") and isinstance(space.spaces, dict) and "observation" in space.spaces
            size, flatten = space_flattener(space["observation"] if dict_obs else space, what)
            views.append(_SeatView(agent, n, start, size, flatten, dict_obs))
        self._views = views
        self._num_actions = max(v.num_actions for v in views)
        self._obs_size = max(v.obs_size for v in views)
        self._has_state = hasattr(env, "state_space") and hasattr(env, "state")
        facts = KNOWN_FACTS.get(module_path)
        self._truncation_ends = bool(facts and facts.ends_by_truncation)
        max_cycles = getattr(env.unwrapped, "max_cycles", None) if "max_cycles" not in params else params["max_cycles"]
        if facts is not None and facts.max_length is not None:
            max_length = facts.max_length
        elif max_cycles:
            # AEC counts one step per agent per cycle; Parallel one step per cycle.
            max_length = int(max_cycles) * (1 if parallel else len(agents))
        else:
            max_length = DEFAULT_MAX_LENGTH
        self.spec = GameSpec(
            id=game_id,
            num_players=len(agents),
            num_actions=self._num_actions,
            observation_shape=(self._obs_size,),
            teams=(0,) * len(agents) if facts and facts.one_team else (),
            zero_sum=facts.zero_sum if facts else False,
            utility_sum=facts.utility_sum if facts else None,
            min_utility=facts.min_utility if facts else -_INF,
            max_utility=facts.max_utility if facts else _INF,
            max_length=max_length,
            simultaneous=parallel,
            has_chance=facts.has_chance if facts else True,
            perfect_information=facts.perfect_information if facts else False,
            state_shape=(int(np.prod(env.state_space.shape)),) if self._has_state else None,
        )
        self._returns = np.zeros(len(agents), dtype=np.float64)
        self._history: list[int] = []
        self._steps = 0
        self._over = False
        self._env_truncated = False
        self._capped = False

    def _read(self, seat: int, raw: Any, info: dict | None) -> tuple[np.ndarray, np.ndarray]:
        """(padded flat observation, legal mask) of `seat` from its raw observation."""
        view = self._views[seat]
        mask_values = None
        if view.dict_obs:
            mask_values = raw.get("action_mask")
            raw = raw["observation"]
        if mask_values is None and info:
            mask_values = info.get("action_mask")
        obs = view.flatten(raw)
        if view.obs_size < self._obs_size:
            obs = np.concatenate([obs, np.zeros(self._obs_size - view.obs_size, dtype=np.float32)])
        mask = np.zeros(self._num_actions, dtype=bool)
        if mask_values is None:
            mask[: view.num_actions] = True
        else:
            mask[: view.num_actions] = np.asarray(mask_values, dtype=bool).reshape(view.num_actions)
        return obs, mask

    def _add_rewards(self, rewards: np.ndarray, env_rewards: dict) -> None:
        for agent, reward in env_rewards.items():
            rewards[self._seat[agent]] += float(reward)

    def _check_action(self, seat: int, action: int, mask: np.ndarray) -> int:
        if not (0 <= action < self._num_actions and mask[action]):
            raise GameError(f"{self.spec.id}: action {action} is illegal for seat {seat} here; "
                            f"legal: {np.flatnonzero(mask).tolist()}")
        return action + self._views[seat].action_start

    def _check_movers(self, actions: dict[int, int]) -> tuple[int, ...]:
        movers = self.to_move()
        if not movers:
            raise GameError(f"{self.spec.id}: step called on a finished game; call reset")
        if set(actions) != set(movers):
            raise GameError(f"{self.spec.id}: step needs one action for each of seats {movers}, "
                            f"got seats {tuple(sorted(actions))}")
        return movers

    def is_terminal(self) -> bool:
        return self._over and (self._truncation_ends or not self._env_truncated)

    def is_truncated(self) -> bool:
        return self._capped or (self._over and self._env_truncated and not self._truncation_ends)

    def returns(self) -> np.ndarray:
        return self._returns.astype(np.float32)

    def history(self) -> tuple[int, ...]:
        return tuple(self._history)

    def global_state(self) -> np.ndarray:
        """The env's global state (`env.state()`), flattened; for centralised critics (MAPPO)."""
        if not self._has_state:
            raise GameError(f"{self.spec.id} has no global state (spec.state_shape is None)")
        return np.asarray(self.env.state(), dtype=np.float32).reshape(-1)

    def render(self) -> str:
        if getattr(self.env, "render_mode", None) == "ansi":
            text = self.env.render()
            if isinstance(text, str):
                return text
        movers = ", ".join(self._agents[s] for s in self.to_move()) or "nobody (game over)"
        returns = ", ".join(f"{a} {r:+.3f}" for a, r in zip(self._agents, self._returns))
        return (f"{self.module_path} step {self._steps}: to move {movers}; returns {returns}; "
                f"last actions {self._history[-4:]}")


class PettingZooAECGame(_PettingZooGame):
    """A turn-based (AEC) PettingZoo env: `to_move()` is the selected agent's seat."""

    def __init__(self, module_path: str, env: Any, params: dict[str, Any], game_id: str):
        super().__init__(module_path, env, parallel=False, params=params, game_id=game_id)
        self._views_now: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._final: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._mover: tuple[int, ...] = ()

    def reset(self, seed: int) -> None:
        self.env.reset(seed=int(seed))
        self._returns = np.zeros(len(self._agents), dtype=np.float64)
        self._history = []
        self._steps = 0
        self._over = self._env_truncated = self._capped = False
        self._final = {}
        rewards = np.zeros(len(self._agents), dtype=np.float64)
        self._settle(rewards)
        self._returns += rewards

    def _observe(self, seat: int) -> tuple[np.ndarray, np.ndarray]:
        view = self._views_now.get(seat)
        if view is None:
            agent = self._agents[seat]
            view = self._read(seat, self.env.observe(agent), self.env.infos.get(agent))
            self._views_now[seat] = view
        return view

    def _settle(self, rewards: np.ndarray) -> None:
        """Step finished agents with None until a live agent is selected or none is left."""
        env = self.env
        self._views_now = {}
        while env.agents:
            agent = env.agent_selection
            if not (env.terminations[agent] or env.truncations[agent]):
                break
            if env.truncations[agent] and not env.terminations[agent]:
                self._env_truncated = True
            seat = self._seat[agent]
            self._final[seat] = self._observe(seat)  # what it saw when it left
            env.step(None)
            self._views_now = {}
            self._add_rewards(rewards, env.rewards)
        self._over = not env.agents
        self._mover = () if self._over else (self._seat[env.agent_selection],)

    def to_move(self) -> tuple[int, ...]:
        return () if self._capped else self._mover

    def observation(self, seat: int) -> np.ndarray:
        if seat in self._final:
            return self._final[seat][0]
        return self._observe(seat)[0]

    def legal_mask(self, seat: int) -> np.ndarray:
        if seat not in self.to_move():
            return np.zeros(self._num_actions, dtype=bool)
        return self._observe(seat)[1]

    def step(self, actions: dict[int, int]) -> np.ndarray:
        (seat,) = self._check_movers(actions)
        action = int(actions[seat])
        env_action = self._check_action(seat, action, self._observe(seat)[1])
        rewards = np.zeros(len(self._agents), dtype=np.float64)
        self.env.step(env_action)
        self._add_rewards(rewards, self.env.rewards)
        self._history.append(action)
        self._steps += 1
        self._settle(rewards)
        self._capped = not self._over and self._steps >= self.spec.max_length
        self._returns += rewards
        return rewards.astype(np.float32)


class PettingZooParallelGame(_PettingZooGame):
    """A Parallel PettingZoo env: every live agent acts in each step."""

    def __init__(self, module_path: str, env: Any, params: dict[str, Any], game_id: str):
        super().__init__(module_path, env, parallel=True, params=params, game_id=game_id)
        # One fresh array per seat and step (never written in place): callers may keep them.
        self._obs = [np.zeros(self._obs_size, dtype=np.float32) for _ in self._agents]
        self._masks = [np.zeros(self._num_actions, dtype=bool) for _ in self._agents]
        self._live: tuple[int, ...] = ()

    def _store(self, observations: dict, infos: dict) -> None:
        for agent, raw in observations.items():
            seat = self._seat[agent]
            self._obs[seat], self._masks[seat] = self._read(seat, raw, infos.get(agent))

    def reset(self, seed: int) -> None:
        observations, infos = self.env.reset(seed=int(seed))
        self._obs = [np.zeros(self._obs_size, dtype=np.float32) for _ in self._agents]
        self._masks = [np.zeros(self._num_actions, dtype=bool) for _ in self._agents]
        self._store(observations, infos)
        self._live = tuple(sorted(self._seat[a] for a in self.env.agents))
        self._returns = np.zeros(len(self._agents), dtype=np.float64)
        self._history = []
        self._steps = 0
        self._over = not self._live
        self._env_truncated = self._capped = False

    def to_move(self) -> tuple[int, ...]:
        return () if self._capped else self._live

    def observation(self, seat: int) -> np.ndarray:
        return self._obs[seat]

    def legal_mask(self, seat: int) -> np.ndarray:
        if seat not in self.to_move():
            return np.zeros(self._num_actions, dtype=bool)
        return self._masks[seat]

    def step(self, actions: dict[int, int]) -> np.ndarray:
        movers = self._check_movers(actions)
        env_actions = {self._agents[s]: self._check_action(s, int(actions[s]), self._masks[s]) for s in movers}
        observations, env_rewards, terminations, truncations, infos = self.env.step(env_actions)
        rewards = np.zeros(len(self._agents), dtype=np.float64)
        self._add_rewards(rewards, env_rewards)
        self._store(observations, infos)
        still_in = set(self.env.agents)
        live = []
        for seat in movers:
            agent = self._agents[seat]
            if terminations.get(agent) or truncations.get(agent) or agent not in still_in:
                if truncations.get(agent) and not terminations.get(agent):
                    self._env_truncated = True
                self._masks[seat] = np.zeros(self._num_actions, dtype=bool)
            else:
                live.append(seat)
        self._live = tuple(live)
        self._history.extend(int(actions[s]) for s in movers)
        self._steps += 1
        self._over = not self._live
        self._capped = not self._over and self._steps >= self.spec.max_length
        self._returns += rewards
        return rewards.astype(np.float32)


def make_pettingzoo_game(text: str) -> _PettingZooGame:
    """``pz:<module path>[(key=value,...)]``: e.g. ``make_pettingzoo_game("mpe2.simple_spread_v3")``."""
    text = text.strip()
    match = _ID_RE.match(text)
    if not match:
        raise GameError(f"malformed PettingZoo id {text!r}: use pz:package.module or pz:package.module(key=value,...)")
    module_path = match.group("module")
    params = parse_params(match.group("params") or "", f"pz:{text}")
    module = _import_env_module(module_path)
    parallel = hasattr(module, "parallel_env")
    if not parallel and not hasattr(module, "env"):
        raise GameError(f"module {module_path!r} has neither env() nor parallel_env(); "
                        f"give the path of a PettingZoo environment module")
    constructor = module.parallel_env if parallel else module.env
    metadata = getattr(getattr(module, "raw_env", None), "metadata", None) or {}
    if "ansi" in metadata.get("render_modes", ()):
        params = {"render_mode": "ansi", **params}
    try:
        env = constructor(**params)
    except TypeError as exc:
        raise GameError(f"bad parameters for PettingZoo env {module_path!r}: {exc}") from None
    game_id = f"pz:{text}"
    if parallel:
        return PettingZooParallelGame(module_path, env, params, game_id)
    return PettingZooAECGame(module_path, env, params, game_id)
