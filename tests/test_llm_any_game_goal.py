"""`goal llm_any_textarena_game` over runs' results (benchmarks/llm_any_game.py --combine): three
TextArena games at least, one with free-text moves, every lower bound against the base above 0.5."""

from __future__ import annotations

from benchmarks.llm_any_game import textarena_goal


def _run(game: str, lower: float, free_text: bool = True, within_budget: bool = True, seed: int = 1) -> dict:
    return {"game": game, "seed": seed, "vs_base": [lower + 0.05, lower, lower + 0.1, 0.9],
            "free_text": free_text, "within_budget": within_budget}


def test_three_games_one_free_text_all_above_half_pass():
    runs = [_run("ta:Nim-v0", 0.6), _run("ta:IndianPoker-v0", 0.55), _run("ta:ConnectFour-v0", 0.51, False)]
    line = textarena_goal(runs)
    assert line.endswith("PASS") and "0.510" in line


def test_the_worst_game_or_a_missing_condition_fails():
    good = [_run("ta:Nim-v0", 0.6), _run("ta:IndianPoker-v0", 0.55), _run("ta:Othello-v0", 0.7)]
    assert textarena_goal(good[:2] + [_run("ta:Othello-v0", 0.49)]).endswith("FAIL")  # one bound at or below 0.5
    assert textarena_goal(good[:2]).endswith("FAIL")  # two games
    assert textarena_goal(good + [_run("ta:Nim-v0", 0.3, seed=2)]).endswith("FAIL")  # a second seed's worse bound
    assert textarena_goal([_run(r["game"], 0.6, free_text=False) for r in good]).endswith("FAIL")  # no free text
    assert textarena_goal(good[:2] + [_run("ta:Othello-v0", 0.7, within_budget=False)]).endswith("FAIL")
    assert textarena_goal(good[:2] + [_run("spiel:kuhn_poker", 0.7)]).endswith("FAIL")  # not a TextArena game
