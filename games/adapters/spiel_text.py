"""A generic text view of small OpenSpiel games, told in OpenSpiel's own words.

Games with a hand-written view (games/text.py: Kuhn poker) keep it; every other ``spiel:`` game
small enough to walk gets this one (the ``spiel`` adapter record's `text_view` hook): the seat is
shown pyspiel's `information_state_string(seat)` (its `observation_string(seat)` for a game read
through ``[observation]`` tensors, or when the game writes no information-state string), and the
legal answers are pyspiel's `state.action_to_string(seat, action)`, lower case, with bracketed
tags such as goofspiel's "[P0]" taken out ("[P0]Bid: 3" -> ``[bid: 3]``); when those are not
distinct plain words the action ids are the answers.

A text view is a function of (observation tensor, seat, legal mask) (games/text.py), and pyspiel
cannot turn a tensor back into a state, so the view walks the game tree once when it is built and
keeps, for each (seat, tensor) a seat can be shown, the string and the answers. That is exact
where the tensor determines the string (perfect-recall information-state tensors do; the view
checks it for every state and refuses a game where it does not) and it bounds the view to games
of at most `MAX_HISTORIES` histories (Leduc poker 9,457; goofspiel with 4 cards 19,269; Liar's
Dice with one die each 294,883): the games whose LM policies exact exploitability can score
(agents/solvers/exploitability.py). Larger games say so in one line.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ludus.games.core import GameError

MAX_HISTORIES = 400_000
"""Largest game tree (histories, chance and terminal nodes included) the generic view walks."""

_TAG = re.compile(r"\[[^\[\]]*\]")


@dataclass(frozen=True)
class SeatView:
    """What one seat is told at one of its information states."""

    text: str
    """OpenSpiel's string of the seat's information (or observation)."""
    answers: tuple[tuple[str, int], ...]
    """(answer, action) for every legal action, in increasing action order."""


@dataclass(frozen=True)
class SpielTextView:
    """The generic text view of one ``spiel:`` game (see the module docstring); build it with
    `spiel_text_view`, which walks the tree."""

    game_id: str
    title: str
    long_name: str
    num_players: int
    string_kind: str
    """"information state" or "observation": which of pyspiel's strings the seat is shown."""
    table: Mapping[tuple[int, bytes], SeatView]
    """(seat, float32 tensor bytes) -> what the seat is told there."""
    example: str
    """One answer of the game, for the rules."""

    def rules(self) -> str:
        return (f"You are playing {self.long_name}, a {self.num_players}-player game. Each turn you are shown "
                f"your {self.string_kind} as the game engine OpenSpiel writes it, and your legal actions. "
                f"Answer with one legal action in square brackets, for example [{self.example}].")

    def role(self, seat: int) -> str:
        return f"You are Player {seat}."

    def seat_view(self, obs: np.ndarray, seat: int) -> SeatView:
        key = (int(seat), np.asarray(obs, dtype=np.float32).tobytes())
        found = self.table.get(key)
        if found is None:
            raise GameError(f"{self.game_id}: seat {seat} is never shown this observation (the text view reads "
                            f"the tensors of {self.game_id} as SpielGame gives them)")
        return found

    def state(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> str:
        legal = " ".join(f"[{answer}]" for answer, _ in self._legal(obs, seat, mask))
        return f"Your {self.string_kind}:\n{self.seat_view(obs, seat).text.strip()}\nYour legal actions: {legal}"

    def _legal(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> list[tuple[str, int]]:
        mask = np.asarray(mask, dtype=bool)
        return [(answer, action) for answer, action in self.seat_view(obs, seat).answers
                if action < len(mask) and mask[action]]

    def answers(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> dict[str, int]:
        return dict(self._legal(obs, seat, mask))

    def normal_form(self, answer: str) -> str:
        return answer


def answer_words(names: Mapping[int, str]) -> dict[int, str]:
    """Answers for actions named by pyspiel: each name lower case, bracketed tags taken out, runs of
    spaces as one; the action ids themselves when these are not distinct, non-empty and free of
    brackets and line breaks."""
    words = {a: " ".join(_TAG.sub(" ", name).lower().split()) for a, name in names.items()}
    plain = all(w and not set(w) & set("[]\n") for w in words.values())
    if plain and len(set(words.values())) == len(words):
        return words
    return {a: str(a) for a in names}


def _count_histories(game, limit: int) -> int:
    """Histories of the game tree (chance and terminal nodes included), counting stops past `limit`."""
    stack, count = [game.new_initial_state()], 0
    while stack and count <= limit:
        state = stack.pop()
        count += 1
        if not state.is_terminal():
            stack.extend(state.child(a) for a in ([a for a, _ in state.chance_outcomes()] if state.is_chance_node()
                                                  else state.legal_actions()))
    return count


@functools.lru_cache(maxsize=16)
def spiel_text_view(text: str) -> SpielTextView:
    """The generic view of ``spiel:<text>`` (the ``spiel`` adapter record's `text_view` hook),
    built once per id by walking the game tree; a one-line GameError for a game it cannot tell."""
    import pyspiel

    from ludus.games.adapters.spiel import load_spiel_game, observation_kind, observation_shape, parse_spiel_id

    parsed = parse_spiel_id(text)
    game = load_spiel_game(parsed.game_string)
    game_id = f"spiel:{text.strip()}"
    game_type = game.get_type()
    kind = observation_kind(game, parsed.kind)
    if kind == "information_state" and game_type.provides_information_state_string:
        string_kind, read = "information state", lambda state, seat: state.information_state_string(seat)
    elif game_type.provides_observation_string:
        string_kind, read = "observation", lambda state, seat: state.observation_string(seat)
    else:
        raise GameError(f"{game_id} writes no {kind.replace('_', '-')} string, so it has no generic text view")
    if _count_histories(game, MAX_HISTORIES) > MAX_HISTORIES:  # counted first: pyspiel alone, no strings
        raise GameError(f"{game_id} has more than {MAX_HISTORIES:,} histories, too many for the generic text "
                        f"view (it walks the game tree once to read OpenSpiel's strings): pick a smaller game")
    shape = observation_shape(game, kind)
    tensor = ((lambda s, p: s.observation_tensor(p)) if kind == "observation"
              else (lambda s, p: s.information_state_tensor(p)))
    table: dict[tuple[int, bytes], SeatView] = {}
    stack = [game.new_initial_state()]
    while stack:
        state = stack.pop()
        if state.is_terminal():
            continue
        if state.is_chance_node():
            stack.extend(state.child(a) for a, _ in state.chance_outcomes())
            continue
        if state.is_simultaneous_node():
            seats = [p for p in range(game.num_players()) if state.legal_actions(p)]
            stack.extend(state.child(a) for a in state.legal_actions())  # joint actions (flattened)
        else:
            seats = [state.current_player()]
            stack.extend(state.child(a) for a in state.legal_actions())
        for seat in seats:
            key = (seat, np.asarray(tensor(state, seat), dtype=np.float32).reshape(shape).tobytes())
            names = {a: state.action_to_string(seat, a) for a in state.legal_actions(seat)}
            words = answer_words(names)
            seen = SeatView(read(state, seat), tuple((words[a], a) for a in sorted(words)))
            before = table.setdefault(key, seen)
            if before != seen:
                raise GameError(f"{game_id}: one {kind.replace('_', '-')} tensor of seat {seat} stands for different "
                                f"OpenSpiel strings ({before.text!r:.60} and {seen.text!r:.60}), so no text view can "
                                f"be read from it; use the other tensor ([information_state] or [observation])")
    if not table:
        raise GameError(f"{game_id} has no decisions to tell")
    example = next(iter(table.values())).answers[0][0]
    return SpielTextView(game_id=game_id, title=game_type.long_name, long_name=game_type.long_name,
                         num_players=game.num_players(), string_kind=string_kind, table=table, example=example)
