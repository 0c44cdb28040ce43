"""OpenSpiel games through `pyspiel` directly, as Ludus `Game`s (id ``spiel:<game string>``).

We wrap `pyspiel` rather than shimmy's OpenSpiel wrapper: shimmy gives the player whose terminal
step comes second its final reward twice (connect four -1/+2) and counts chance moves against
`max_game_length`, which cuts Kuhn poker off after one decision (docs/reference.md §3).

Chance nodes are resolved inside, by sampling `state.chance_outcomes()` with a Generator seeded in
`reset`, so the caller only ever sees player decisions. Rewards are read as the change of
`state.returns()` over a step, so they sum to `state.returns()` exactly by construction whatever
the game's reward model (`state.rewards()` covers only the last transition, and one Ludus step may
apply a player move followed by several chance moves).

What a seat sees is the game's information-state tensor where the game provides one: it encodes
the seat's whole history (perfect recall), which an imperfect-information game needs for a policy
to reach equilibrium (Leduc poker's observation tensor maps its 936 information states onto 516
tensors, and the CFR+ equilibrium projected onto such observations is 0.18 exploitable). Games
without one are read through their observation tensor. The id chooses otherwise with a suffix:
``spiel:leduc_poker[observation]`` or ``spiel:goofspiel(num_cards=4)[information_state]``; the
id, suffix included, is what snapshots record.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Literal

import numpy as np
import pyspiel

from ludus.games.core import GameError, GameSpec

ObservationKind = Literal["observation", "information_state"]
OBSERVATION_KINDS: tuple[ObservationKind, ...] = ("observation", "information_state")


@dataclasses.dataclass(frozen=True)
class SpielId:
    """The parts of a ``spiel:`` id after the prefix: ``game_string[kind]``."""

    game_string: str
    """The pyspiel game string, e.g. ``leduc_poker`` or ``goofspiel(num_cards=4)``."""
    kind: ObservationKind | None
    """The tensor the id asks for; None: the default (information state where provided)."""


def parse_spiel_id(text: str) -> SpielId:
    """Split ``leduc_poker[observation]`` into the game string and the tensor choice."""
    text = text.strip()
    if not text.endswith("]"):
        return SpielId(text, None)
    game_string, _, kind = text[:-1].rpartition("[")
    if kind not in OBSERVATION_KINDS or not game_string:
        raise GameError(f"bad tensor choice in spiel:{text}: the suffix is [observation] or [information_state]")
    return SpielId(game_string.strip(), kind)

# pyspiel parameter types, which it checks strictly (an int for a float parameter is an error).
_SCALARS = {bool: "true or false", int: "an integer", float: "a decimal number like 0.5", str: "a word"}


@functools.lru_cache(maxsize=None)
def load_spiel_game(text: str) -> pyspiel.Game:
    """The pyspiel game for a game string, loaded once per string (games are immutable)."""
    text = text.strip()
    try:
        params = pyspiel.game_parameters_from_string(text)
    except pyspiel.SpielError as exc:
        raise GameError(f"malformed OpenSpiel game string {text!r}: {_first_line(exc)}; "
                        f"use name or name(key=value,...)") from None
    name = params.pop("name")
    names = pyspiel.registered_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join('spiel:' + c for c in close)}?" if close else ""
        raise GameError(f"unknown OpenSpiel game {name!r}{hint} "
                        f"(pyspiel.registered_names() lists all {len(names)})")
    # Check parameter names and types before loading: pyspiel's own errors say the same but also
    # write a report to stderr from C++, and these are the common mistakes.
    game_type = next(t for t in pyspiel.registered_games() if t.short_name == name)
    defaults = game_type.parameter_specification
    allowed = sorted(defaults)
    for key, value in params.items():
        if key not in defaults:
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise GameError(f"OpenSpiel game {name!r} has no parameter {key!r}: {hint}"
                            f"its parameters are {', '.join(allowed) or '(none)'}")
        expected = type(defaults[key])
        if expected in _SCALARS and type(value) in _SCALARS and type(value) is not expected:
            raise GameError(f"OpenSpiel game {name!r}: parameter {key}={value!r} must be {_SCALARS[expected]} "
                            f"(default {defaults[key]!r})")
    try:
        game = pyspiel.load_game(text)
    except pyspiel.SpielError as exc:
        raise GameError(f"cannot load OpenSpiel game {text!r}: {_first_line(exc)}") from None
    game_type = game.get_type()
    if game_type.dynamics not in (pyspiel.GameType.Dynamics.SEQUENTIAL,
                                  pyspiel.GameType.Dynamics.SIMULTANEOUS):
        raise GameError(f"OpenSpiel game {text!r} has {game_type.dynamics} dynamics; Ludus plays "
                        f"sequential and simultaneous-move games only")
    if game_type.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
        raise GameError(f"OpenSpiel game {text!r} samples chance inside pyspiel from its own generator, "
                        f"so Ludus cannot replay it from a reset seed; pick a game with explicit chance")
    if not (game_type.provides_observation_tensor or game_type.provides_information_state_tensor):
        raise GameError(f"OpenSpiel game {text!r} provides neither observation nor information-state "
                        f"tensors, so no network can read it; pick another game")
    return game


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0].strip().rstrip(".") if lines else type(exc).__name__


def observation_kind(game: pyspiel.Game, requested: ObservationKind | None = None) -> ObservationKind:
    """Which tensor Ludus feeds a seat: `requested` if given (checked to exist), else the
    information-state tensor when the game provides one (perfect recall), else the observation."""
    game_type = game.get_type()
    provided = {"observation": game_type.provides_observation_tensor,
                "information_state": game_type.provides_information_state_tensor}
    if requested is not None:
        if not provided[requested]:
            other = next(kind for kind in OBSERVATION_KINDS if kind != requested)
            raise GameError(f"OpenSpiel game {game_type.short_name!r} provides no {requested} tensor; "
                            f"use [{other}] or no suffix")
        return requested
    return "information_state" if provided["information_state"] else "observation"


def observation_shape(game: pyspiel.Game, kind: ObservationKind) -> tuple[int, ...]:
    if kind == "observation":
        return tuple(game.observation_tensor_shape())
    return tuple(game.information_state_tensor_shape())


def _tensor(state: pyspiel.State, seat: int, kind: ObservationKind, shape: tuple[int, ...]) -> np.ndarray:
    values = state.observation_tensor(seat) if kind == "observation" else state.information_state_tensor(seat)
    return np.asarray(values, dtype=np.float32).reshape(shape)


def spiel_observation(state: pyspiel.State, seat: int, kind: ObservationKind) -> np.ndarray:
    """What `seat` sees in `state` when the game is read through `kind` tensors: exactly the
    array `SpielGame.observation` gives a policy.

    Tools that score a policy on pyspiel states (exploitability, best response) call this so they
    evaluate the same function of the state that played."""
    return _tensor(state, seat, kind, observation_shape(state.get_game(), kind))


def spiel_game_for(game_id: str) -> pyspiel.Game:
    """The pyspiel game behind a Ludus ``spiel:`` id (the tensor suffix does not change the game)."""
    return load_spiel_game(parse_spiel_id(game_id.removeprefix("spiel:")).game_string)


def spiel_observation_kind(game_id: str) -> ObservationKind:
    """The tensor a ``spiel:`` game id is read through (suffix or default)."""
    parsed = parse_spiel_id(game_id.removeprefix("spiel:"))
    return observation_kind(load_spiel_game(parsed.game_string), parsed.kind)


def stale_snapshot(rest: str, saved_shape: tuple[int, ...]) -> str:
    """Why a snapshot that read observations of `saved_shape` cannot play ``spiel:<rest>`` now ('' if
    it can). spiel: ids read information-state tensors where the game has them; a snapshot saved
    when the same id meant the observation tensor has another input shape."""
    game_id, now = f"spiel:{rest}", tuple(spiel_spec(rest).observation_shape)
    if tuple(saved_shape) == now:
        return ""
    return (f"reads observations of shape {tuple(saved_shape)}, {game_id} gives {now}: it was saved before "
            f"spiel: ids read information-state tensors; train it again on {game_id} (or on "
            f"{game_id}[observation] for the old input)")


@functools.lru_cache(maxsize=None)
def spiel_spec(text: str) -> GameSpec:
    """The GameSpec of ``spiel:<text>`` (cached: specs are frozen values)."""
    parsed = parse_spiel_id(text)
    game = load_spiel_game(parsed.game_string)
    game_type = game.get_type()
    utility = game_type.utility
    zero_sum = utility in (pyspiel.GameType.Utility.ZERO_SUM, pyspiel.GameType.Utility.CONSTANT_SUM)
    return GameSpec(
        id=f"spiel:{text.strip()}",
        num_players=game.num_players(),
        num_actions=game.num_distinct_actions(),
        observation_shape=observation_shape(game, observation_kind(game, parsed.kind)),
        zero_sum=zero_sum,
        utility_sum=float(game.utility_sum()) if zero_sum else None,
        min_utility=float(game.min_utility()),
        max_utility=float(game.max_utility()),
        # OpenSpiel counts decision nodes only (a simultaneous node is one), as Ludus counts steps.
        max_length=int(game.max_game_length()),
        simultaneous=game_type.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS,
        has_chance=game_type.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC,
        perfect_information=game_type.information == pyspiel.GameType.Information.PERFECT_INFORMATION,
        spiel_name=parsed.game_string,
    )


class SpielGame:
    """One pyspiel game behind the Ludus `Game` protocol.

    `state` is the live pyspiel state (tools such as MCTS or exploitability read it); replace it
    only through `reset`/`step`.
    """

    def __init__(self, text: str):
        parsed = parse_spiel_id(text)
        self.game = load_spiel_game(parsed.game_string)
        self.spec = spiel_spec(text)
        self.kind = observation_kind(self.game, parsed.kind)
        """The tensor seats see (`observation_kind`)."""
        self._shape = self.spec.observation_shape
        self._num_players = self.spec.num_players
        self._num_actions = self.spec.num_actions
        self.state: pyspiel.State = self.game.new_initial_state()
        # Games that pay only at the end have zero returns before it: skip reading them until then.
        self._terminal_rewards = self.game.get_type().reward_model == pyspiel.GameType.RewardModel.TERMINAL
        self._rng = np.random.default_rng(0)
        self._returns = [0.0] * self._num_players
        self._history: list[int] = []
        self._to_move: tuple[int, ...] = ()
        self._simultaneous_node = False

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(int(seed))
        self.state = self.game.new_initial_state()
        self._history = []
        self._returns = [0.0] * self._num_players
        self._advance()

    def _advance(self) -> None:
        """Resolve chance nodes, then record who moves next."""
        state = self.state
        while state.is_chance_node():
            # Inverse-CDF sampling; a rounding shortfall of the probabilities falls to the last outcome.
            u = self._rng.random()
            for outcome, probability in state.chance_outcomes():
                u -= probability
                if u < 0.0:
                    break
            state.apply_action(outcome)
        self._simultaneous_node = state.is_simultaneous_node()
        if state.is_terminal():
            self._to_move = ()
        elif self._simultaneous_node:
            self._to_move = tuple(p for p in range(self._num_players) if state.legal_actions(p))
        else:
            self._to_move = (state.current_player(),)

    def to_move(self) -> tuple[int, ...]:
        return self._to_move

    def observation(self, seat: int) -> np.ndarray:
        return _tensor(self.state, seat, self.kind, self._shape)

    def legal_mask(self, seat: int) -> np.ndarray:
        mask = np.zeros(self._num_actions, dtype=bool)
        if seat in self._to_move:
            mask[self.state.legal_actions(seat)] = True
        return mask

    def step(self, actions: dict[int, int]) -> np.ndarray:
        movers = self._to_move
        if not movers:
            raise GameError(f"{self.spec.id}: step called on a finished game; call reset")
        if len(actions) != len(movers) or any(p not in actions for p in movers):
            raise GameError(f"{self.spec.id}: step needs one action for each of seats {movers}, "
                            f"got seats {tuple(sorted(actions))}")
        if self._simultaneous_node:
            # OpenSpiel wants a joint action with 0 for seats that have no legal action.
            joint = [int(actions[p]) if p in actions else 0 for p in range(self._num_players)]
            for p in movers:
                self._check_legal(p, joint[p])
            self.state.apply_actions(joint)
            self._history.extend(joint[p] for p in movers)
        else:
            (seat,) = movers
            action = int(actions[seat])
            self._check_legal(seat, action)
            self.state.apply_action(action)
            self._history.append(action)
        self._advance()
        if self._terminal_rewards and self._to_move:  # still running: nothing paid yet
            return np.zeros(self._num_players, dtype=np.float32)
        before, self._returns = self._returns, self.state.returns()
        return np.array([now - then for now, then in zip(self._returns, before)], dtype=np.float32)

    def _check_legal(self, seat: int, action: int) -> None:
        if action not in self.state.legal_actions(seat):
            raise GameError(f"{self.spec.id}: action {action} is illegal for seat {seat} here; "
                            f"legal: {self.state.legal_actions(seat)}")

    def is_terminal(self) -> bool:
        return self.state.is_terminal()

    def is_truncated(self) -> bool:
        # max_length is the game's own bound, so its rules always end it first.
        return False

    def returns(self) -> np.ndarray:
        return np.array(self._returns, dtype=np.float32)

    def history(self) -> tuple[int, ...]:
        return tuple(self._history)

    def render(self) -> str:
        return str(self.state)


def make_spiel_game(text: str) -> SpielGame:
    """``spiel:<text>``: e.g. ``make_spiel_game("goofspiel(num_cards=4)")`` or
    ``make_spiel_game("leduc_poker[observation]")``."""
    return SpielGame(text)


def describe_layout(game: SpielGame) -> list[str]:
    """`ludus games --describe` lines of a ``spiel:`` game (the adapter record's `layout` hook):
    the tensor the seat reads and pyspiel's name of every action."""
    tensor = "information_state_tensor" if game.kind == "information_state" else "observation_tensor"
    # named at the first decision (chance resolved by its first outcome): many games name
    # actions only in a state (Kuhn's 0 and 1 are Pass and Bet)
    state = game.game.new_initial_state()
    while state.is_chance_node():
        state.apply_action(state.chance_outcomes()[0][0])
    player = 0 if state.is_simultaneous_node() else state.current_player()
    names = []
    for action in range(game.spec.num_actions):
        try:
            names.append(f"{action} {state.action_to_string(player, action)}")
        except pyspiel.SpielError:  # an action some games cannot name here
            names.append(f"{action} ?")
    return [f"observation: pyspiel's {tensor}(seat) of {game.spec.spiel_name!r}, reshaped to "
            f"{list(game.spec.observation_shape)} (OpenSpiel's documentation of the game lists its entries)",
            "actions: pyspiel action ids" + (": " + ", ".join(names) if names else "")]
