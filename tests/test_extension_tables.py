"""The extension tables take outside code (issue 75, Deliver 3): a toy game adapter and a toy
snapshot kind registered from this file, with no project file edited, work everywhere a built-in
one does: the conformance checker, a short league through the public API, policy loading."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from ludus.agents.policy import RandomPolicy
from ludus.agents.snapshot import (SNAPSHOT_KINDS, Lineage, SnapshotError, SnapshotKind, policy_from_snapshot,
                                   read_verified, register_snapshot_kind, snapshot_kind, write_snapshot)
from ludus.games import registry
from ludus.games.check import check_game
from ludus.games.core import GameError, GameSpec
from ludus.games.registry import ADAPTERS, GameAdapter, register_adapter


class Nim:
    """Two seats take 1 or 2 stones in turn; whoever takes the last stone wins."""

    def __init__(self, stones: int = 5) -> None:
        self.stones = stones
        self.spec = GameSpec(id=f"toy:nim(stones={stones})", num_players=2, num_actions=2,
                             observation_shape=(stones + 1,), max_length=stones, observation_low=0.0,
                             observation_high=1.0, binary_observations=True)
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.left, self.mover, self._history = self.stones, 0, []
        self._returns = np.zeros(2, dtype=np.float32)

    def to_move(self) -> tuple[int, ...]:
        return () if self.left == 0 else (self.mover,)

    def observation(self, seat: int) -> np.ndarray:
        obs = np.zeros(self.stones + 1, dtype=np.float32)
        obs[self.left] = 1.0
        return obs

    def legal_mask(self, seat: int) -> np.ndarray:
        return np.array([self.left >= 1, self.left >= 2])

    def step(self, actions: dict[int, int]) -> np.ndarray:
        (seat, action), = actions.items()
        if seat != self.mover or not self.legal_mask(seat)[action]:
            raise GameError(f"illegal move {action} by seat {seat}")
        self.left -= action + 1
        self._history.append(action)
        rewards = np.zeros(2, dtype=np.float32)
        if self.left == 0:
            rewards[seat], rewards[1 - seat] = 1.0, -1.0
        self.mover = 1 - self.mover
        self._returns += rewards
        return rewards

    def is_terminal(self) -> bool:
        return self.left == 0

    def is_truncated(self) -> bool:
        return False

    def returns(self) -> np.ndarray:
        return self._returns.copy()

    def history(self) -> tuple[int, ...]:
        return tuple(self._history)

    def render(self) -> str:
        return f"{self.left} stones left, seat {self.mover} to take"


def make_toy(rest: str) -> Nim:
    """``toy:nim`` or ``toy:nim(stones=N)``."""
    name, _, params = rest.partition("(")
    if name != "nim":
        raise GameError(f"unknown toy game {name!r}: toy:nim is the only one")
    return Nim(**registry.parse_params(params.rstrip(")"), rest))


@pytest.fixture(scope="module", autouse=True)
def toy_adapter():
    register_adapter(GameAdapter("toy", "toy:NAME", "the tests' toy games", make_toy,
                                 summary="Nim, from tests/test_extension_tables.py", examples=("toy:nim(stones=5)",)))
    yield
    del ADAPTERS["toy"]


def test_a_toy_adapter_resolves_and_passes_the_checker():
    game = registry.make("toy:nim(stones=5)")
    assert isinstance(game, Nim) and registry.spec("toy:nim(stones=5)").num_actions == 2
    assert registry.adapter_for("toy:nim").reaches == "the tests' toy games"
    assert "toy:nim(stones=5)" in registry.listed_ids()
    assert not registry.resolves_by_import("toy:nim")
    check_game("toy:nim(stones=5)", num_games=20)


def test_what_an_id_reaches_is_asked_of_its_adapter_record(monkeypatch):
    """The exact methods (Deep CFR, text MMD, PSRO's meta-game) and the snapshot loader ask the
    adapter's record, never the id's prefix: a toy adapter with a game tree reaches one."""
    assert registry.reaches_game_tree("spiel:kuhn_poker")
    assert not any(map(registry.reaches_game_tree, ("toy:nim", "kuhn_poker", "tyo:nim", "", "teams(game=spiel:kuhn_poker)")))
    monkeypatch.setitem(ADAPTERS, "toy", dataclasses.replace(ADAPTERS["toy"], game_tree=True,
                                                             stale_snapshot=lambda rest, shape: f"{rest} {shape}"))
    assert registry.reaches_game_tree("toy:nim")
    assert registry.snapshot_shape_problem("toy:nim(stones=5)", (3,)) == "nim(stones=5) (3,)"
    assert registry.snapshot_shape_problem("tic_tac_toe", (3,)) == ""
    now = registry.spec("spiel:kuhn_poker").observation_shape
    assert registry.snapshot_shape_problem("spiel:kuhn_poker", now) == ""
    assert "train it again on spiel:kuhn_poker" in registry.snapshot_shape_problem("spiel:kuhn_poker", (1,))


def test_unknown_prefixes_and_taken_prefixes_are_one_line_errors():
    with pytest.raises(GameError, match=r"unknown game prefix 'tyo' .*did you mean toy:.*toy:") as failure:
        registry.make("tyo:nim")
    assert "\n" not in str(failure.value)
    with pytest.raises(GameError, match="prefix 'spiel' is taken"):
        register_adapter(GameAdapter("spiel", "spiel:NAME", "OpenSpiel", make_toy))


def test_a_short_league_trains_on_the_toy_game(tmp_path):
    from ludus.league.api import League, load_config
    from ludus.league.records.ledger import Store

    config = load_config("quickstart", ["game=toy:nim(stones=5)", "iterations=2", "matches_per_iteration=8",
                                        "num_envs=4", "snapshot_every_steps=20", "anchors=[random]",
                                        "log.progress=false", "log.wandb=disabled", "log.tensorboard=false",
                                        "ppo.num_minibatches=2", "ppo.update_epochs=1"])
    league = League.create(config, tmp_path / "run")
    try:
        league.run()
    finally:
        league.close()
    with Store.open(tmp_path / "run", mode="read") as store:
        assert store.count_matches() > 0
    snapshots = sorted((tmp_path / "run" / "snapshots").glob("*/manifest.json"))
    assert snapshots
    policy = policy_from_snapshot(snapshots[-1].parent, expect_game="toy:nim(stones=5)")
    assert hasattr(policy, "act")


# ------------------------------------------------------------------------------ snapshot kinds


SPEC = Nim().spec


def _random_policy(path, expect_game, lm_base):
    """A toy kind: weights.json says the policy plays uniformly at random."""
    _, manifest, data = read_verified(path, "toy_random", expect_game)
    assert json.loads(data)["uniform"] and manifest.game_id == SPEC.id
    return RandomPolicy()


def test_a_toy_snapshot_kind_loads_through_the_table(tmp_path):
    register_snapshot_kind(SnapshotKind("toy_random", "weights.json", _random_policy, "uniform play"))
    try:
        header = {"format_version": 1, "game": SPEC.to_json(), "game_id": SPEC.id, "kind": "toy_random",
                  "architecture": {}, "lineage": Lineage().to_json()}
        ref = write_snapshot(tmp_path / "toy", header, {"weights.json": b'{"uniform": true}'})
        assert isinstance(policy_from_snapshot(ref.path), RandomPolicy)
        with pytest.raises(SnapshotError, match="already registered"):
            register_snapshot_kind(SnapshotKind("lm", "weights.safetensors", _random_policy))
    finally:
        del SNAPSHOT_KINDS["toy_random"]


def test_an_unknown_stored_kind_is_a_one_line_error_naming_the_kinds(tmp_path):
    header = {"format_version": 1, "game": SPEC.to_json(), "game_id": SPEC.id, "kind": "hologram",
              "architecture": {}, "lineage": Lineage().to_json()}
    ref = write_snapshot(tmp_path / "odd", header, {"weights.safetensors": b"w"})
    with pytest.raises(SnapshotError, match="holds a 'hologram' model: this Ludus loads the kinds "
                                            "actor_critic, lm, lm_adapter") as failure:
        policy_from_snapshot(ref.path)
    assert "\n" not in str(failure.value)
    with pytest.raises(SnapshotError, match="unknown snapshot kind 'hologram'"):
        snapshot_kind("hologram")
