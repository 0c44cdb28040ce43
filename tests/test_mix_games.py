"""Several games in one run (games/mix.py, config key `games:`): the mix as a game, matchmaking
and ratings per game, an LM that plays each game with its own prompt, exact resume (issue 76)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from ludus.games import registry
from ludus.games.check import check_game
from ludus.errors import UserError
from ludus.games.core import GameError
from ludus.games.mix import match_game_id, mix_parts, parse_mix, plays

TWO = "mix:ta:TicTacToe-v0|ta:SimpleNegotiation-v0"


def test_a_mix_of_board_games_keeps_the_game_protocol():
    report = check_game("mix:tic_tac_toe|connect_four")
    assert report.spec.num_actions == 9 and report.spec.observation_shape == (1 + 3 * 6 * 7,)  # three planes of connect four


def test_a_mix_of_text_move_games_keeps_the_protocol_and_is_a_text_move_game():
    assert check_game(TWO).spec.text_moves


def test_each_match_plays_the_game_its_seed_draws_by_weight_and_that_game_alone_replays_it():
    game_id = "mix:tic_tac_toe@3|connect_four"
    drawn = Counter(match_game_id(game_id, seed) for seed in range(4000))
    assert abs(drawn["tic_tac_toe"] / 4000 - 0.75) < 0.03
    mix, rng = registry.make(game_id), np.random.default_rng(0)
    for seed in range(6):
        alone = registry.make(match_game_id(game_id, seed))
        mix.reset(seed)
        alone.reset(seed)
        while mix.to_move():
            seat = mix.to_move()[0]
            own = alone.observation(seat).reshape(-1)
            assert np.array_equal(mix.observation(seat)[1:1 + own.size], own)
            action = int(rng.choice(np.flatnonzero(alone.legal_mask(seat))))
            assert np.array_equal(mix.step({seat: action}), alone.step({seat: action}))
        assert alone.is_terminal() and np.array_equal(mix.returns(), alone.returns())


@pytest.mark.parametrize("game_id, message", [
    ("mix:tic_tac_toe", "at least two games"),
    ("mix:tic_tac_toe|tic_tac_toe", "twice"),
    ("mix:tic_tac_toe|connect_four@x", "weight"),
    ("mix:tic_tac_toe|connect_four@0", "weight"),
    ("mix:tic_tac_toe|ta:TicTacToe-v0", "differ in"),
    ("mix:tic_tac_toe|spiel:kuhn_poker(players=3)", "differ in num_players"),
])
def test_a_bad_mix_is_refused_in_one_line(game_id, message):
    with pytest.raises(GameError, match=message) as caught:
        registry.spec(game_id)
    assert "\n" not in str(caught.value)


def test_a_policy_of_a_mix_plays_each_of_its_games():
    assert plays(TWO, "ta:TicTacToe-v0") and plays(TWO, TWO) and not plays(TWO, "ta:KuhnPoker-v0")
    assert [p.game_id for p in parse_mix("a|b@2")] == ["a", "b"] and mix_parts("tic_tac_toe") == ()


def test_the_mix_view_tells_each_observation_as_its_own_game_does():
    from ludus.games.text import parse_response, text_view

    view, own_view = text_view(TWO), text_view("ta:TicTacToe-v0")
    game, alone = registry.make(TWO), registry.make("ta:TicTacToe-v0")
    seed = next(s for s in range(50) if match_game_id(TWO, s) == "ta:TicTacToe-v0")
    game.reset(seed)
    alone.reset(seed)
    seat = game.to_move()[0]
    obs, mask = game.observation(seat), game.legal_mask(seat)
    own_obs, own_mask = alone.observation(seat), alone.legal_mask(seat)
    assert view.state(obs, seat, mask) == own_view.state(own_obs, seat, own_mask)
    assert parse_response(view, "[4]", obs, seat, mask).action == 4


# ------------------------------------------------------------------------- a league of two games


def _mix_config(base, *extra):
    from ludus.league.api import load_config

    return load_config("llm_any_game", [
        f"text_lm.model.base={base}", "iterations=2", "matches_per_iteration=6", "num_envs=6",
        "log.wandb=disabled", "log.tensorboard=false", "log.progress=false", "torch_threads=1", "runner_threads=1",
        "text_lm.smmd.distill_steps=1", "text_lm.smmd.critic_steps=2", "snapshot_every_steps=1", "rating_share=0.3",
        "games=[ta:TicTacToe-v0, ta:SimpleNegotiation-v0(max_steps=6)]", *extra])


def test_a_two_game_lm_league_rates_per_game_plays_each_game_alone_and_resumes_exactly(tiny_bases, tmp_path):
    from ludus.agents.snapshot import policy_from_snapshot
    from ludus.league.api import League, replay_match
    from ludus.league.check import resumed_fingerprint, run_fingerprint
    from ludus.league.records.ledger import Store
    from ludus.league.status import format_status, status

    config = _mix_config(tiny_bases[0])
    assert config.game == "mix:ta:TicTacToe-v0|ta:SimpleNegotiation-v0(max_steps=6)"
    league = League.create(config, tmp_path / "whole")
    league.run()
    league.close()
    with Store.open(tmp_path / "whole", mode="read") as store:
        matches = [recorded.result for recorded in store.iter_matches()]
    games = {m.game_id for m in matches}
    assert games == {p.game_id for p in mix_parts(config.game)}  # each match under its own game
    from ludus.league.matchlist import MatchFilter, format_listing, list_matches

    listing = list_matches(tmp_path / "whole", MatchFilter(game="ta:TicTacToe-v0"), None)
    assert listing.total == sum(m.game_id == "ta:TicTacToe-v0" for m in matches) > 0
    assert "ta:SimpleNegotiation" in format_listing(list_matches(tmp_path / "whole", MatchFilter(), None),
                                                    str(tmp_path / "whole"), arena=False)
    with pytest.raises(UserError, match="its games: ta:"):
        list_matches(tmp_path / "whole", MatchFilter(game="ta:Nim-v0"), None)
    replayed = replay_match(tmp_path / "whole", matches[-1].match_id)
    assert replayed.matches and matches[-1].game_id in replayed.transcript
    report = status(tmp_path / "whole")
    assert {g.game for g in report.games} == games and all(g.matches > 0 for g in report.games)
    assert all(f"game {g}:" in format_status(report) for g in games)
    snapshot = next(m for m in league.population.frozen() if m.kind == "snapshot")
    alone = policy_from_snapshot(tmp_path / "whole" / snapshot.snapshot_path, expect_game="ta:TicTacToe-v0",
                                 lm_base=config.text_lm.model)
    assert alone.view.game_id == "ta:TicTacToe-v0"
    from ludus.evaluation.evaluate import evaluate_checkpoint, format_evaluation
    from ludus.evaluation.report import build_report, render_html

    assert '<h2 id="games">Per game</h2>' in render_html(build_report(tmp_path / "whole"))
    evaluated = evaluate_checkpoint(tmp_path / "whole" / snapshot.snapshot_path, tmp_path / "whole",
                                    games_per_opponent=4, include_anchors=False)
    assert {g.game for g in evaluated.by_game} <= games and sum(g.total_games for g in evaluated.by_game) == \
        evaluated.total_games and "game ta:" in format_evaluation(evaluated)
    assert run_fingerprint(tmp_path / "whole") == resumed_fingerprint(config, tmp_path / "half")
