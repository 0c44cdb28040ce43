"""`goal llm_any_textarena_game` over runs' results (benchmarks/llm_any_game.py --combine): three
TextArena games at least with two seeds each, one with free-text moves, every lower bound against the
base above 0.5, runs of the default recipe only."""

from __future__ import annotations

from benchmarks.llm_any_game import textarena_goal


def _run(game: str, lower: float, free_text: bool = True, within_budget: bool = True, seed: int = 1,
         overrides: tuple[str, ...] = ()) -> dict:
    return {"game": game, "seed": seed, "vs_base": [lower + 0.05, lower, lower + 0.1, 0.9],
            "free_text": free_text, "within_budget": within_budget, "overrides": list(overrides)}


def _two_seeds(runs: list[dict]) -> list[dict]:
    return runs + [{**r, "seed": 2} for r in runs]


def test_three_games_two_seeds_each_one_free_text_all_above_half_pass():
    runs = [_run("ta:Nim-v0", 0.6), _run("ta:IndianPoker-v0", 0.55), _run("ta:ConnectFour-v0", 0.51, False)]
    line = textarena_goal(_two_seeds(runs))
    assert line.endswith("PASS") and "0.510" in line
    # a cache's size is not the recipe
    cached = [_run("ta:Nim-v0", 0.6, overrides=("text_lm.model.readings_mb=2048",))]
    assert textarena_goal(_two_seeds(runs[1:] + cached)).endswith("PASS")


def test_the_worst_game_or_a_missing_condition_fails():
    good = _two_seeds([_run("ta:Nim-v0", 0.6), _run("ta:IndianPoker-v0", 0.55), _run("ta:Othello-v0", 0.7)])
    assert textarena_goal(good).endswith("PASS")
    assert textarena_goal(good + [_run("ta:Othello-v0", 0.49, seed=3)]).endswith("FAIL")  # a bound at or below 0.5
    assert textarena_goal(good[:-1]).endswith("FAIL")  # one game with one seed
    assert textarena_goal([r for r in good if r["game"] != "ta:Othello-v0"]).endswith("FAIL")  # two games
    assert textarena_goal([{**r, "free_text": False} for r in good]).endswith("FAIL")  # no free text
    assert textarena_goal(good[:-1] + [_run("ta:Othello-v0", 0.7, seed=2, within_budget=False)]).endswith("FAIL")
    # a run that changed the recipe is not the goal's
    assert textarena_goal(good[:-1] + [_run("ta:Othello-v0", 0.7, seed=2, overrides=("text_lm.smmd.alpha=1",))]
                          ).endswith("FAIL")
    assert textarena_goal(good[:-1] + [_run("spiel:kuhn_poker", 0.7, seed=2)]).endswith("FAIL")  # not TextArena
