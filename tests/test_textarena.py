"""TextArena games through the game protocol (games/adapters/textarena.py): `check_game` runs over the
listed ``ta:`` ids in tests/test_check_game.py; here, what is particular to the adapter."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ludus.games import registry
from ludus.games.check import check_game
from ludus.games.core import GameError
from ludus.games.text import check_text_view, parse_response, text_view
from ludus.games.adapters.textarena import decode_text, encode_text, speakers_as_names

TTT, KUHN = "ta:TicTacToe-v0", "ta:KuhnPoker-v0"


def _random_game(game, seed: int) -> tuple[tuple[int, ...], list[bytes]]:
    rng = np.random.default_rng(seed)
    game.reset(seed)
    seen = []
    while game.to_move():
        seat = game.to_move()[0]
        seen.append(game.observation(seat).tobytes())
        game.step({seat: int(rng.choice(np.flatnonzero(game.legal_mask(seat))))})
    return game.history(), seen


def test_games_stepped_side_by_side_draw_from_their_own_seeds():
    # TextArena deals from Python's global random: each game keeps its own stream, so games
    # interleaved step by step play exactly as they play alone, and the caller's stream is untouched
    alone = [_random_game(registry.make(KUHN), seed) for seed in (1, 2)]
    random.seed(123)
    outside = random.getstate()
    a, b = registry.make(KUHN), registry.make(KUHN)
    a.reset(1), b.reset(2)
    rngs = [np.random.default_rng(1), np.random.default_rng(2)]
    seen = [[], []]
    while a.to_move() or b.to_move():
        for i, game in enumerate((a, b)):
            if game.to_move():
                seat = game.to_move()[0]
                seen[i].append(game.observation(seat).tobytes())
                game.step({seat: int(rngs[i].choice(np.flatnonzero(game.legal_mask(seat))))})
    assert [(a.history(), seen[0]), (b.history(), seen[1])] == alone
    assert random.getstate() == outside


def test_the_legal_mask_is_textarenas_rule():
    game = registry.make(KUHN)
    game.reset(0)
    seat = game.to_move()[0]
    assert game.legal_mask(seat).tolist() == [True, True, False, False]  # check, bet; nothing to call
    game.step({seat: 1})  # bet
    assert game.legal_mask(game.to_move()[0]).tolist() == [False, False, True, True]  # call or fold
    with pytest.raises(GameError, match="not legal"):
        game.step({game.to_move()[0]: 0})
    ttt = registry.make(TTT)
    ttt.reset(0)
    ttt.step({ttt.to_move()[0]: 4})
    assert not ttt.legal_mask(ttt.to_move()[0])[4] and ttt.legal_mask(ttt.to_move()[0]).sum() == 8


def test_the_lm_reads_textarenas_own_text_and_answers_in_its_words():
    game = registry.make(KUHN)
    game.reset(3)
    seat = game.to_move()[0]
    obs, mask = game.observation(seat), game.legal_mask(seat)
    view = text_view(KUHN)
    prompt = view.state(obs, seat, mask)
    assert "Kuhn Poker" in prompt and "Your card is:" in prompt and prompt.endswith("Your legal moves: [check] [bet]")
    assert parse_response(view, "I think... [Bet]", obs, seat, mask).action == 1
    assert parse_response(view, "[call]", obs, seat, mask).problem == "illegal answer"
    for game_id in (TTT, KUHN, "ta:ConnectFour-v0"):
        check_text_view(text_view(game_id), registry.make(game_id), seeds=range(3))


def test_long_texts_keep_their_head_and_tail():
    text = "RULES " + "é" * 3000 + " LATEST"
    obs = encode_text(text, 1024)
    assert obs.shape == (1024,) and obs.dtype == np.uint8
    back = decode_text(obs)
    assert back.startswith("RULES ") and back.endswith(" LATEST") and "[...]" in back
    assert decode_text(encode_text("short", 256)) == "short"
    game = registry.make("ta:TicTacToe-v0(max_bytes=512)")
    assert game.spec.id == "ta:TicTacToe-v0(max_bytes=512)" and game.spec.observation_shape == (512,)
    check_game(game.spec.id, num_games=3)  # the id with its parameter rebuilds the same game


def test_the_prompt_writes_speaker_tags_as_names_and_keeps_the_moves_in_brackets():
    # A small model copies the first bracketed word it reads ([GAME]); the prompt names the
    # speakers instead, while the game's own text (what nets, bots and the arena read) is unchanged.
    game = registry.make("ta:Nim-v0")
    game.reset(3)
    game.step_text({0: "[0 1]"})
    seat = game.to_move()[0]
    obs, mask = game.observation(seat), game.legal_mask(seat)
    raw = decode_text(obs)
    assert raw.count("[GAME]") >= 2 and "[Player 0] [0 1]" in raw
    prompt = text_view("ta:Nim-v0").state(obs, seat, mask)
    assert "[GAME]" not in prompt and "[Player 0]" not in prompt
    assert "GAME: Welcome to Nim" in prompt and "Player 0: [0 1]" in prompt and "'[0 3]'" in prompt
    assert speakers_as_names("[Commander Alpha] [A4 B2 C2]\n[0 3] is a move") == \
        "Commander Alpha: [A4 B2 C2]\n[0 3] is a move"


@pytest.mark.parametrize("game_id, message", [
    ("ta:Taboo-v0", "not a two-player game"),
    ("ta:Chess-v0", "does not parse on this Python"),
    ("ta:Debate-v0", "remote LLM"),
    ("ta:SimpleNegotiation-v0(max_steps=0)", "max_steps must be"),
    ("ta:TicTacTo-v0", "did you mean ta:TicTacToe-v0"),
    ("ta:TicTacToe-v0(max_bytes=10)", "max_bytes must be"),
    ("ta:TicTacToe-v0(depth=2)", "unknown parameter"),
])
def test_bad_ids_are_one_line_errors(game_id, message):
    with pytest.raises(GameError, match=message) as error:
        registry.make(game_id)
    assert "\n" not in str(error.value)
