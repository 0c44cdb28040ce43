"""The table of learner kinds (league/learners/kinds.py): one record a kind, asked by the config,
the league and the checkers; a kind added from outside the project trains a league.

`check_learner` over every shipped kind: tests/test_checkers.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ludus.league.api import League, learner_kind, learner_kinds, load_config
from ludus.league.check import check_learner
from ludus.league.configio import ConfigError
from ludus.league.learners import kinds

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("games", "agents", "league", "arena", "evaluation", "ludus")
QUIET = ["log.progress=false", "log.wandb=disabled", "log.tensorboard=false"]
TOY = ["learner=toy_reinforce", "iterations=2", "matches_per_iteration=16", "num_envs=8", "net.hidden=[16]",
       "snapshot_every_steps=40", "anchors=[random]", *QUIET]


@pytest.fixture
def toy_kind(monkeypatch):
    """The toy kind of tests/toy_learner.py in the table for one test (the table is restored after,
    so the other tests' messages that list kinds stay those of the shipped kinds)."""
    import toy_learner

    monkeypatch.setattr(kinds, "_KINDS", dict(kinds._KINDS))
    return toy_learner.register()


def test_a_kind_added_from_the_tests_trains_a_league_and_passes_the_learner_checker(toy_kind, tmp_path):
    config = load_config("quickstart", TOY)
    assert learner_kind("toy_reinforce") is toy_kind
    league = League.create(config, tmp_path / "run")
    try:
        league.run()
        assert league.learners["main"].version == 2
        assert any(m.kind == "snapshot" for m in league.population.frozen())  # its snapshots joined the pool
    finally:
        league.close()
    report = check_learner(config)
    assert report.learner == "toy_reinforce" and report.tensors > 0 and report.rows > 0
    with pytest.raises(ConfigError, match="plays tic_tac_toe only"):  # its own validation is asked
        load_config("connect_four", TOY)


def test_an_unknown_kind_is_refused_in_one_line_with_the_closest_name():
    with pytest.raises(ConfigError) as error:
        load_config("quickstart", ["learner=mapo"])
    message = str(error.value)
    assert "\n" not in message and "did you mean 'mappo'?" in message
    assert all(kind.name in message for kind in learner_kinds())


def test_a_kind_name_is_registered_once(toy_kind):
    with pytest.raises(ValueError, match="already registered"):
        kinds.register_learner_kind(toy_kind)


def _learner_string_compares(tree: ast.AST) -> list[int]:
    """Lines comparing an attribute `.learner` with a string literal or a tuple/set of them."""
    def is_strings(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return True
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(is_strings(e) for e in node.elts)

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "learner" for s in sides) and any(map(is_strings, sides)):
                lines.append(node.lineno)
    return lines


def test_no_project_module_dispatches_on_a_learner_name():
    """What keeps adding a kind to at most three project files (its learner's module, its row in
    league/learners/kinds.py, and at most a line of `LeagueConfig.learner`'s docstring): nothing
    else in the project compares `config.learner` with a name; it asks the kind's record."""
    found = {}
    for family in PROJECT:
        for path in (ROOT / family).rglob("*.py"):
            lines = _learner_string_compares(ast.parse(path.read_text()))
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    assert found == {}


def test_the_check_finds_a_planted_learner_dispatch():
    assert _learner_string_compares(ast.parse("if config.learner in ('mappo', 'ippo'):\n    pass\n")) == [1]
