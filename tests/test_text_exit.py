"""Expert iteration for an LM (agents/lm/text_exit.py, learner 'text_exit'): the search's targets on
positions whose best move is known, the board-to-history rebuild, and the learner on a tiny Llama:
it moves the answers towards the search's and resumes exactly. The learner checker runs over it
with every other kind of the table (tests/test_checkers.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyspiel
import pytest

from ludus.agents.bots.builtin import CROSS, EMPTY, NOUGHT, board_from_history, history_from_board
from ludus.agents.lm.text_exit import BOARD_SYMMETRIES, TextExItConfig, board_image, search_targets, visit_target
from ludus.league.configio import ConfigError


def test_visit_target_sharpens_and_splits_ties():
    np.testing.assert_allclose(visit_target(np.array([5.0, 9.0, 9.0, 0.0]), 0.0), [0.0, 0.5, 0.5, 0.0])
    np.testing.assert_allclose(visit_target(np.array([1.0, 3.0]), 1.0), [0.25, 0.75])
    np.testing.assert_allclose(visit_target(np.array([1.0, 3.0]), 0.5), [0.1, 0.9])
    # counts in the thousands at a small temperature: no overflow, nearly all mass on the most visited
    sharp = visit_target(np.array([2000.0, 1990.0, 0.0]), 0.001)  # (2000/1990) ** 1000 ~ e ** 5
    assert sharp[0] > 0.99 and sharp[2] == 0.0 and np.isclose(sharp.sum(), 1.0)


def test_history_from_board_rebuilds_every_position():
    rng = np.random.default_rng(0)
    for _ in range(200):
        cells = rng.permutation(9)[:rng.integers(0, 10)]
        board = board_from_history(tuple(int(c) for c in cells))
        assert board_from_history(history_from_board(board)) == board
    with pytest.raises(ValueError, match="not a tic-tac-toe position"):
        history_from_board((NOUGHT,) + (EMPTY,) * 8)


@pytest.mark.parametrize("history, best", [
    ((0, 3, 1, 4), 2),        # crosses take the top row
    ((0, 4, 8, 2), 6),        # crosses must block the noughts' diagonal 2-4-6 (and win nothing now)
    ((4, 0, 8, 2), 1),        # noughts win the top row at 1
])
def test_search_targets_pick_the_winning_or_saving_move(history, best):
    game = pyspiel.load_game("tic_tac_toe")
    board = board_from_history(history)
    assert board_from_history(history_from_board(board)) == board and CROSS in board
    targets = search_targets(game, [history_from_board(board)], TextExItConfig(simulations=2000), seeds=[3])
    assert targets.shape == (1, 9) and np.isclose(targets.sum(), 1.0)
    assert int(np.argmax(targets[0])) == best and targets[0, best] == 1.0
    assert np.all(targets[0, list(history)] == 0.0)  # occupied cells get nothing


def test_board_images_carry_the_search_target_over():
    """The 8 symmetries map lines to lines, and a position's image under each has as target the
    search's answer on the image itself: the winning cell of (0, 3, 1, 4) moved with the board."""
    lines = {frozenset(line) for line in ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8),
                                          (0, 4, 8), (2, 4, 6))}
    assert len({tuple(g) for g in BOARD_SYMMETRIES}) == 8 and list(BOARD_SYMMETRIES[0]) == list(range(9))
    for order in BOARD_SYMMETRIES:
        assert sorted(order) == list(range(9))
        assert {frozenset(int(np.flatnonzero(order == c)[0]) for c in line) for line in lines} == lines
    game = pyspiel.load_game("tic_tac_toe")
    board = board_from_history((0, 3, 1, 4))
    planes = np.stack([np.array(board) == v for v in (CROSS, NOUGHT, EMPTY)]).astype(np.float32).reshape(-1)
    mask = np.array(board) == EMPTY
    (target,) = search_targets(game, [history_from_board(board)], TextExItConfig(), seeds=[0])
    assert target[2] == 1.0
    for symmetry in range(8):
        image, image_mask, image_target = board_image(planes, mask, target, symmetry)
        cells = image.reshape(3, 9)
        image_board = tuple(int(c) for c in np.where(cells[0] > 0, CROSS, np.where(cells[1] > 0, NOUGHT, EMPTY)))
        np.testing.assert_array_equal(image_mask, np.array(image_board) == EMPTY)
        (searched,) = search_targets(game, [history_from_board(image_board)], TextExItConfig(), seeds=[1])
        np.testing.assert_array_equal(image_target, searched)
        assert image_board[int(np.argmax(image_target))] == EMPTY
    with pytest.raises(ValueError, match="symmetries"):
        TextExItConfig(symmetries=8)


def test_search_targets_refuse_a_finished_game():
    game = pyspiel.load_game("tic_tac_toe")
    with pytest.raises(ValueError, match="the game is over"):
        search_targets(game, [(0, 3, 1, 4, 2)], TextExItConfig(), seeds=[0])


# ------------------------------------------------------------------------------ the LM learner


def _exit_config(base: Path, *extra: str):
    from ludus.league.api import load_config

    return load_config("llm_tic_tac_toe", [f"text_lm.model.base={base}", "iterations=2", "matches_per_iteration=12",
                                           "num_envs=12", "log.wandb=disabled", "log.tensorboard=false",
                                           "log.progress=false", "text_lm.exit.steps=2", *extra])


@pytest.mark.parametrize("activation_tokens", [0, 4])
def test_exit_moves_the_answers_towards_the_search(tiny_bases, activation_tokens):
    """Twelve steps on one buffer lower its cross-entropy to the searched targets (also with
    activated adapters: only "assistant\\n[" read with gradients)."""
    import torch

    from ludus.agents.lm.text_exit import Position
    from ludus.agents.lm.text_policy import answer_start_tokens
    from ludus.games.registry import spec as game_spec
    from ludus.league.learners.text_lm import TextExItLeagueLearner

    config = _exit_config(tiny_bases[0], "text_lm.exit.steps=12", "text_lm.exit.learning_rate=3e-3",
                          f"text_lm.model.lora.activation_tokens={activation_tokens}")
    learner = TextExItLeagueLearner(game_spec("tic_tac_toe"), config, 0, seed=0, init_seed=1)
    game = pyspiel.load_game("tic_tac_toe")
    rng = np.random.default_rng(1)
    positions = []
    for _ in range(16):
        state = game.new_initial_state()
        for _ in range(rng.integers(0, 5)):
            state.apply_action(int(rng.choice(state.legal_actions())))
        seat = state.current_player()
        obs = np.asarray(state.observation_tensor(seat), dtype=np.float32)
        mask = np.zeros(9, dtype=bool)
        mask[state.legal_actions()] = True
        # the native game's seat-relative planes: own, opponent, empty
        planes = obs.reshape(3, 9)
        own, other = (planes[2], planes[1]) if seat == 0 else (planes[1], planes[2])
        native = np.stack([own, other, planes[0]]).reshape(-1).astype(np.float32)
        prompt = tuple(learner.policy.encode(native, seat, mask))
        groups = answer_start_tokens(learner.lm.tokenizer, learner.view.answers(native, seat, mask))
        responses = tuple((int(learner.lm.tokenizer.convert_tokens_to_ids(str(a))),
                           int(learner.lm.tokenizer.convert_tokens_to_ids("]"))) for a in np.flatnonzero(mask))
        target = np.zeros(int(mask.sum()))
        target[rng.integers(len(target))] = 1.0
        positions.append(Position(prompt, groups, responses, target))
    for position in positions:
        learner.exit.add(position)
    with torch.no_grad():
        before, _, _ = learner.exit.loss(positions)
    stats = learner.exit.update()
    with torch.no_grad():
        after, _, _ = learner.exit.loss(positions)
    assert float(after) < float(before) - 0.05
    assert stats["buffer_positions"] == len({p.prompt for p in positions}) and learner.exit.updates == 1


def test_exit_league_searches_its_positions_and_resumes_exactly(tiny_bases, tmp_path):
    from ludus.league.api import League
    from ludus.league.check import resumed_fingerprint, run_fingerprint

    config = _exit_config(tiny_bases[0], "snapshot_every_steps=10", "text_lm.exit.symmetries=2")
    whole = League.create(config, tmp_path / "whole")
    whole.run()
    members = {m.player_id for m in whole.population.members()}
    assert {"anchor:base", "anchor:random", "main@0"} <= members and len(members) > 3
    buffered = len(whole.learners["main"].impl.exit.buffer)
    whole.close()
    metrics = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    searched = [m["losses/main/searched_positions"] for m in metrics if "losses/main/searched_positions" in m]
    images = [m["losses/main/symmetric_positions"] for m in metrics if "losses/main/symmetric_positions" in m]
    # every position is searched once while it stays in the buffer, and two of its images join it
    assert len(searched) == 2 and searched[0] > 0 and 0 < sum(images) <= 2 * sum(searched)
    assert sum(searched) + sum(images) == buffered
    rows, snapshots = run_fingerprint(tmp_path / "whole")
    assert len(snapshots) > 1 and (rows, snapshots) == resumed_fingerprint(config, tmp_path / "half")


def test_exit_config_errors_are_one_line(tiny_bases):
    from ludus.league.api import load_config

    with pytest.raises(ConfigError, match="learner 'text_exit' searches positions") as info:
        load_config("llm_tic_tac_toe", ["game=connect_four"])
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="does not use text_lm.ppo"):
        load_config("llm_tic_tac_toe", ["text_lm.ppo.kl_coef=0.1"])
    with pytest.raises(ConfigError, match="does not use text_lm.exit"):
        load_config("llm_tic_tac_toe", ["learner=text_ppo", "text_lm.exit.steps=3"])
    with pytest.raises(ConfigError, match="simulations"):
        load_config("llm_tic_tac_toe", ["text_lm.exit.simulations=0"])
