"""MAPPO inside the league (league/learners/mappo.py): the runners' recorded critic inputs, seats that
leave, exact resume, and the presets that train with it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ludus.agents.rollout import side_critic_inputs
from ludus.games.core import GameSpec, TimeStep
from ludus.league.api import League, load_config
from ludus.league.play.backends import ProcessBackend, SerialBackend
from ludus.league.check import check_backend, check_learner
from ludus.league.learners.base import module_weights
from ludus.league.learners.learning import make_learner
from ludus.league.play.runner import LearnerWeights, MatchAssignment, PlayTask, Runner
from ludus.league.seeds import match_seed

QUIET = ["log.wandb=disabled", "log.tensorboard=false", "log.progress=false"]
SPREAD_OBS = 18


def _spread(*extra: str):
    return load_config("simple_spread", QUIET + ["iterations=2", "matches_per_iteration=8", "num_envs=4", *extra])


def _task(spec, matches: int, version: int = 0) -> PlayTask:
    return PlayTask(task_id=0, sample_seed=5, learners=("main",), learner_versions=(version,), gamma=0.95,
                    assignments=tuple(MatchAssignment(j, match_seed(3, j), ("main",) * spec.num_players, "training")
                                      for j in range(matches)))


def test_every_recorded_row_carries_the_global_state_and_backends_agree():
    config = _spread()
    learner = make_learner(_spec(config), config, 0, seed=0, init_seed=1)
    weights = [LearnerWeights("main", 0, module_weights(learner.module))]
    spec = _spec(config)
    rollouts = {}
    for name, backend in (("serial", SerialBackend(config.game, spec, learner.architecture, 4, 1)),
                          ("process", ProcessBackend(config.game, spec, learner.architecture, 4, 1, num_workers=1))):
        backend.set_population([])
        try:
            (result,) = backend.collect(backend.submit([_task(spec, 6)], weights))
        finally:
            backend.close()
        rollouts[name] = result.rollouts["main"]
    serial, process = rollouts["serial"], rollouts["process"]
    for field in dataclasses.fields(serial):
        a, b = getattr(serial, field.name), getattr(process, field.name)
        assert (a is None and b is None) or np.array_equal(a, b), field.name
    # simple_spread's global state is the three observations in seat order: each row's own
    # observation sits at its seat's place in the critic input recorded with it
    rows = len(serial)
    assert serial.critic_obs.shape == (rows, 3 * SPREAD_OBS) and rows == 6 * 25 * 3
    blocks = serial.critic_obs.reshape(rows, 3, SPREAD_OBS)
    assert np.array_equal(blocks[np.arange(rows), serial.seats], serial.obs)
    # ... and the values stored with the rows are the centralised critic's
    x = np.concatenate([serial.critic_obs, np.eye(3, dtype=np.float32)[serial.seats]], axis=1)
    np.testing.assert_allclose(serial.values, learner.learner.values(x), rtol=1e-5, atol=1e-6)


def _spec(config):
    from ludus.games.registry import spec

    return spec(config.game)


class LeavingSeatGame:
    """A 3-seat simultaneous vector game of one slot: 4 steps a game, seat 2 leaves after 2; every
    acting seat gets reward 1 per step. No global state: the critic reads the side's observations."""

    spec = GameSpec(id="test:leaving", num_players=3, num_actions=2, observation_shape=(2,), teams=(0, 0, 0),
                    zero_sum=False, utility_sum=None, simultaneous=True, max_length=4)
    num_games = 1

    def __init__(self):
        self.seed_source = lambda n: np.zeros(n, np.uint64)
        self.t = 0

    def _timestep(self, rewards, done, returns=(0.0, 0.0, 0.0)):
        acting = np.array([[True, True, self.t < 2]])
        obs = np.arange(6, dtype=np.float32).reshape(1, 3, 2) + 10 * self.t
        return TimeStep(obs=obs, mask=acting[:, :, None].repeat(2, axis=2), acting=acting,
                        rewards=np.asarray(rewards, np.float32).reshape(1, 3), done=np.array([done]),
                        truncated=np.array([False]), final_returns=np.asarray(returns, np.float32).reshape(1, 3),
                        final_lengths=np.array([4 if done else 0]))

    def reset(self, seeds):
        self.t = 0
        return self._timestep(np.zeros(3), False)

    def step(self, actions):
        rewards = [1.0, 1.0, 1.0 if self.t < 2 else 0.0]
        self.t += 1
        if self.t < 4:
            return self._timestep(rewards, False)
        self.seed_source(1)
        self.t = 0
        return self._timestep(rewards, True, returns=(4.0, 4.0, 2.0))

    def global_states(self):
        raise AssertionError("the game has no global state")

    def history(self, b):
        return ()


def test_a_seat_that_leaves_records_no_rows_after_it_and_its_last_row_keeps_its_rewards():
    config = dataclasses.replace(_spread(), ppo=dataclasses.replace(_spread().ppo, gamma=1.0, gae_lambda=1.0))
    learner = make_learner(LeavingSeatGame.spec, config, 0, seed=0, init_seed=0)
    module, policy = learner.architecture.build(LeavingSeatGame.spec)
    module.load_state_dict(learner.module.state_dict())
    runner = Runner(lambda n: LeavingSeatGame(), 1)
    result = runner.play(dataclasses.replace(_task(LeavingSeatGame.spec, 2), gamma=1.0, gae_lambda=1.0),
                         lambda pid: policy)
    batch = result.rollouts["main"]
    counts = {seat: int((batch.seats == seat).sum()) for seat in range(3)}
    assert counts == {0: 8, 1: 8, 2: 4}  # two games: seat 2 acted twice in each
    left = np.flatnonzero(batch.seats == 2)
    # no global state: the side's critic input is its three observations side by side
    blocks = batch.critic_obs.reshape(-1, 3, 2)
    assert np.array_equal(blocks[np.arange(len(batch)), batch.seats], batch.obs)
    # gamma = lambda = 1: the returns of seat 2's rows are its rewards to the end (its last step's
    # reward, then nothing after it left)
    assert batch.returns[left].tolist() == pytest.approx([2.0, 1.0, 2.0, 1.0], abs=1e-5)
    stats = learner.update(batch, progress=0.0)
    assert stats["active_rows"] == len(batch) == 20


def test_mappo_and_ippo_learners_resume_exactly():
    for overrides in (["learner=mappo"], ["learner=ippo"], ["learner=mappo", "critic.own_observation=true"]):
        report = check_learner(_spread(*overrides))
        assert report.rows > 0 and report.tensors > 0


def test_a_mappo_league_gives_the_same_run_on_processes():
    report = check_backend(_spread("num_runners=2"), "process")
    assert report.matches == 16


def test_simple_tag_sides_train_with_centralised_critics_and_freeze_as_actor_critic_snapshots(tmp_path):
    from ludus.agents.snapshot import policy_from_snapshot
    from ludus.agents.torch_policy import TorchPolicy

    config = load_config("simple_tag", QUIET + ["iterations=2", "matches_per_iteration=24", "num_envs=12",
                                               "snapshot_every_steps=500"])
    league = League.create(config, tmp_path / "run")
    summaries = league.run()
    league.close()
    assert {"predators", "prey"} <= set(summaries[-1].losses)
    assert all("explained_variance" in summaries[-1].losses[side] for side in ("predators", "prey"))
    snapshots = sorted((tmp_path / "run" / "snapshots").iterdir())
    assert snapshots and all(isinstance(policy_from_snapshot(p, expect_game="simple_tag"), TorchPolicy)
                             for p in snapshots)


def test_side_critic_inputs_without_a_global_state_are_the_sides_observations():
    obs = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    x = side_critic_inputs(obs, None, (0, 1, 0, 1))
    assert x.shape == (2, 4, 6)
    assert np.array_equal(x[:, 0], np.concatenate([obs[:, 0], obs[:, 2]], axis=1))
    assert np.array_equal(x[:, 3], np.concatenate([obs[:, 1], obs[:, 3]], axis=1))
    from ludus.games.core import GameError

    with pytest.raises(GameError, match="global state"):
        side_critic_inputs(np.zeros((1, 3, 2)), None, (0, 0, 1))


def test_a_2v2_league_rates_each_side_as_a_team_of_one_snapshot(tmp_path):
    from ludus.league.records.ledger import Store

    config = load_config("tic_tac_toe_2v2", QUIET + ["iterations=4", "matches_per_iteration=64", "num_envs=32",
                                                    "snapshot_every_steps=200"])
    league = League.create(config, tmp_path / "run")
    league.run()
    ratings = league.ratings.as_dict()
    league.close()
    assert any(pid.startswith("main@") for pid in ratings) and "anchor:random" in ratings
    with Store.open(tmp_path / "run", mode="read") as store:
        rated = [r.result for r in store.iter_matches() if r.result.kind == "rating"]
    assert rated
    for match in rated:
        by_team = {team: {s.player_id for s in match.seats if s.team == team} for team in (0, 1)}
        assert all(len(players) == 1 for players in by_team.values())  # one member fills both seats of a side
        assert [s.team for s in match.seats] == [0, 1, 0, 1]


def test_teams_of_two_alternate_partners_at_their_sides_moves():
    from ludus.games.registry import make

    game = make("teams(game=tic_tac_toe)")
    game.reset(0)
    order = []
    for cell in (0, 1, 3, 4, 6):
        (seat,) = game.to_move()
        order.append(seat)
        rewards = game.step({seat: cell})
    assert order == [0, 1, 2, 3, 0] and game.is_terminal()  # seat 0 completes the left column
    assert rewards.tolist() == [1.0, -1.0, 1.0, -1.0] and game.returns().tolist() == [1.0, -1.0, 1.0, -1.0]
    assert np.array_equal(game.observation(2), game.observation(0))  # partners see their player's view


def test_evaluation_seats_a_checkpoint_on_a_whole_side_and_reports_each_side(tmp_path):
    from ludus.evaluation.evaluate import evaluate_checkpoint, paired_assignments

    assignments = paired_assignments("me", ["a"], 4, 4, seed=0, sides=((0, 2), (1, 3)))
    assert [a.players for a in assignments[:2]] == [("me", "a", "me", "a"), ("a", "me", "a", "me")]
    config = load_config("tic_tac_toe_2v2", QUIET + ["iterations=2", "matches_per_iteration=32", "num_envs=16",
                                                    "snapshot_every_steps=100"])
    league = League.create(config, tmp_path / "run")
    league.run()
    league.close()
    snapshot = sorted((tmp_path / "run" / "snapshots").iterdir())[-1]
    report = evaluate_checkpoint(snapshot, tmp_path / "run", games_per_opponent=6, include_anchors=True)
    assert report.games_per_opponent == 6
    for result in report.opponents:
        assert result.games == 6 and len(result.seat_scores) == 2  # as team 0 (seats 0, 2) and team 1 (1, 3)


def test_ppo_keys_that_mappo_does_not_read_are_refused():
    from ludus.league.config import ConfigError

    for key in ("ent_decay_updates=100", "lr_decay_updates=100", "target_kl=0.02", "norm_adv=false",
                "minibatch_size=64"):
        with pytest.raises(ConfigError, match=f"does not use ppo.{key.split('=')[0]}"):
            load_config("simple_tag", [f"ppo.{key}"])
    assert load_config("simple_tag", ["ppo.ent_coef=0.02"]).ppo.ent_coef == 0.02  # a key it reads
