"""A person plays any registered game in the terminal against a bot or a snapshot.

The board is drawn with `Game.render()`, the legal action numbers are listed, and the person
types one. A game with a text view (games/text.py: tic-tac-toe, connect four, Kuhn poker) is told
to the person as a language model reads it: the seat's own view only (Kuhn poker does not show the
opponent's card), answers typed as words ("bet") or numbers, and what a language-model opponent
wrote. Input and output go through `input_fn`/`print_fn`, so tests drive a whole game with
scripted input. End of input (Ctrl-D) leaves cleanly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ludus.agents.mixture import MixturePolicy
from ludus.agents.policy import ActBatch, Policy
from ludus.games.core import Game, GameSpec, is_over
from ludus.games.text import TextView, canonical_answer, has_text_view, normal_answer, text_view
from ludus.errors import UserError


class PlayError(UserError, ValueError):
    """A bad `ludus play` request (seat, opponent)."""


@dataclass(frozen=True)
class PlayResult:
    """How a terminal game ended."""

    finished: bool
    """False when the person left (end of input) before the game was over."""
    returns: tuple[float, ...]
    """Returns per seat (so far, if not finished)."""
    history: tuple[int, ...]
    """Actions applied, in order."""
    human_seat: int


def resolve_opponent(text: str, spec: GameSpec) -> Policy:
    """`--against`: a league run directory plays its output policy (`OUTPUT_POLICY_DIR`, written at
    every population change; its newest main snapshot before that); a mixture directory plays a
    member drawn by weight; another existing directory is a snapshot (it must be of this game;
    "actor_critic" or "lm"); anything else a bot name."""
    if os.path.isdir(text):
        from ludus.agents.mixture import is_mixture, load_mixture_policy, run_checkpoint
        from ludus.agents.snapshot import policy_from_snapshot

        text = run_checkpoint(text)
        if is_mixture(text):
            return load_mixture_policy(text, expect_game=spec.id)
        return policy_from_snapshot(text, expect_game=spec.id)
    from ludus.agents.bots.builtin import make_bot

    return make_bot(text, spec)


def _opponent_action(opponent: Policy, game: Game, seat: int, rng: np.random.Generator) -> int:
    return int(opponent.act(ActBatch.at_seat(game, seat, opponent), rng).actions[0])


def _ask_action(game: Game, seat: int, input_fn: Callable[[str], str], print_fn: Callable[..., None],
                view: TextView | None = None) -> int:
    mask = game.legal_mask(seat)
    legal = np.flatnonzero(mask).tolist()
    # with a text view: its answers ("bet", "[bet]"), then action numbers as everywhere else
    answers = dict(view.answers(game.observation(seat), seat, mask)) if view is not None else {}
    choices = " ".join(answers) if answers else " ".join(str(a) for a in legal)
    if view is None:
        print_fn(f"Legal moves: {choices}")
    while True:
        text = input_fn(f"seat {seat}, your move> ").strip()  # EOFError propagates: the person left
        said = normal_answer(text.strip("[]"))
        said = view.normal_form(said) if view is not None else said
        if said in answers:
            return answers[said]
        try:
            action = int(text)
        except ValueError:
            print_fn(f"{text!r} is not a move; type one of: {choices}")
            continue
        if action not in legal:
            print_fn(f"{action} is not a legal move; type one of: {choices}")
            continue
        return action


def result_words(returns: np.ndarray, seat: int) -> str:
    """A finished game's result as the person at `seat` reads it ("you won (1)"), in the terminal
    and at the web seat (`ludus.agents.human_seat`)."""
    returns = np.asarray(returns, dtype=np.float64)
    mine, others = returns[seat], np.delete(returns, seat)
    if len(others) == 0:
        return f"you scored {mine:g}"
    if mine > others.max():
        return f"you won ({mine:g})"
    if mine < others.max():
        return f"you lost ({mine:g})"
    return f"a draw ({mine:g})"


def _verdict(returns: np.ndarray, seat: int) -> str:
    return f"Game over: {result_words(returns, seat)}."


def play_terminal(game_id: str, opponent: Policy | str, human_seat: int = 0, seed: int = 0,
                  input_fn: Callable[[str], str] = input, print_fn: Callable[..., None] = print) -> PlayResult:
    """Play one game of `game_id` at `human_seat`; `opponent` (a Policy, bot name or snapshot path)
    takes every other seat. `seed` fixes the game's chance and the opponent's sampling."""
    from ludus.games import registry

    game = registry.make(game_id)
    spec = game.spec
    if not 0 <= human_seat < spec.num_players:
        raise PlayError(f"--seat {human_seat} does not exist in {game_id!r}: use 0..{spec.num_players - 1}")
    if isinstance(opponent, str):
        opponent = resolve_opponent(opponent, spec)
    rng = np.random.default_rng(seed)
    game.reset(seed)
    if isinstance(opponent, MixturePolicy):
        print_fn(f"the mixture plays {opponent.start_game(rng)} this game")
    if is_text_game(game):
        return _play_text_dialogue(game, opponent, human_seat, rng, input_fn, print_fn)
    if spec.text_moves:
        return _play_text_moves(game, opponent, human_seat, rng, input_fn, print_fn)
    view = text_view(game_id) if has_text_view(game_id) else None
    print_fn(f"{game_id}: you are seat {human_seat} of {spec.num_players}. "
             f"Type {'an answer or ' if view is not None else ''}a move number; Ctrl-D quits.")
    if view is not None:
        print_fn(view.rules())
    elif not spec.perfect_information:
        # Game.render() draws the whole state; without a text view there is no per-seat view.
        print_fn("Note: this game hides information, but the board below shows everything (no peeking!).")
    try:
        while not is_over(game):
            if view is None:
                print_fn(game.render())
            movers = game.to_move()
            # Opponents choose before the person types, but from the same position (simultaneous moves).
            actions, said = {}, {}
            for seat in (s for s in movers if s != human_seat):
                actions[seat] = _opponent_action(opponent, game, seat, rng)
                move = (canonical_answer(view, game.observation(seat), seat, game.legal_mask(seat), actions[seat])
                        if view is not None else str(actions[seat]))
                turns = getattr(opponent, "last_turns", None)  # a language model: what it wrote
                said[seat] = f'{move} (it wrote "{turns.texts[0]}")' if turns is not None else move
            if human_seat in movers:
                if view is not None:
                    mask = game.legal_mask(human_seat)
                    print_fn(f"{view.role(human_seat)} {view.state(game.observation(human_seat), human_seat, mask)}")
                actions[human_seat] = _ask_action(game, human_seat, input_fn, print_fn, view)
            for seat in sorted(s for s in actions if s != human_seat):
                print_fn(f"seat {seat} plays {said[seat]}")
            game.step(actions)
    except EOFError:
        return _result(game, human_seat, print_fn, finished=False)
    return _result(game, human_seat, print_fn, finished=True)


def _play_text_moves(game, opponent: Policy, human_seat: int, rng: np.random.Generator,
                     input_fn: Callable[[str], str], print_fn: Callable[..., None]) -> PlayResult:
    """A text-move game (`GameSpec.text_moves`, e.g. TextArena's): the person reads what the game
    tells its seat and types moves as text, which the game judges; a language model's whole
    response (its reasoning included) is shown beside the move it played."""
    from ludus.agents.policy import ActBatch

    print_fn(f"{game.spec.id}: you are seat {human_seat}. Type your move as the game asks; Ctrl-D quits.")
    shown = ""
    try:
        while not is_over(game):
            seat = game.to_move()[0]
            if seat == human_seat:
                told = game.text(human_seat)
                print_fn(told[len(shown):].strip() if told.startswith(shown) else told.strip())
                shown = told
                line = input_fn("your move> ")
                game.step_text({seat: line})
                continue
            mask = game.legal_mask(seat)
            out = opponent.act(ActBatch(game.observation(seat)[None], mask[None], np.array([seat])), rng)
            turns = getattr(opponent, "last_turns", None)  # a language model: what it wrote
            if out.texts is not None and out.texts[0] is not None:
                move = out.texts[0]
                game.step_text({seat: move})
            else:
                move = game.move_text(seat, int(out.actions[0]))
                game.step({seat: int(out.actions[0])})
            wrote = f' (it wrote "{turns.texts[0]}")' if turns is not None and turns.texts[0].strip() != move else ""
            print_fn(f"seat {seat} plays {move!r}{wrote}")
    except EOFError:
        return _result(game, human_seat, print_fn, finished=False)
    return _result(game, human_seat, print_fn, finished=True)


# ---------------------------------------------------------------------------------------------
# Token games with a text interface (games/dialogue.py): the person types whole utterances.


def is_text_game(game: Game) -> bool:
    """A token game (int64 observations) that whole-utterance text agents can play
    (`ludus.games.dialogue.TextDialogueGame`: a vocabulary, an utterance cap, `utterance_length`)."""
    return (game.spec.observation_dtype == "int64" and hasattr(game, "vocab")
            and hasattr(game, "max_utterance_tokens") and hasattr(game, "utterance_length"))


def apply_text_turn(game, seat: int, text: str) -> list[int]:
    """Apply a whole turn typed as text: its words, then `<eou>` while the seat still holds the turn
    and may end it (a one-word move such as the signalling receiver's pick ends the turn by itself).

    Checked on a copy first, so a refused turn leaves the game untouched; raises GameError saying why.
    """
    import copy

    from ludus.games.core import GameError
    from ludus.games.dialogue import EOU, encode_utterance

    tokens = encode_utterance(game.vocab, text)
    if not tokens:
        raise GameError("empty utterance: say at least one word")
    if len(tokens) > game.max_utterance_tokens:
        raise GameError(f"utterance has {len(tokens)} words, the game allows at most {game.max_utterance_tokens}: "
                        f"say it shorter")
    if game.utterance_length() != 0:
        raise GameError(f"seat {seat} is in the middle of an utterance")
    eou = game.vocab.id(EOU)
    trial = copy.deepcopy(game)
    applied = []
    for token in tokens:
        if trial.to_move() != (seat,) or not trial.legal_mask(seat)[token]:
            raise GameError(f"word {game.vocab.words[token]!r} is not legal here")
        trial.step({seat: token})
        applied.append(token)
    if trial.to_move() == (seat,) and trial.legal_mask(seat)[eou]:
        applied.append(eou)
    elif trial.to_move() == (seat,):
        raise GameError("the turn is not over after these words: say more")
    for token in applied:
        game.step({seat: token})
    return applied


def _play_text_dialogue(game, opponent: Policy, human_seat: int, rng: np.random.Generator,
                        input_fn: Callable[[str], str], print_fn: Callable[..., None]) -> PlayResult:
    """The person types utterances; the opponent speaks token by token and is shown utterance by
    utterance. The person sees only their own observation (their values, the dialogue so far)."""
    from ludus.games.core import GameError
    from ludus.games.dialogue import EOU, UNK, decode

    speakable = " ".join(w for w, ok in zip(game.vocab.words, game.vocab.speakable_mask)
                         if ok and w not in (EOU, UNK))
    print_fn(f"{game.spec.id}: you are seat {human_seat}. Type a whole utterance (words: {speakable}); "
             f"Ctrl-D quits.")
    try:
        while not is_over(game):
            (seat,) = game.to_move()
            if seat == human_seat:
                print_fn("you see: " + decode(game.vocab, game.observation(human_seat)))
                while True:
                    text = input_fn(f"seat {seat}> ")  # EOFError propagates: the person left
                    try:
                        apply_text_turn(game, seat, text)
                        break
                    except GameError as exc:
                        print_fn(f"{exc}; try again")
                continue
            said = []
            while not is_over(game) and game.to_move() == (seat,):
                token = _opponent_action(opponent, game, seat, rng)
                game.step({seat: token})
                said.append(token)
            print_fn(f"seat {seat} says: {decode(game.vocab, said)}")
    except EOFError:
        return _result(game, human_seat, print_fn, finished=False)
    return _result(game, human_seat, print_fn, finished=True)


def _result(game: Game, human_seat: int, print_fn: Callable[[str], None], finished: bool) -> PlayResult:
    """The game's outcome as the person sees it: the final board and a verdict, or a goodbye."""
    if not finished:
        print_fn("\nBye.")
        return PlayResult(False, tuple(float(r) for r in game.returns()), tuple(game.history()), human_seat)
    returns = np.asarray(game.returns(), dtype=np.float64)
    print_fn(game.render())
    print_fn(_verdict(returns, human_seat) + f" Returns per seat: {' '.join(f'{r:g}' for r in returns)}")
    return PlayResult(True, tuple(float(r) for r in returns), tuple(game.history()), human_seat)
