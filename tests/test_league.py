"""League core: reproducibility, exact resume, crash safety, and refusal of bad input."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ludus.arena.testing import run_ludus
from ludus.league.api import League, load_config, rebuild_ratings_check, replay_match, status, format_status
from ludus.league.config import ConfigError
from ludus.league.records.ledger import Store

SMALL = ["iterations=4", "matches_per_iteration=24", "num_envs=8", "snapshot_every_steps=60",
         "anchors=[random]", "log.progress=false", "log.wandb=disabled", "log.tensorboard=false",
         "ppo.num_minibatches=2", "ppo.update_epochs=2"]


def small_config(*extra: str):
    return load_config("quickstart", SMALL + list(extra))


def ledger_rows(run_dir: Path) -> list[tuple]:
    """The ledger without wall-clock fields, and the ratings history (`Store.comparable_rows`)."""
    with Store.open(run_dir, mode="read") as store:
        return store.comparable_rows()


def snapshot_ids(run_dir: Path) -> dict[str, str]:
    ids = {}
    for manifest in sorted((run_dir / "snapshots").glob("*/manifest.json")):
        ids[manifest.parent.name] = hashlib.sha256(manifest.read_bytes()).hexdigest()
    return ids


def train(config, run_dir: Path, until: int | None = None) -> None:
    league = League.create(config, run_dir)
    try:
        league.run(until_iteration=until)
    finally:
        league.close()


def test_the_last_snapshots_are_rated_before_the_run_ends_once(tmp_path):
    run_dir = tmp_path / "run"
    train(small_config(), run_dir)
    with Store.open(run_dir, mode="read") as store:
        members = {p.player_id for p in store.players()}
        newest = max((p for p in members if p.startswith("main@")), key=lambda p: int(p.split("@")[1]))
        rated = {r.player_id for r in store.ratings_history()}
        rows = store.count_matches()
    from ludus.league.rundata import read_run

    frozen_at = {m.player_id: m.iteration for m in read_run(run_dir).members}
    assert frozen_at[newest] == 4 - 1  # frozen in the last iteration (0-based): no iteration followed it
    assert newest in rated  # the closing round rated it
    league = League.resume(run_dir)  # a finished run: resuming plays nothing again
    try:
        assert league.run() == []
    finally:
        league.close()
    with Store.open(run_dir, mode="read") as store:
        assert store.count_matches() == rows


def test_two_seeded_serial_runs_are_identical(tmp_path):
    train(small_config(), tmp_path / "a")
    train(small_config(), tmp_path / "b")
    a, b = ledger_rows(tmp_path / "a"), ledger_rows(tmp_path / "b")
    assert len(a) > 50
    assert a == b
    assert snapshot_ids(tmp_path / "a") == snapshot_ids(tmp_path / "b")
    assert len(snapshot_ids(tmp_path / "a")) >= 2
    # A different seed plays different games.
    train(small_config("seed=1"), tmp_path / "c")
    assert ledger_rows(tmp_path / "c") != a


def test_serial_shards_equal_process_workers(tmp_path):
    train(small_config("num_runners=2", "iterations=2"), tmp_path / "serial")
    train(small_config("num_runners=2", "iterations=2", "backend=process"), tmp_path / "process")
    assert ledger_rows(tmp_path / "serial") == ledger_rows(tmp_path / "process")
    assert snapshot_ids(tmp_path / "serial") == snapshot_ids(tmp_path / "process")


def test_bfloat16_runners_are_as_exact_as_float32_ones(tmp_path):
    """inference_dtype bfloat16: the nets act in bf16 (other games than float32's), and serial
    shards still equal process workers bit for bit."""
    bf16 = ("num_runners=2", "iterations=2", "inference_dtype=bfloat16")
    train(small_config(*bf16), tmp_path / "serial")
    train(small_config(*bf16, "backend=process"), tmp_path / "process")
    train(small_config("num_runners=2", "iterations=2"), tmp_path / "float32")
    assert ledger_rows(tmp_path / "serial") == ledger_rows(tmp_path / "process")
    assert snapshot_ids(tmp_path / "serial") == snapshot_ids(tmp_path / "process")
    assert ledger_rows(tmp_path / "serial") != ledger_rows(tmp_path / "float32")


def test_resume_equals_uninterrupted_run(tmp_path):
    train(small_config(), tmp_path / "full")
    train(small_config(), tmp_path / "split", until=2)
    league = League.resume(tmp_path / "split")
    try:
        league.run()
    finally:
        league.close()
    assert ledger_rows(tmp_path / "split") == ledger_rows(tmp_path / "full")
    assert snapshot_ids(tmp_path / "split") == snapshot_ids(tmp_path / "full")


def test_a_shorter_iteration_plays_the_training_matches_asked_and_its_rating_share(tmp_path):
    league = League.create(small_config("rating_share=0.2"), tmp_path / "run")
    try:
        full, _ = league.step()
        short, _ = league.step(matches=8)
        with pytest.raises(ValueError, match="at least one training match"):
            league.step(matches=0)
    finally:
        league.close()
    assert (full.training_matches, full.rating_matches) == (24, 6)  # 0.2 of all games rate
    assert (short.training_matches, short.rating_matches) == (8, 2)


def test_async_mode_bounds_policy_lag(tmp_path):
    league = League.create(small_config("pipeline_depth=2", "max_policy_lag=1"), tmp_path / "run")
    try:
        summaries = league.run()
    finally:
        league.close()
    lags = [s.policy_lag for s in summaries[1:]]
    assert all(0.5 <= lag <= 1.0 for lag in lags), lags  # data one version behind the learner
    league = League.create(small_config("pipeline_depth=2", "max_policy_lag=0"), tmp_path / "strict")
    try:
        summaries = league.run()
    finally:
        league.close()
    assert sum(s.dropped_transitions for s in summaries) > 0


def test_ratings_rebuild_and_replay(tmp_path):
    train(small_config(), tmp_path / "run")
    check = rebuild_ratings_check(tmp_path / "run")
    assert check.rating_matches > 0 and check.identical
    assert len(check.rebuilt) >= 2
    with Store.open(tmp_path / "run", mode="read") as store:
        some = [rec.result.match_id for rec in store.iter_matches()][::17]
    for match_id in some:
        assert replay_match(tmp_path / "run", match_id).matches
    report = status(tmp_path / "run")
    assert report.iteration == 4
    text = format_status(report)
    assert "anchor:random" in text and "main@1" in text


def _wait_for_iteration(run_dir: Path, iteration: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pointer = run_dir / "checkpoint.json"
        if pointer.exists() and json.loads(pointer.read_text())["iteration"] >= iteration:
            return
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    raise AssertionError("training did not reach the iteration in time")


def test_kill_9_then_resume_loses_and_duplicates_nothing(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "ludus", "train", "quickstart", "--run", str(run_dir)]
    for item in SMALL + ["iterations=8", "matches_per_iteration=48"]:
        args += ["--set", item]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    _wait_for_iteration(run_dir, 2, proc)
    time.sleep(0.3)  # land somewhere inside an iteration
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    # While no writer holds the lock, status works; a second trainer would be refused while one runs.
    assert status(run_dir).iteration >= 2
    result = subprocess.run([sys.executable, "-m", "ludus", "resume", str(run_dir)], capture_output=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    assert b"main@" in result.stdout  # the population table

    train(load_config("quickstart", SMALL + ["iterations=8", "matches_per_iteration=48"]), tmp_path / "reference")
    assert ledger_rows(run_dir) == ledger_rows(tmp_path / "reference")
    with Store.open(run_dir, mode="read") as store:
        ids = [rec.result.match_id for rec in store.iter_matches()]
    assert ids == sorted(set(ids)) and ids == list(range(len(ids)))


def test_second_trainer_is_refused_while_status_works(tmp_path):
    run_dir = tmp_path / "run"
    league = League.create(small_config(), run_dir)
    try:
        league.run(until_iteration=1)
        result = subprocess.run([sys.executable, "-m", "ludus", "resume", str(run_dir)], capture_output=True,
                                timeout=120)
        assert result.returncode == 2
        err = result.stderr.decode().strip().splitlines()
        assert len(err) == 1 and "already open for writing" in err[0], err
        assert status(run_dir).iteration == 1
    finally:
        league.close()


def test_train_says_where_results_go_and_writes_plain_lines_to_a_log(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "ludus", "train", "quickstart", "--run", str(run_dir), "--set",
                             "iterations=2", "--set", "log.wandb=disabled", "--set", "log.tensorboard=true"],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, WANDB_MODE="disabled"))
    assert result.returncode == 0, result.stderr[-2000:]
    err = result.stderr
    assert "\r" not in err  # stderr is a pipe here: plain lines, no redrawing
    assert f"ludus: training {run_dir} (tic_tac_toe, 2 iterations)" in err
    assert f"tensorboard --logdir {run_dir / 'tensorboard'}" in err and "wandb        disabled" in err
    assert [line for line in err.splitlines() if line.startswith("[") and "it 2/2" in line and "elapsed" in line]
    out = result.stdout.splitlines()
    assert out[-6] == "next:" and out[-2] == f"  ludus play tic_tac_toe --against {run_dir}   # play it yourself"
    assert out[-4] == f"  ludus matches {run_dir}   # its matches, one a line (ludus replay {run_dir} ID shows one)"


def test_status_imports_no_torch_and_survives_a_closed_pipe(tmp_path):
    run_dir = tmp_path / "run"
    train(small_config(), run_dir, until=1)
    probe = ("import sys; from ludus.league.status import status; status(sys.argv[1]); "
             "assert 'torch' not in sys.modules, 'ludus.league.status imported torch'")
    subprocess.run([sys.executable, "-c", probe, str(run_dir)], check=True, timeout=120)
    # `head -c 0` has left long before ludus writes (its start takes ~0.3 s): the write fails with
    # EPIPE, which must end it quietly with the shell's SIGPIPE status, not a traceback
    shell = (f'"{sys.executable}" -m ludus status "{run_dir}" 2>"{tmp_path}/err" | head -c 0; '
             f'echo "${{PIPESTATUS[0]}}" >"{tmp_path}/rc"')
    subprocess.run(["bash", "-c", shell], check=True, timeout=120)
    assert (tmp_path / "err").read_text() == ""
    assert (tmp_path / "rc").read_text().strip() == "141"


@pytest.mark.parametrize("overrides, message", [
    (["nonsense_key=3"], "unknown config key 'nonsense_key'"),
    (["iterations=zero"], "config key 'iterations'"),
    (["iterations=0"], "iterations=0 is outside its range [1, 10**9]"),
    (["game=no_such_game"], "unknown game"),
    (["ppo.learning_rate=fast"], "config key 'ppo.learning_rate'"),
    (["roles=[{name: main, learner_share: -1}]"], "learner_share"),
    (["roles.hunter.pfsp=1"], "no roles entry named 'hunter' (have: main)"),
    (["roles.pfsp=1"], "'roles' is a list; name one of its entries"),
    (["roles.main.net.kind=conv", "roles.main.net.layer_norm=true"],
     "config key 'roles.main.net.layer_norm' is for net.kind 'mlp', not 'conv'"),
    (["learner=token_ppo", "roles.main.net.hidden=[8]"], "roles.main.net: learner 'token_ppo' has no actor-critic net"),
])
def test_bad_config_is_one_line_and_writes_nothing(tmp_path, ludus_here, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("quickstart", overrides)
    args = ["train", "quickstart", "--run", str(tmp_path / "run")]
    for item in overrides:
        args += ["--set", item]
    # the first case as a real process; the others through the CLI's main here (~3 s less each)
    result = run_ludus(*args, check=False) if overrides == ["nonsense_key=3"] else ludus_here(*args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_set_reaches_a_role_by_its_name():
    config = load_config("simple_tag", ["roles.prey.learner_share=2", "roles.predators.uniform=0.5"])
    prey, predators = (next(r for r in config.roles if r.name == name) for name in ("prey", "predators"))
    preset = {r.name: r for r in load_config("simple_tag").roles}
    assert prey.learner_share == 2.0 and predators.uniform == 0.5
    assert prey.uniform == preset["prey"].uniform and predators.learner_share == preset["predators"].learner_share
    # a config that keeps the default role list reaches it by the default name
    assert load_config("quickstart", ["roles.main.pfsp=0.25"]).roles[0].pfsp == 0.25


def test_a_role_with_its_own_net_learns_and_plays_with_it(tmp_path):
    """`roles[i].net`: that role's learner, its snapshots and the runners' copies of the live
    learner have its architecture (keys it leaves out are the league's `net`); serial shards equal
    process workers and a resumed run equals an uninterrupted one."""
    roles = "roles=[{name: main}, {name: exploiter, kind: main_exploiter, net: {hidden: [32]}}]"
    config = small_config(roles, "net.activation=relu", "num_runners=2", "iterations=3")
    assert config.role_net(0) == config.net
    assert config.role_net(1) == replace(config.net, hidden=(32,))  # relu, from the league's net
    train(config, tmp_path / "serial")
    train(replace(config, backend="process"), tmp_path / "process")
    train(config, tmp_path / "split", until=1)
    league = League.resume(tmp_path / "split")
    try:
        league.run()
    finally:
        league.close()
    rows = ledger_rows(tmp_path / "serial")
    assert any("exploiter" in str(row) for row in rows)  # the exploiter's live learner played
    for other in ("process", "split"):
        assert ledger_rows(tmp_path / other) == rows
        assert snapshot_ids(tmp_path / other) == snapshot_ids(tmp_path / "serial")
    hidden = {manifest.parent.name: json.loads(manifest.read_text())["architecture"]["hidden"]
              for manifest in (tmp_path / "serial" / "snapshots").glob("*/manifest.json")}
    assert {name.split("@")[0] for name in hidden} == {"main", "exploiter"}
    assert all(h == ([32] if name.startswith("exploiter@") else list(config.net.hidden)) for name, h in hidden.items())


def test_missing_run_and_corrupt_database_are_refused(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "ludus", "status", str(tmp_path / "nope")], capture_output=True,
                             timeout=60)
    assert missing.returncode == 2 and len(missing.stderr.decode().strip().splitlines()) == 1
    assert not (tmp_path / "nope").exists()

    run_dir = tmp_path / "run"
    train(small_config("iterations=1"), run_dir)
    db = run_dir / "ledger.sqlite"
    db.write_bytes(b"this is not a database" * 100)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    for command in (["status", str(run_dir)], ["resume", str(run_dir)], ["ratings", str(run_dir)]):
        result = subprocess.run([sys.executable, "-m", "ludus", *command], capture_output=True, timeout=60)
        assert result.returncode == 2, (command, result.stderr)
        assert len(result.stderr.decode().strip().splitlines()) == 1, result.stderr
    after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert before == after


def test_a_one_player_game_shows_its_returns_in_metrics_and_status(tmp_path):
    """Nothing is rated in a one-player game; its progress is the episode return."""
    from ludus.league.api import format_status, status

    config = load_config("quickstart", ["game=gym:CartPole-v1", "iterations=2", "matches_per_iteration=8",
                                        "num_envs=8", "anchors=[]", "log.progress=false", "log.wandb=disabled",
                                        "log.tensorboard=false"])
    league = League.create(config, tmp_path / "run")
    try:
        summaries = league.run()
    finally:
        league.close()
    assert all(s.episodic_return is not None and s.episodic_return > 0 for s in summaries)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["charts/episodic_return"] for m in logged] == [s.episodic_return for s in summaries]
    assert logged[-1]["charts/episodic_length"] == summaries[-1].episodic_length  # CartPole: length == return
    report = status(tmp_path / "run")
    main = next(m for m in report.members if m.player_id == "main")
    assert main.games == 16 and main.recent_return == pytest.approx(main.recent_length)
    assert "return" in format_status(report).splitlines()[1]


class _Quitter:
    """Plays its first legal action; gives up the match at its second move (tic-tac-toe: the
    first time it is to move with two or more cells taken)."""

    needs_history = False

    def act(self, batch, rng, greedy=False):
        import numpy as np
        from ludus.agents.policy import ActOutput

        mask = np.asarray(batch.mask, dtype=bool)
        n = len(mask)
        return ActOutput(np.argmax(mask, axis=1), np.zeros(n, np.float32), np.zeros(n, np.float32),
                         forfeits=(~mask).sum(axis=1) >= 2)


def test_a_seat_that_forfeits_ends_its_match_and_the_runner_goes_on():
    """ActOutput.forfeits: the match ends at once with the forfeit rule's returns, its moves are
    the prefix played (replayable), the learners' last transitions get the result, and the slot
    goes on to the next match (a slot's game left unfinished idles out, as queue ends do)."""
    import numpy as np
    from ludus.agents.bots.builtin import make_bot
    from ludus.games import registry
    from ludus.games.registry import make_vector
    from ludus.league.records.replay import replay_forfeit
    from ludus.league.play.runner import MatchAssignment, PlayTask, Runner

    spec = registry.make("tic_tac_toe").spec
    players = {"quitter": _Quitter(), "steady": make_bot("random", spec)}
    assignments = tuple(MatchAssignment(i, 500 + i, ("quitter", "steady") if i % 2 == 0 else ("steady", "quitter"))
                        for i in range(10))
    result = Runner(lambda n: make_vector("tic_tac_toe", n, seed=0), 3).play(
        PlayTask(0, assignments, sample_seed=1, learners=("quitter", "steady"), learner_versions=(4, 2)),
        players.__getitem__)
    assert [m.assignment.match_id for m in result.matches] == list(range(10))
    for match in result.matches:
        quitter = match.assignment.players.index("quitter")
        assert match.forfeited == (quitter,)
        assert match.returns[quitter] == -1.0 and match.returns[1 - quitter] == 1.0
        assert len(match.moves) == (2 if quitter == 0 else 3) == match.length  # the quitter's second move never happened
        forfeited = [s == quitter for s in range(2)]
        returns, transcript = replay_forfeit(registry.make("tic_tac_toe"), match.assignment.seed, match.moves, forfeited)
        assert returns == match.returns and f"seat {quitter} forfeits" in transcript
    quit_rows, steady_rows = result.rollouts["quitter"], result.rollouts["steady"]
    assert len(quit_rows) == 20  # per match: one move, then the turn it gave up in
    assert quit_rows.dones.sum() == 10 and quit_rows.rewards.sum() == -10.0
    assert np.all(quit_rows.rewards[quit_rows.dones] == -1.0)
    assert steady_rows.dones.sum() == 10 and np.all(steady_rows.rewards[steady_rows.dones] == 1.0)


def test_played_matches_are_columns_that_read_as_records():
    """A task's matches come back as columns (PlayedMatches) in match-id order, whatever order they
    were queued and finished in: each record's moves replay to its returns, indexing and iterating
    agree, and the columns survive pickling (how process and Ray runners send them)."""
    import pickle

    import numpy as np
    from ludus.agents.bots.builtin import make_bot
    from ludus.games import registry
    from ludus.games.registry import make_vector
    from ludus.league.records.replay import replay_moves
    from ludus.league.play.runner import MatchAssignment, PlayedMatch, PlayedMatches, PlayTask, Runner

    spec = registry.make("tic_tac_toe").spec
    players = {"a": make_bot("random", spec), "b": make_bot("random", spec)}
    ids = [17, 3, 9, 1, 12, 5, 30, 2, 8]  # queued out of id order; 3 slots finish them out of queue order
    assignments = tuple(MatchAssignment(i, 100 + i, ("a", "b") if k % 2 else ("b", "a")) for k, i in enumerate(ids))
    result = Runner(lambda n: make_vector("tic_tac_toe", n, seed=0), 3).play(
        PlayTask(0, assignments, sample_seed=4, learners=("a",), learner_versions=(6,)), players.__getitem__)
    matches = result.matches
    assert isinstance(matches, PlayedMatches) and len(matches) == len(ids)
    records = list(matches)
    assert [m.assignment.match_id for m in records] == sorted(ids)
    assert records == [matches[i] for i in range(len(ids))] and matches[-1] == records[-1]
    assert matches[2:4] == tuple(records[2:4])
    with pytest.raises(IndexError):
        matches[len(ids)]
    for match in records:
        assert isinstance(match, PlayedMatch) and len(match.moves) == match.length
        assert all(type(a) is int for a in match.moves) and type(match.returns[0]) is float
        assert match.player_versions == tuple(6 if p == "a" else 0 for p in match.assignment.players)
        assert match.forfeited == () and match.truncated is False
        returns, _ = replay_moves(registry.make("tic_tac_toe"), match.assignment.seed, match.moves)
        assert tuple(returns.tolist()) == match.returns
    again = pickle.loads(pickle.dumps(matches))
    assert again == matches and again == records and list(again) == records
    assert matches != records[:-1]
    np.testing.assert_array_equal(matches.move_starts[1:] - matches.move_starts[:-1], matches.lengths)


def test_gc_paused_pauses_the_collector_and_restores_it():
    import gc

    from ludus.league.play.runner import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause leaves the outer one paused
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gc_paused():
            raise RuntimeError("boom")
    assert gc.isenabled()  # and an exception inside restores it too


def test_runners_play_with_the_collector_paused():
    import gc

    from ludus.agents.bots.builtin import make_bot
    from ludus.games import registry
    from ludus.games.registry import make_vector
    from ludus.league.play.runner import MatchAssignment, PlayTask, Runner

    spec = registry.make("tic_tac_toe").spec
    seen = []

    class Watcher:
        needs_history = False

        def act(self, batch, rng, greedy=False):
            seen.append(gc.isenabled())
            return make_bot("random", spec).act(batch, rng, greedy)

    assignments = tuple(MatchAssignment(i, i, ("watcher", "watcher")) for i in range(4))
    Runner(lambda n: make_vector("tic_tac_toe", n, seed=0), 2).play(PlayTask(0, assignments, sample_seed=0),
                                                                     lambda pid: Watcher())
    assert seen and not any(seen) and gc.isenabled()
