"""Text views: games told in plain English, a turn's action one whole response.

A text view turns what a seat observes (its observation tensor, never more) into words, and a
response back into one of the game's actions. The game itself is unchanged, so a language model
and a net, MCTS or a scripted bot meet in the same league and arena: only the text agent reads
the view. Views are pure functions of (observation, seat, legal mask), so a learner can render
the same prompt again from a recorded row.

Answers follow the convention of TextArena and SPIRAL (Liu et al. 2025, arXiv 2506.24119): the
move goes in square brackets, e.g. ``[4]`` or ``[bet]``, and a response may think aloud first;
the last bracketed answer counts (the first, when the response was opened with "[" for the LM). `parse_response` says why a response does not count (no
answer, unknown answer, illegal answer), so the caller can record the outcome it was configured
with (agents/lm/text_policy.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

import numpy as np

from ludus.games.core import GameError

_ANSWER = re.compile(r"\[([^\[\]\n]{1,80})\]")


class TextView(Protocol):
    """A game told in words to one seat."""

    game_id: str
    """The registry id of the game this view tells."""
    title: str
    """The game's name as people say it ("tic-tac-toe")."""

    def rules(self) -> str:
        """The rules and the answer format: the same for every seat and every turn (a shared
        prompt prefix, read once per batch)."""
        ...

    def role(self, seat: int) -> str:
        """Who `seat` is ("You play X and move first.")."""
        ...

    def state(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> str:
        """The position as `seat` sees it now, ending with the legal answers."""
        ...

    def answers(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> Mapping[str, int]:
        """Every accepted answer (lower case, without brackets) to its legal action id; the first
        answer given for an action is its canonical spelling."""
        ...

    def normal_form(self, answer: str) -> str:
        """`answer` (lower case, without brackets) in the spelling `answers` uses, for games whose
        answers can be said many ways ("1 book and 2 hats" for "propose: 1 book, 2 hats, 0 balls");
        views with a fixed vocabulary return it unchanged."""
        ...


@dataclass(frozen=True)
class ParsedResponse:
    """What a response means in the game."""

    action: int | None
    """The legal action it names; None when it names none."""
    problem: str = ""
    """Why it does not count: 'no answer', 'unknown answer' or 'illegal answer' ('' when it does)."""
    answer: str = ""
    """The bracketed answer it gave (the last one), lower case."""


def normal_answer(text: str) -> str:
    """An answer as the parser compares it with the view's answers: lower case, runs of spaces as one."""
    return " ".join(text.lower().split())


def parse_response(view: TextView, response: str, obs: np.ndarray, seat: int, mask: np.ndarray,
                   last: bool = True, pattern: "re.Pattern[str] | None" = None) -> ParsedResponse:
    """The action of `response`: its last answer (the first with `last=False`: a response that
    was opened with "[" for the LM answers first), looked up in the view's answers. `pattern`: how
    an answer is written, a regex whose first group is the answer (default: in square brackets)."""
    view, obs, mask = told(view, obs, mask)
    found = (pattern or _ANSWER).findall(response)
    if not found:
        return ParsedResponse(None, "no answer")
    answer = found[-1 if last else 0]
    answer = view.normal_form(normal_answer(answer[0] if isinstance(answer, tuple) else answer))
    accepted = view.answers(obs, seat, mask)
    if answer in accepted:
        return ParsedResponse(accepted[answer], "", answer)
    return ParsedResponse(None, "illegal answer" if answer in view.answers(obs, seat, np.ones_like(mask))
                          else "unknown answer", answer)


def answer_pattern(text: str) -> "re.Pattern[str]":
    """`text` compiled as an answer pattern (a regex with one group, the answer), or GameError."""
    try:
        compiled = re.compile(text)
    except re.error as exc:
        raise GameError(f"answer pattern {text!r} is not a regular expression ({exc})") from None
    if compiled.groups != 1:
        raise GameError(f"answer pattern {text!r} must have exactly one group (the answer), has {compiled.groups}")
    return compiled


def told(view: TextView, obs: np.ndarray, mask: np.ndarray) -> tuple[TextView, np.ndarray, np.ndarray]:
    """The view that tells `obs`, with the observation and mask as that view reads them: `view`
    itself, or for a view of several games (games/mix.py `MixTextView.part`) the view of the game
    `obs` belongs to, so an agent reads the very prompt that game alone would give it."""
    part = getattr(view, "part", None)
    return part(obs, mask) if part is not None else (view, obs, mask)


def is_free_text(view: TextView, obs: np.ndarray | None = None, mask: np.ndarray | None = None) -> bool:
    """True when `view` (at `obs`, for a view of several games) lists no answers: a response's
    answer is the move, judged by the game."""
    if obs is not None:
        view = told(view, obs, np.ones(1, dtype=bool) if mask is None else mask)[0]
    return bool(getattr(view, "free_text", False))


def canonical_answer(view: TextView, obs: np.ndarray, seat: int, mask: np.ndarray, action: int) -> str:
    """The canonical spelling of a legal action ("[4]"): what a scripted text agent would say."""
    view, obs, mask = told(view, obs, mask)
    for answer, a in view.answers(obs, seat, mask).items():
        if a == action:
            return f"[{answer}]"
    raise GameError(f"action {action} is not legal here")


# ------------------------------------------------------------------------------ board games


@dataclass(frozen=True)
class MNKTextView:
    """Tic-tac-toe and connect four (games/builtin/native.py observation planes: own, opponent, empty)."""

    game_id: str
    title: str
    rows: int
    cols: int
    k: int
    gravity: bool

    def rules(self) -> str:
        if self.gravity:
            board = (f"The board has {self.rows} rows and {self.cols} columns. A move names a column "
                     f"0-{self.cols - 1}; the stone falls to the lowest empty cell of that column.")
        else:
            board = (f"The board has {self.rows * self.cols} cells numbered 0-{self.rows * self.cols - 1}, "
                     f"row by row from the top left. A move names an empty cell.")
        return (f"You are playing {self.title}. Two players, X and O, take turns placing their mark. {board} "
                f"The first to get {self.k} marks in a row (across, down or diagonally) wins; a full board "
                f"without a line is a draw. Answer with your move in square brackets, for example [{self._example()}].")

    def _example(self) -> int:
        return self.cols // 2 if self.gravity else (self.rows * self.cols) // 2

    def role(self, seat: int) -> str:
        return "You play X and move first." if seat == 0 else "You play O and move second."

    def state(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> str:
        own, other = ("X", "O") if seat == 0 else ("O", "X")
        planes = np.asarray(obs).reshape(3, self.rows, self.cols)
        lines = []
        # gravity boards store row 0 at the bottom: print the top row first
        order = range(self.rows - 1, -1, -1) if self.gravity else range(self.rows)
        for r in order:
            cells = []
            for c in range(self.cols):
                if planes[0, r, c] > 0.5:
                    cells.append(own)
                elif planes[1, r, c] > 0.5:
                    cells.append(other)
                else:
                    cells.append("." if self.gravity else str(r * self.cols + c))
            lines.append(" ".join(cells))
        if self.gravity:
            lines.append(" ".join(str(c) for c in range(self.cols)))
        legal = " ".join(f"[{a}]" for a in np.flatnonzero(mask))
        return "Board:\n" + "\n".join(lines) + f"\nYour legal moves: {legal}"

    def answers(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> dict[str, int]:
        return {str(int(a)): int(a) for a in np.flatnonzero(mask)}

    def normal_form(self, answer: str) -> str:
        return answer


# ------------------------------------------------------------------------------- Kuhn poker

_KUHN_CARDS = ("Jack", "Queen", "King")


@dataclass(frozen=True)
class KuhnTextView:
    """Two-player Kuhn poker over OpenSpiel's information-state tensor: [seat one-hot (2), card
    one-hot (3), then per betting round (pass, bet) one-hot (3 rounds)]. Action 0 is pass
    (check or fold), 1 is bet (bet or call), as pyspiel's."""

    game_id: str = "spiel:kuhn_poker"
    title: str = "Kuhn poker"

    def rules(self) -> str:
        return ("You are playing Kuhn poker. The deck has three cards: Jack, Queen and King (King is highest). "
                "Each player antes 1 chip and gets one private card. Player 0 acts first: check or bet 1 chip. "
                "Facing a bet, a player calls (adds 1 chip) or folds (loses the pot). If both check, or a bet "
                "is called, the higher card wins the pot. Answer with one action in square brackets: [check], "
                "[bet], [call] or [fold].")

    def role(self, seat: int) -> str:
        return f"You are Player {seat}."

    def _history(self, obs: np.ndarray) -> list[int]:
        obs = np.asarray(obs, dtype=np.float32).reshape(-1)
        if obs.shape != (11,):
            raise GameError(f"the Kuhn text view reads the 11-entry information-state tensor of "
                            f"spiel:kuhn_poker, got shape {obs.shape}")
        moves = []
        for r in range(3):
            pair = obs[5 + 2 * r: 7 + 2 * r]
            if pair.max() < 0.5:
                break
            moves.append(int(pair.argmax()))
        return moves

    def _facing_bet(self, obs: np.ndarray) -> bool:
        return 1 in self._history(obs)

    def state(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> str:
        card = _KUHN_CARDS[int(np.asarray(obs).reshape(-1)[2:5].argmax())]
        said = []
        for i, move in enumerate(self._history(obs)):
            player = i % 2
            facing = i > 0 and 1 in self._history(obs)[:i]
            word = ("calls" if facing else "bets") if move == 1 else ("folds" if facing else "checks")
            said.append(f"Player {player} {word}.")
        history = " ".join(said) if said else "No actions yet."
        legal = " ".join(f"[{word}]" for word in self.answers(obs, seat, mask))
        return f"Your card: {card}. So far: {history} Your legal actions: {legal}"

    def answers(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> dict[str, int]:
        words = ("fold", "call") if self._facing_bet(obs) else ("check", "bet")
        return {words[a]: a for a in (0, 1) if mask[a]}

    def normal_form(self, answer: str) -> str:
        return answer


# ------------------------------------------------------------------------------ negotiation


@dataclass(frozen=True)
class NegotiationTextView:
    """The negotiation in plain English, one utterance per turn (games/builtin/negotiation_turns.py):
    "[propose: 2 books, 1 hat, 0 balls]" asks for those items, "[accept]" takes the partner's
    standing proposal. The seat sees the pool, its own values and what was said, never the
    partner's values."""

    game_id: str = "negotiation_turns"
    title: str = "the negotiation game"

    def rules(self) -> str:
        return ("You are negotiating with another player over a pool of books, hats and balls. Each of you "
                "values the items differently and knows only your own values. Take turns: either propose a "
                "split by saying which items you want (the other player gets the rest), or accept the other "
                "player's last proposal. If a proposal is accepted, each of you scores the value of the items "
                "you get; if no proposal is accepted in time, both score 0. Answer in square brackets: "
                "[propose: 2 books, 1 hat, 0 balls] asks for 2 books, 1 hat and no balls; [accept] accepts "
                "the other player's proposal.")

    def role(self, seat: int) -> str:
        return "You speak first." if seat == 0 else "The other player speaks first."

    @staticmethod
    def _read(obs: np.ndarray):
        from ludus.games.builtin.negotiation import NUM_ITEM_TYPES
        from ludus.games.builtin.negotiation_turns import CONTEXT_WIDTH, ROW_WIDTH

        obs = np.asarray(obs, dtype=np.float32).reshape(-1)
        if obs.size < CONTEXT_WIDTH + ROW_WIDTH or (obs.size - CONTEXT_WIDTH) % ROW_WIDTH:
            raise GameError(f"the negotiation text view reads negotiation_turns observations, got shape {obs.shape}")
        counts = obs[:NUM_ITEM_TYPES].astype(int)
        values = obs[NUM_ITEM_TYPES:CONTEXT_WIDTH].astype(int)
        rows = obs[CONTEXT_WIDTH:].reshape(-1, ROW_WIDTH)
        said = [(bool(r[0] > 0), bool(r[1] > 0.5), tuple(int(n) for n in r[2:])) for r in rows if r[0] != 0]
        return counts, values, said, len(rows)

    def state(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> str:
        from ludus.games.builtin.negotiation import ITEMS
        from ludus.games.builtin.negotiation_turns import DEAL, spell_items

        counts, values, said, limit = self._read(obs)
        worth = ", ".join(f"a {item} {v}" for item, v in zip(ITEMS, values))
        lines = [f"Items on the table: {spell_items(counts)}. What each item is worth to you: {worth} "
                 f"(the whole pool is worth 10 to you)."]
        for mine, deal, want in said:
            who = "You" if mine else "The other player"
            lines.append(f"{who}: " + ("I accept." if deal else f"I propose: {spell_items(want)} for me."))
        if not said:
            lines.append("Nothing has been said yet.")
        lines.append(f"This is turn {len(said) + 1} of {limit}; if no proposal is accepted by then, both score 0.")
        options = []
        if mask[DEAL]:
            want = said[-1][2]
            get = [c - w for c, w in zip(counts, want)]
            options.append(f"[accept] (you would get {spell_items(get)}, worth {int(np.dot(get, values))} to you)")
        limits = ", ".join(f"{item}s 0-{c}" for item, c in zip(ITEMS, counts))
        options.append(f"a proposal such as [propose: {spell_items(np.minimum(counts, 1))}] asking for at most "
                       f"what is on the table ({limits})")
        lines.append("Your legal answers: " + " or ".join(options))
        return "\n".join(lines)

    def answers(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> dict[str, int]:
        from ludus.games.builtin.negotiation_turns import DEAL, PROPOSALS, spell_items

        accepted: dict[str, int] = {}
        for a in np.flatnonzero(mask):
            if a == DEAL:
                accepted.update({"accept": DEAL, "deal": DEAL})
            else:
                accepted[f"propose: {spell_items(PROPOSALS[a - 1])}"] = int(a)
        return accepted

    def normal_form(self, answer: str) -> str:
        """Any answer naming item counts is a proposal of those counts, the items it does not name
        being 0 ("propose 2 books and 1 hat for me", "i want 1 books"); "i accept", "deal" and
        "accept" accept. An item named twice is no proposal."""
        from ludus.games.builtin.negotiation import ITEMS
        from ludus.games.builtin.negotiation_turns import spell_items

        if answer in ("accept", "i accept", "deal", "accept deal", "i accept the deal"):
            return "accept"
        found = _ITEM_COUNTS.findall(answer)
        if not found or len({item for _, item in found}) < len(found):
            return answer
        counts = dict.fromkeys(ITEMS, 0)
        for number, item in found:
            counts[item] = int(number)
        return f"propose: {spell_items([counts[item] for item in ITEMS])}"


_ITEM_COUNTS = re.compile(r"(\d+)\s*(book|hat|ball)(?:e?s)?\b")


# ----------------------------------------------------------------------------------- registry

TEXT_VIEWS: dict[str, Callable[[], TextView]] = {
    "tic_tac_toe": lambda: MNKTextView("tic_tac_toe", "tic-tac-toe", 3, 3, 3, gravity=False),
    "connect_four": lambda: MNKTextView("connect_four", "connect four", 6, 7, 4, gravity=True),
    "spiel:kuhn_poker": KuhnTextView,
    "negotiation_turns": NegotiationTextView,
}
"""Ludus's own games with a text view, by registry id; every game of an adapter with a `text_view`
hook (``ta:``) has one as well."""


def _adapter_view(game_id: str):
    """The `text_view` hook of `game_id`'s adapter (``ta:`` games have one), None if it has none."""
    from ludus.games.core import GameError
    from ludus.games.registry import adapter_for

    try:
        adapter = adapter_for(game_id)
    except GameError:  # an empty id or an unknown prefix: no view
        return None
    return None if adapter is None else adapter.text_view


def has_text_view(game_id: str) -> bool:
    if game_id in TEXT_VIEWS or (hook := _adapter_view(game_id)) is None:
        return game_id in TEXT_VIEWS
    try:  # an adapter may tell only some of its games (``spiel:``: small ones, games/adapters/spiel_text.py)
        return hook(game_id.partition(":")[2]) is not None
    except GameError:
        return False


def text_view(game_id: str) -> TextView:
    """The text view of `game_id`; a one-line error naming the games that have one."""
    hook = None if game_id in TEXT_VIEWS else _adapter_view(game_id)
    if hook is not None:
        return hook(game_id.partition(":")[2])
    if game_id not in TEXT_VIEWS:
        from ludus.games.registry import ADAPTERS

        others = "".join(f" and {a.reaches}'s ({a.form})" for a in ADAPTERS.values() if a.text_view is not None)
        raise GameError(f"game {game_id!r} has no text view; games with one: {', '.join(sorted(TEXT_VIEWS))}"
                        f"{others}")
    return TEXT_VIEWS[game_id]()


def check_text_view(view: TextView, game, seeds=range(8), max_steps: int = 200) -> None:
    """Conformance: on random play of `game` (a `Game` of `view.game_id`), every state renders,
    every legal action has an answer that parses back to it, and no illegal action is accepted."""
    rng = np.random.default_rng(0)
    for seed in seeds:
        game.reset(int(seed))
        for _ in range(max_steps):
            movers = game.to_move()
            if not movers:
                break
            actions = {}
            for seat in movers:
                obs, mask = game.observation(seat), game.legal_mask(seat)
                text = view.state(obs, seat, mask)
                if not text:
                    raise GameError(f"{view.game_id}: empty state text for seat {seat}")
                legal = np.flatnonzero(mask)
                answers = view.answers(obs, seat, mask)
                if sorted(set(answers.values())) != legal.tolist():
                    raise GameError(f"{view.game_id}: answers {answers} do not cover the legal actions {legal}")
                for a in legal:
                    parsed = parse_response(view, f"I choose {canonical_answer(view, obs, seat, mask, int(a))}.",
                                            obs, seat, mask)
                    if parsed.action != a:
                        raise GameError(f"{view.game_id}: the answer for action {a} parses to {parsed}")
                actions[seat] = int(rng.choice(legal))
            game.step(actions)
