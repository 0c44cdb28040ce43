"""Reference bots: fixed opponents that anchor ratings (OpenAI Five tracked TrueSkill against such bots).

* `RandomBot` — uniform over legal actions.
* `MCTSBot` — OpenSpiel's C++ MCTS (Kocsis & Szepesvári 2006, UCT) with random rollouts, on any
  game whose spec names an equivalent deterministic, turn-based pyspiel game (`GameSpec.spiel_name`);
  on connect four the same search compiled on bitboards (agents/bots/connect_four_mcts.py, ~15x faster).
* `PerfectTicTacToe` — plays tic-tac-toe perfectly, uniformly among all optimal moves.
* `ScriptedBot` — wraps a plain function into a `Policy`.

`make_bot("mcts-100", spec)` builds one from a name. All bots draw their randomness from the
Generator passed to `act`, so a match replays exactly from its seed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ludus.agents.policy import ActBatch, ActOutput, Policy, RandomPolicy, zero_output
from ludus.games.core import GameSpec
from ludus.errors import UserError


class BotError(UserError, ValueError):
    """A bad bot name, a bot asked to play a game it cannot play, or a scripted bot that misbehaved."""


RandomBot = RandomPolicy
"""Uniform over legal actions; its log-probs are exact (-log #legal)."""


def _row_seeds(rng: np.random.Generator, n: int, base_seed: int) -> list[int]:
    """n fresh 31-bit seeds (pyspiel takes a C int) mixing the bot's own seed with draws from `rng`."""
    entropy = [base_seed & 0xFFFFFFFF, *rng.integers(0, 2**32, size=2, dtype=np.uint64).tolist()]
    return [int(s) & 0x7FFFFFFF for s in np.random.SeedSequence(entropy).generate_state(n, np.uint32)]


# ------------------------------------------------------------------------------------------ MCTS


class MCTSBot:
    """OpenSpiel's C++ `pyspiel.MCTSBot` with a `RandomRolloutEvaluator`.

    Each decision rebuilds the pyspiel state by replaying `ActBatch.histories` (native games use
    the same action ids as their `spec.spiel_name`) and searches with a search tree and evaluator
    seeded afresh from the Generator passed to `act` — so successive games (and moves) differ,
    yet a match replays exactly from its seed. Search is deterministic given that seed, so
    `greedy` changes nothing.

    On connect four the search runs compiled (agents/bots/connect_four_mcts.py): the same algorithm,
    step for step, on bitboards, one call for the whole batch, ~15x faster than OpenSpiel's
    generic C++ here; only its random numbers differ, so it plays the same distribution of moves
    (tests/test_bots.py). `compiled=False` asks for OpenSpiel's own search.

    Args: `simulations` tree descents per move; `uct_c` UCT's exploration constant; `rollouts`
    random rollouts averaged per leaf; `seed` mixed into every per-move seed (two MCTS bots
    given the same Generator still differ); `solve` backs up proven wins and losses
    (MCTS-Solver, Winands et al. 2008); `compiled` uses the compiled search where there is one.
    """

    needs_history = True

    def __init__(self, spiel_name: str, simulations: int = 100, uct_c: float = 2.0, rollouts: int = 1,
                 seed: int = 0, solve: bool = True, compiled: bool = True):
        import pyspiel

        if simulations < 1 or rollouts < 1:
            raise BotError(f"mcts needs simulations >= 1 and rollouts >= 1, got {simulations} and {rollouts}")
        try:
            self.game = pyspiel.load_game(spiel_name)
        except pyspiel.SpielError as exc:
            raise BotError(f"mcts: OpenSpiel cannot load {spiel_name!r}: {str(exc).splitlines()[0]}") from None
        game_type = self.game.get_type()
        if (game_type.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL
                or game_type.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC
                or game_type.information != pyspiel.GameType.Information.PERFECT_INFORMATION):
            # Histories hold no chance outcomes and MCTS needs the true state: only deterministic,
            # turn-based, perfect-information games can be replayed and searched.
            raise BotError(f"mcts plays deterministic turn-based perfect-information games; "
                           f"{spiel_name!r} is not one: use 'random'")
        self.spiel_name = spiel_name
        self.simulations = int(simulations)
        self.uct_c = float(uct_c)
        self.rollouts = int(rollouts)
        self.seed = int(seed)
        self.solve = bool(solve)
        self._pyspiel = pyspiel
        self._compiled_search = None
        if compiled and spiel_name == "connect_four":
            from ludus.agents.bots.connect_four_mcts import search

            self._compiled_search = search

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        if batch.histories is None:
            raise BotError("mcts needs ActBatch.histories to rebuild the game state")
        seeds = _row_seeds(rng, len(batch), self.seed)
        search = self._search_openspiel if self._compiled_search is None else self._search_compiled
        actions = search(batch, seeds)
        for i, action in enumerate(actions):
            if not batch.mask[i, action]:
                raise ValueError(f"row {i}: mcts chose {action}, illegal in the given mask; the game and "
                                 f"{self.spiel_name!r} disagree on legal actions")
        return zero_output(actions)

    def _not_a_position(self, batch: ActBatch, row: int) -> ValueError:
        return ValueError(f"row {row}: replaying the history in {self.spiel_name!r} does not give a "
                          f"position where seat {int(batch.seats[row])} is to move")

    def _search_openspiel(self, batch: ActBatch, seeds: list[int]) -> np.ndarray:
        actions = np.empty(len(batch), dtype=np.int64)
        for i, history in enumerate(batch.histories):
            state = self.game.new_initial_state()
            for action in history:
                state.apply_action(int(action))
            if state.is_terminal() or state.current_player() != int(batch.seats[i]):
                raise self._not_a_position(batch, i)
            evaluator = self._pyspiel.RandomRolloutEvaluator(self.rollouts, seeds[i])
            bot = self._pyspiel.MCTSBot(self.game, evaluator, self.uct_c, self.simulations,
                                        1000, self.solve, seeds[i], False)
            actions[i] = bot.step(state)
        return actions

    def _search_compiled(self, batch: ActBatch, seeds: list[int]) -> np.ndarray:
        actions = self._compiled_search(batch.histories, np.asarray(seeds), self.simulations, self.uct_c,
                                        self.rollouts, self.solve)
        for i, history in enumerate(batch.histories):
            # Seat 0 moves first and turns alternate, so the history's length says who is to move.
            if actions[i] < 0 or len(history) % 2 != int(batch.seats[i]):
                raise self._not_a_position(batch, i)
        return actions


# ------------------------------------------------------------------------------- tic-tac-toe solver

_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
EMPTY, CROSS, NOUGHT = 0, 1, 2
"""Cell contents. Seat 0 plays crosses and moves first (as in OpenSpiel's tic_tac_toe)."""


@dataclass(frozen=True)
class SolvedPosition:
    """Minimax result of one tic-tac-toe position."""

    value: int
    """Game value for the player to move: +1 win, 0 draw, -1 loss (with perfect play by both)."""
    best_moves: tuple[int, ...]
    """Every cell (action id row*3+col) that achieves `value`; empty at terminal positions."""


def _winner(board: tuple[int, ...]) -> int:
    for a, b, c in _LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return EMPTY


def solve_tic_tac_toe() -> dict[tuple[int, ...], SolvedPosition]:
    """Full minimax over every position reachable from the empty board (5,478 of them), memoised."""
    table: dict[tuple[int, ...], SolvedPosition] = {}

    def solve(board: tuple[int, ...]) -> int:
        known = table.get(board)
        if known is not None:
            return known.value
        if _winner(board) != EMPTY:
            result = SolvedPosition(-1, ())  # the player who just moved has won
        elif EMPTY not in board:
            result = SolvedPosition(0, ())
        else:
            mover = CROSS if board.count(CROSS) == board.count(NOUGHT) else NOUGHT
            child_values = {}
            for cell in range(9):
                if board[cell] == EMPTY:
                    child = board[:cell] + (mover,) + board[cell + 1:]
                    child_values[cell] = -solve(child)  # negamax: the opponent's value, negated
            best = max(child_values.values())
            result = SolvedPosition(best, tuple(c for c, v in child_values.items() if v == best))
        table[board] = result
        return result.value

    solve((EMPTY,) * 9)
    return table


_SOLUTION: dict[tuple[int, ...], SolvedPosition] | None = None


def tic_tac_toe_solution() -> dict[tuple[int, ...], SolvedPosition]:
    """The solved game, computed once per process (~30 ms)."""
    global _SOLUTION
    if _SOLUTION is None:
        _SOLUTION = solve_tic_tac_toe()
    return _SOLUTION


def board_from_history(history: tuple[int, ...]) -> tuple[int, ...]:
    """Cells after playing `history` (cell ids row*3+col, crosses first)."""
    board = [EMPTY] * 9
    for ply, cell in enumerate(history):
        if not 0 <= cell < 9 or board[cell] != EMPTY:
            raise ValueError(f"history {tuple(history)} is not a tic-tac-toe game: move {cell} at ply {ply}")
        board[cell] = CROSS if ply % 2 == 0 else NOUGHT
    return tuple(board)


def history_from_board(board: Sequence[int]) -> tuple[int, ...]:
    """A history that reaches `board` (crosses and noughts alternating, crosses first, each in
    increasing cell order): tic-tac-toe's state is its board, so any such order is the position."""
    crosses = [i for i, c in enumerate(board) if c == CROSS]
    noughts = [i for i, c in enumerate(board) if c == NOUGHT]
    if len(crosses) - len(noughts) not in (0, 1):
        raise ValueError(f"board {tuple(board)} has {len(crosses)} crosses and {len(noughts)} noughts: not a "
                         f"tic-tac-toe position")
    history = [cell for pair in zip(crosses, noughts) for cell in pair]
    return tuple(history + crosses[len(noughts):])


OBS_LAYOUTS = ("seat_relative", "openspiel")
"""How `board_from_observation` reads a [3, 3, 3] observation:

* 'seat_relative': planes (own stones, opponent stones, empty) of the seat observing — Ludus's
  native ``tic_tac_toe``;
* 'openspiel': planes (empty, noughts, crosses), the same for both seats — ``spiel:tic_tac_toe``.

The two cannot be told apart from the numbers alone (3 stones of each kind plus 3 empty cells fit
both), so the layout is always given."""


def board_from_observation(obs: np.ndarray, seat: int, layout: str) -> tuple[int, ...]:
    """Cells of a tic-tac-toe observation made for `seat`, in `layout` (see OBS_LAYOUTS)."""
    planes = np.asarray(obs).reshape(3, 9) > 0.5
    if not np.all(planes.sum(axis=0) == 1):
        raise BotError(f"the observation is not a tic-tac-toe board in the {layout!r} layout")
    if layout == "seat_relative":
        own, opponent = (CROSS, NOUGHT) if seat == 0 else (NOUGHT, CROSS)
        cells = np.where(planes[0], own, np.where(planes[1], opponent, EMPTY))
    elif layout == "openspiel":
        cells = np.where(planes[2], CROSS, np.where(planes[1], NOUGHT, EMPTY))
    else:
        raise BotError(f"unknown observation layout {layout!r}: use one of {', '.join(OBS_LAYOUTS)}")
    return tuple(int(c) for c in cells)


class PerfectTicTacToe:
    """Perfect tic-tac-toe: a uniformly random choice (from the Generator) among ALL optimal moves.

    Reads the board from `ActBatch.histories` when given, else from the observations in
    `obs_layout` (None: histories are required). Never loses; against itself every game is a draw.
    """

    needs_history = True

    def __init__(self, obs_layout: str | None = None) -> None:
        if obs_layout is not None and obs_layout not in OBS_LAYOUTS:
            raise BotError(f"unknown observation layout {obs_layout!r}: use one of {', '.join(OBS_LAYOUTS)}")
        self.obs_layout = obs_layout
        self.solution = tic_tac_toe_solution()

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        if batch.histories is None and self.obs_layout is None:
            raise BotError("the perfect tic-tac-toe bot needs ActBatch.histories (or an obs_layout)")
        actions = np.empty(len(batch), dtype=np.int64)
        picks = rng.random(len(batch))
        for i in range(len(batch)):
            seat = int(batch.seats[i])
            if batch.histories is not None:
                board = board_from_history(tuple(batch.histories[i]))
            else:
                board = board_from_observation(batch.obs[i], seat, self.obs_layout)
            mover_seat = 0 if board.count(CROSS) == board.count(NOUGHT) else 1
            solved = self.solution.get(board)
            if solved is None or not solved.best_moves or mover_seat != seat:
                raise ValueError(f"row {i}: seat {seat} is not to move in a live tic-tac-toe position {board}")
            actions[i] = solved.best_moves[int(picks[i] * len(solved.best_moves))]
        return zero_output(actions)


# ------------------------------------------------------------------------------------- scripted

ScriptFn = Callable[[np.ndarray, np.ndarray, int, "tuple[int, ...] | None", np.random.Generator], int]
"""fn(obs_row, mask_row, seat, history or None, rng) -> action."""


class ScriptedBot:
    """Any function of one decision point, as a Policy (rows are answered one by one).

    Set `needs_history` when `fn` reads the history (callers then provide ActBatch.histories).
    """

    def __init__(self, fn: ScriptFn, needs_history: bool = False, name: str = "scripted"):
        self.fn = fn
        self.needs_history = needs_history
        self.name = name

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        actions = np.empty(len(batch), dtype=np.int64)
        for i in range(len(batch)):
            history = None if batch.histories is None else tuple(batch.histories[i])
            action = int(self.fn(batch.obs[i], batch.mask[i], int(batch.seats[i]), history, rng))
            if not (0 <= action < batch.mask.shape[1] and batch.mask[i, action]):
                raise BotError(f"scripted bot {self.name!r} chose illegal action {action} "
                               f"(legal: {np.flatnonzero(batch.mask[i]).tolist()})")
            actions[i] = action
        return zero_output(actions)


# ------------------------------------------------------------------------------------- by name

BOT_NAMES = ("random", "mcts", "mcts-N", "mcts(simulations=N,uct_c=C,rollouts=R,seed=S,solve=B,compiled=B)",
             "perfect")
_BOT_RE = re.compile(r"^(?P<name>[a-z_]+)(?:-(?P<count>\d+))?(?:\((?P<params>[^()]*)\))?$")


def _bot_params(text: str, bot_name: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not key.isidentifier():
            raise BotError(f"bad parameter {part!r} in bot {bot_name!r}: use name(key=value,...)")
        if value in ("true", "True", "false", "False"):
            params[key] = value in ("true", "True")
            continue
        try:
            params[key] = int(value)
        except ValueError:
            try:
                params[key] = float(value)
            except ValueError:
                raise BotError(f"parameter {key!r} of bot {bot_name!r} must be a number, got {value!r}") from None
    return params


NEGOTIATOR_BOT_NAMES = ("negotiator-fair", "negotiator-tough", "negotiator-soft", "random-split")
"""Scripted negotiators (agents/bots/scripted_negotiator.py), for the `negotiation` game only."""


def _negotiator_bot(name: str, spec: GameSpec) -> Policy:
    from dataclasses import replace

    from ludus.agents.bots.scripted_negotiator import (GREEDY_FAIR, SOFT, TOUGH, GreedyFairNegotiator,
                                            RandomSplitNegotiator)
    from ludus.games import registry

    if spec.id != "negotiation" and not spec.id.startswith("negotiation("):
        raise BotError(f"bot {name!r} plays the negotiation game only, not {spec.id!r}: use 'random'")
    if name == "random-split":
        return RandomSplitNegotiator()
    # The bot must know which utterance is the last one (it accepts more readily there).
    max_utterances = registry.make(spec.id).rules.max_utterances
    behaviour = GREEDY_FAIR if name == "negotiator-fair" else TOUGH if name == "negotiator-tough" else SOFT
    return GreedyFairNegotiator(replace(behaviour, max_utterances=max_utterances))


BOT_PREFIX = "bot:"
"""The one spelling of a bot wherever a policy is named: ``bot:NAME`` (the bare name works too)."""


def make_bot(name: str, spec: GameSpec) -> Policy:
    """A bot from its name: 'random', 'mcts', 'mcts-100', 'mcts(simulations=100,uct_c=1.4)', 'perfect';
    for the negotiation game also 'negotiator-fair', 'negotiator-tough', 'negotiator-soft', 'random-split'.
    Every name may be spelled with the ``bot:`` prefix the arena uses (``bot:perfect``)."""
    if name.strip().startswith(BOT_PREFIX):
        name = name.strip()[len(BOT_PREFIX):]
    if name.strip() in NEGOTIATOR_BOT_NAMES:
        return _negotiator_bot(name.strip(), spec)
    match = _BOT_RE.match(name.strip())
    if not match:
        raise BotError(f"malformed bot name {name!r}: use one of {', '.join(BOT_NAMES)}")
    kind, count, params_text = match.group("name"), match.group("count"), match.group("params")
    params = _bot_params(params_text or "", name)
    if kind == "mcts":
        if count is not None:
            if "simulations" in params:
                raise BotError(f"bot {name!r} gives the simulations twice")
            params["simulations"] = int(count)
        allowed = {"simulations", "uct_c", "rollouts", "seed", "solve", "compiled"}
        if set(params) - allowed:
            raise BotError(f"unknown parameter(s) {sorted(set(params) - allowed)} of bot 'mcts': "
                           f"use {', '.join(sorted(allowed))}")
        if spec.spiel_name is None:
            raise BotError(f"bot 'mcts' needs a game with an OpenSpiel equivalent; {spec.id!r} has none "
                           f"(spec.spiel_name): use 'random'")
        return MCTSBot(spec.spiel_name, **params)
    if count is not None or params:
        raise BotError(f"bot {kind!r} takes no parameters (got {name!r})")
    if kind == "random":
        return RandomBot()
    if kind == "perfect":
        if spec.spiel_name != "tic_tac_toe":
            raise BotError(f"bot 'perfect' plays tic-tac-toe only, not {spec.id!r}: use 'mcts' or 'random'")
        return PerfectTicTacToe()
    raise BotError(f"unknown bot {kind!r}: use one of {', '.join(BOT_NAMES)}")
