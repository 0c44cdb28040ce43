"""check_game over every listed game, on deliberately broken games, and `ludus games`."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from ludus.games import registry
from ludus.games.check import CheckReport, GameCheckError, check_game
from ludus.games.core import GameError
from ludus.games.adapters.spiel import make_spiel_game
from ludus.cli import main

REQUIRED_IDS = (
    "spiel:tic_tac_toe",
    "spiel:connect_four",
    "spiel:kuhn_poker",
    "spiel:leduc_poker",
    "spiel:goofspiel(num_cards=4)",
    "spiel:kuhn_poker(players=3)",
    "pz:pettingzoo.classic.tictactoe_v3",
    "pz:pettingzoo.classic.texas_holdem_v4",
    "pz:mpe2.simple_spread_v3",
    "gym:CartPole-v1",
)


def test_listed_ids_include_the_required_adapters_and_native_games():
    listed = registry.listed_ids()
    assert set(REQUIRED_IDS) <= set(listed)
    assert {"connect_four", "tic_tac_toe"} <= set(listed)


@pytest.mark.parametrize("game_id", sorted(set(registry.listed_ids()) | set(REQUIRED_IDS)))
def test_check_game_passes(game_id):
    report = check_game(game_id, num_games=30)
    assert isinstance(report, CheckReport) and report.game_id == game_id
    assert report.num_games == 30 and report.num_terminal + report.num_truncated == 30
    assert report.vector_resets >= 2 * report.vector_games
    assert report.spec == registry.spec(game_id)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.num_games = 0  # type: ignore[misc]


def test_check_game_accepts_explicit_seeds():
    report = check_game("spiel:kuhn_poker", seeds=[1, 2, 3, 2**64 - 1])
    assert report.num_games == 4


# --- broken games: the checker must be able to fail ------------------------------------------------

class FlawedKuhn:
    """Kuhn poker with one deliberate protocol violation, chosen by `flaw`."""

    def __init__(self, flaw: str):
        self.inner = make_spiel_game("kuhn_poker")
        self.flaw = flaw
        spec = dataclasses.replace(self.inner.spec, id=f"flawed_kuhn(flaw={flaw})", spiel_name=None)
        if flaw == "short_max_length":
            spec = dataclasses.replace(spec, max_length=2)
        if flaw == "general_sum_spec":
            spec = dataclasses.replace(spec, zero_sum=False)  # but utility_sum left at 0.0
        self.spec = spec
        self._bonus = 0.0

    def reset(self, seed):
        # "unseeded" ignores the seed: the deal then differs between replays of one seed.
        self.inner.reset(np.random.default_rng().integers(2**31) if self.flaw == "unseeded" else seed)
        self._bonus = 0.0

    def to_move(self):
        return self.inner.to_move()

    def observation(self, seat):
        obs = self.inner.observation(seat)
        return obs[:-1] if self.flaw == "obs_shape" else obs

    def legal_mask(self, seat):
        mask = self.inner.legal_mask(seat)
        return np.zeros_like(mask) if self.flaw == "empty_mask" else mask

    def step(self, actions):
        rewards = self.inner.step(actions)
        if self.flaw == "not_zero_sum" and self.inner.is_terminal():
            rewards = rewards + np.array([1.0, 0.0], dtype=np.float32)
            self._bonus = 1.0
        if self.flaw == "lost_reward":
            rewards = np.zeros_like(rewards)
        return rewards

    def is_terminal(self):
        return self.inner.is_terminal()

    def is_truncated(self):
        return False

    def returns(self):
        return self.inner.returns() + np.array([self._bonus, 0.0], dtype=np.float32)

    def history(self):
        history = self.inner.history()
        return history[:-1] if self.flaw == "short_history" else history

    def render(self):
        return None if self.flaw == "render_none" else self.inner.render()


@pytest.fixture
def flawed_kuhn(monkeypatch):
    """Registers `flawed_kuhn` for one test only, so no other test ever lists it."""
    registry.native_names()  # load the built-in games first
    entry = registry.GameEntry("flawed_kuhn", FlawedKuhn, None, "Kuhn poker with a deliberate bug")
    monkeypatch.setitem(registry._NATIVE, "flawed_kuhn", entry)


def test_an_honest_wrapper_passes(flawed_kuhn):
    check_game("flawed_kuhn(flaw=none)", num_games=20)


@pytest.mark.parametrize("flaw, message", [
    ("not_zero_sum", "utility_sum"),
    ("unseeded", "different trajectory"),
    ("obs_shape", "observation is"),
    ("empty_mask", "legal mask is empty"),
    ("lost_reward", "sum of step rewards"),
    ("short_history", "history()"),
    ("short_max_length", "max_length"),
    ("general_sum_spec", "utility_sum"),
    ("render_none", "render()"),
])
def test_check_game_catches_a_broken_game(flawed_kuhn, flaw, message):
    with pytest.raises(GameCheckError) as info:
        check_game(f"flawed_kuhn(flaw={flaw})", num_games=50)
    assert isinstance(info.value, AssertionError)
    assert message in str(info.value) and f"flawed_kuhn(flaw={flaw})" in str(info.value)


def test_check_game_unknown_id_is_a_user_error():
    with pytest.raises(GameError, match="kuhn_poker"):
        check_game("spiel:kuhn_pokr")


# --- ludus games -----------------------------------------------------------------------------------

def test_ludus_games_lists_every_id(capsys):
    assert main(["games"]) == 0
    out = capsys.readouterr().out
    for game_id in registry.listed_ids():
        assert game_id in out
    row = next(line for line in out.splitlines() if line.startswith("spiel:kuhn_poker "))
    assert row.split()[1:4] == ["2", "2", "11"]  # the information-state tensor


def test_ludus_games_describe_states_what_the_game_does(capsys):
    assert main(["games", "--describe", "connect_four"]) == 0
    out = capsys.readouterr().out
    assert "row 0 is the BOTTOM row" in out and "0..6 = the column" in out
    # ... and the game does what the text says: seat 0 drops into column 0, seat 1 sees an
    # opponent stone (plane 1) in row 0, column 0
    game = registry.make("connect_four")
    game.reset(0)
    game.step({0: 0})
    assert game.observation(1)[1, 0, 0] == 1.0 and game.observation(1)[2, 0, 0] == 0.0
    assert main(["games", "--describe", "spiel:kuhn_poker"]) == 0
    out = capsys.readouterr().out
    assert "information_state_tensor" in out and "0 Pass, 1 Bet" in out
    assert main(["games", "--describe", "spiel:kuhn_poker[observation]"]) == 0
    assert "observation_tensor" in capsys.readouterr().out
    assert main(["games", "--describe", "negotiation"]) == 0
    assert "vocabulary (token id word): 0 <pad>" in capsys.readouterr().out
    for game_id in registry.native_names():  # every native game documents its layout
        assert registry.native_entry(game_id).layout, game_id


def test_ludus_games_check_runs_the_checker(capsys):
    assert main(["games", "--check", "spiel:goofspiel(num_cards=4)", "--games", "10"]) == 0
    assert "OK" in capsys.readouterr().out


def test_ludus_games_check_reports_a_failing_game(flawed_kuhn, capsys):
    assert main(["games", "--check", "flawed_kuhn(flaw=not_zero_sum)", "--games", "20"]) == 1
    assert capsys.readouterr().out.startswith("FAIL")


@pytest.mark.parametrize("game_id, named", [("nosuchgame", "nosuchgame"),
                                             ("spiel:kuhn_poker(players=x)", "players")])
def test_ludus_games_check_bad_id_exits_2_with_one_line(game_id, named):
    result = subprocess.run([sys.executable, "-m", "ludus", "games", "--check", game_id],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], result.stderr


def test_games_cli_module_imports_no_game_library():
    code = ("import sys, ludus.games.cli; heavy = {'pyspiel', 'pettingzoo', 'gymnasium', 'torch'} & set(sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
