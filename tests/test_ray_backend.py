"""The Ray backend: same results as the serial backend, killed runners replayed, snapshots shipped.

Ray binds the machine's external interface even when asked for loopback, so every test runs Ray
in a child process inside a network namespace that has only loopback
(`unshare -n sh -c 'ip link set lo up; ...'`, docs/reference.md §3). The scenarios that need
a running Ray share one child process (one Ray start, ~5 s and ~770 MB); run this file as a
script to run them: `python tests/test_ray_backend.py OUT.json WORKDIR`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
NAMESPACE_TIMEOUT_S = 600  # a hang guard, not a speed check (~25 s quiet; >240 s seen on a machine loaded 3x)

# A small tic-tac-toe league whose runner tasks take ~0.5 s each (4 games at a time), so a
# runner killed 0.02 s after its task was sent is usually in the middle of it.
KILL_LEAGUE = ["game=tic_tac_toe", "iterations=2", "matches_per_iteration=256", "num_envs=4", "num_runners=2",
               "net.hidden=[32]", "snapshot_every_steps=200", "anchors=[random]", "log.progress=false"]
QUICKSTART = ["iterations=2", "num_runners=2", "log.progress=false"]


def ledger_rows(run_dir: Path) -> tuple[list[tuple], list[tuple]]:
    """(matches, ratings history) of a run's ledger, without wall-clock fields."""
    from ludus.league.records.ledger import Store

    with Store.open(run_dir, mode="read") as store:
        matches = [(m.result.match_id, m.result.kind, m.result.seed, m.result.length,
                    json.dumps(dict(m.result.metadata), sort_keys=True),
                    tuple((s.player_id, s.episode_return, s.outcome, s.player_version) for s in m.result.seats))
                   for m in store.iter_matches()]
        ratings = [(r.seq, r.player_id, r.mu, r.sigma) for r in store.ratings_history()]
    return matches, ratings


def snapshot_ids(run_dir: Path) -> dict[str, str]:
    """player id -> snapshot content hash of a run's frozen snapshots."""
    from ludus.league.rundata import read_run

    return {m.player_id: m.snapshot_id for m in read_run(run_dir).frozen() if m.snapshot_id}


def serial_run(run_dir: Path, preset: str, overrides: list[str]) -> None:
    from ludus.league.config import load_config
    from ludus.league.manager import League

    league = League.create(load_config(preset, overrides + ["backend=serial"]), run_dir)
    try:
        league.run()
    finally:
        league.close()


# ------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Runs the scenarios in the namespace and, meanwhile, the serial runs they are compared with."""
    work = tmp_path_factory.mktemp("ray-scenarios")
    out = work / "out.json"
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
         sys.executable, str(Path(__file__).resolve()), str(out), str(work)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        serial_run(work / "serial-quickstart", "quickstart", QUICKSTART)
        serial_run(work / "serial-kill", "quickstart", KILL_LEAGUE)
        _, stderr = child.communicate(timeout=NAMESPACE_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, stderr[-4000:]
    results = json.loads(out.read_text())
    results["serial"] = {"quickstart": ledger_rows(work / "serial-quickstart"),
                         "kill": ledger_rows(work / "serial-kill"),
                         "quickstart_snapshots": snapshot_ids(work / "serial-quickstart")}
    results["ray_quickstart"] = ledger_rows(work / "ray-quickstart")
    return results


def _as_json(rows):
    return json.loads(json.dumps(rows))


def test_ray_backend_starts_a_local_ray_and_plays_what_the_serial_backend_plays(runs):
    backend = runs["backend"]
    assert backend["started_local_ray"]
    assert backend["tasks"] == 4 and backend["matches"] == 96
    assert backend["first_equal"], backend["first_diff"]


def test_killed_runner_replays_its_task_with_snapshots_from_the_object_store(runs):
    backend = runs["backend"]
    # The snapshot directory was deleted before the kill: the new actor got it from Ray's object store.
    assert backend["snapshot_dir_deleted"]
    assert backend["restarts"] == 1
    assert backend["new_pid"] != backend["old_pid"]
    assert backend["after_kill_equal"], backend["after_kill_diff"]


def test_ludus_train_backend_ray_gives_the_serial_ledger(runs):
    assert runs["cli"]["exit_code"] == 0 and "iteration 2/2" in runs["cli"]["stdout"]
    ray_matches, ray_ratings = runs["ray_quickstart"]
    serial_matches, serial_ratings = runs["serial"]["quickstart"]
    assert len(ray_matches) > 100
    assert ray_matches == serial_matches
    assert ray_ratings == serial_ratings


def test_a_two_node_cluster_spreads_runners_and_records_the_serial_ledger(runs):
    """`ray.cluster_utils.Cluster`: two simulated nodes (own raylet and object store each), the
    league connects by address; one runner per node, and the seeded run's ledger and snapshot
    hashes are those of the serial backend."""
    cluster = runs["cluster"]
    assert cluster["nodes"] == 2 and len(set(cluster["runner_nodes"])) == 2
    matches, ratings = cluster["ledger"]
    serial_matches, serial_ratings = runs["serial"]["quickstart"]
    assert len(matches) > 100
    assert matches == _as_json(serial_matches) and ratings == _as_json(serial_ratings)
    assert cluster["snapshots"] == runs["serial"]["quickstart_snapshots"]


def test_league_run_survives_a_runner_killed_mid_task(runs):
    league = runs["league"]
    assert league["restarts"] == 1
    ids = [row[0] for row in league["matches"]]
    assert ids == list(range(len(ids))) and len(ids) > 200  # none lost, none twice
    serial_matches, serial_ratings = runs["serial"]["kill"]
    assert league["matches"] == _as_json(serial_matches)
    assert league["ratings"] == _as_json(serial_ratings)


# ------------------------------------------------------------------ scenarios (inside the namespace)


def _results_diff(a: list, b: list) -> str:
    """'' when two lists of PlayResults are equal in everything but timings, else the first difference."""
    if len(a) != len(b):
        return f"{len(a)} results vs {len(b)}"
    for x, y in zip(a, b):
        if x.task_id != y.task_id or x.matches != y.matches:
            return f"task {x.task_id}: matches differ"
        if x.env_steps != y.env_steps or x.learner_steps != y.learner_steps:
            return f"task {x.task_id}: step counts differ"
        if sorted(x.rollouts) != sorted(y.rollouts):
            return f"task {x.task_id}: rollout keys differ"
        for pid in x.rollouts:
            for name in type(x.rollouts[pid]).__dataclass_fields__:
                if not np.array_equal(getattr(x.rollouts[pid], name), getattr(y.rollouts[pid], name)):
                    return f"task {x.task_id}: rollout {pid}.{name} differs"
    return ""


def _backend_scenario(work: Path):
    """RayBackend vs SerialBackend on the same tasks; then a runner killed with its tasks in flight
    after the snapshot directory is gone. Returns (findings, the open backend: it owns Ray)."""
    import ray
    import torch

    from ludus.agents.nets import ActorCritic, NetConfig
    from ludus.agents.snapshot import save_snapshot
    from ludus.games.registry import spec as game_spec
    from ludus.league.play.backends import LearnerWeights, SerialBackend
    from ludus.league.learners.base import ActorCriticArchitecture
    from ludus.league.records.population import Member
    from ludus.league.play.ray_backend import RayBackend
    from ludus.league.play.runner import MatchAssignment, PlayTask

    spec, net_config = game_spec("tic_tac_toe"), NetConfig(hidden=(32,))
    architecture = ActorCriticArchitecture(net_config)
    torch.manual_seed(1)
    ref = save_snapshot(ActorCritic(spec, net_config), spec, net_config, work / "snapshots" / "old@0")
    learner = ActorCritic(spec, net_config)
    weights = LearnerWeights("main", 3, {k: v.detach().numpy().copy() for k, v in learner.state_dict().items()})
    members = [Member("old@0", "snapshot", "main", snapshot_path=str(ref.path), snapshot_id=ref.snapshot_id),
               Member("anchor:random", "anchor", "anchor", bot="random")]
    pairings = [("main", "old@0"), ("old@0", "main"), ("main", "anchor:random"), ("anchor:random", "old@0")]
    tasks = []
    for t in range(4):  # 4 tasks on 2 runners: each runner holds two, in order
        assignments = tuple(MatchAssignment(t * 24 + j, 1000 + t * 24 + j, pairings[j % 4], "training")
                            for j in range(24))
        tasks.append(PlayTask(t, assignments, sample_seed=77 + t, learners=("main",), learner_versions=(3,)))

    serial = SerialBackend("tic_tac_toe", spec, architecture, num_envs=8, cache_size=4, seed=0)
    serial.set_population(members)
    expected = serial.collect(serial.submit(tasks, [weights]))

    started_local_ray = not ray.is_initialized()
    backend = RayBackend("tic_tac_toe", spec, architecture, num_envs=8, cache_size=4, num_workers=2, seed=0)
    backend.set_population(members)
    first = backend.collect(backend.submit(tasks, [weights]))
    # The manager's snapshot directory goes away; the runner that replaces the killed one can
    # only get the snapshot from the object store.
    shutil.rmtree(work / "snapshots")
    old_pid = backend.pids[0]
    handle = backend.submit(tasks, [weights])
    ray.kill(backend.actors[0], no_restart=False)
    after_kill = backend.collect(handle)
    findings = {"started_local_ray": started_local_ray and backend.owns_ray,
                "tasks": len(first), "matches": sum(len(r.matches) for r in first),
                "first_equal": not _results_diff(first, expected), "first_diff": _results_diff(first, expected),
                "snapshot_dir_deleted": not (work / "snapshots").exists(), "restarts": backend.restarts,
                "old_pid": old_pid, "new_pid": backend.pids[0],
                "after_kill_equal": not _results_diff(after_kill, expected),
                "after_kill_diff": _results_diff(after_kill, expected)}
    return findings, backend


def _cli_scenario(work: Path) -> dict:
    """`ludus train quickstart --backend ray` (on the Ray this process already runs)."""
    import contextlib
    import io

    from ludus.cli import main

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["train", "quickstart", "--backend", "ray", "--run", str(work / "ray-quickstart"),
                     *[f"--set={o}" for o in QUICKSTART]])
    return {"exit_code": code, "stdout": stdout.getvalue()}


def _league_kill_scenario(work: Path) -> dict:
    """A league run whose first runner is SIGKILLed just after it is sent its first task."""
    from ludus.league.config import load_config
    from ludus.league.manager import League

    league = League.create(load_config("quickstart", KILL_LEAGUE + ["backend=ray"]), work / "league")
    make_backend = league._make_backend

    killed: list[int] = []

    def make_backend_that_loses_a_runner():
        backend = make_backend()
        submit = backend.submit

        def submit_then_kill(tasks, weights):
            handle = submit(tasks, weights)
            # Once only: on a fast machine the runner may finish its task before the kill lands;
            # then the next task finds it dead, `restarts` is still 0 at that submit, and the
            # death is handled there (replayed the same way).
            if not killed:
                time.sleep(0.02)  # the runner has its task and is playing it
                killed.append(backend.pids[0])
                os.kill(killed[0], signal.SIGKILL)
            return handle

        backend.submit = submit_then_kill
        return backend

    league._make_backend = make_backend_that_loses_a_runner
    try:
        league.run()
        restarts = league.backend.restarts
    finally:
        league.close()
    matches, ratings = ledger_rows(work / "league")
    return {"restarts": restarts, "matches": json.loads(json.dumps(matches)), "ratings": ratings}


def _cluster_scenario(work: Path) -> dict:
    """The quickstart league on a simulated two-node Ray cluster, joined by its address."""
    import ray
    from ray.cluster_utils import Cluster

    from ludus.league.config import load_config
    from ludus.league.manager import League

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        config = load_config("quickstart", QUICKSTART + ["backend=ray", f"ray_address={cluster.address}"])
        league = League.create(config, work / "cluster")
        try:
            league.run()
            runner_nodes = [node for _, node, _ in league.backend.runners]
            nodes = len({n["NodeID"] for n in ray.nodes() if n["Alive"]})
        finally:
            league.close()  # disconnects this driver; the cluster's nodes stay until shut down
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    matches, ratings = ledger_rows(work / "cluster")
    return {"nodes": nodes, "runner_nodes": runner_nodes, "ledger": json.loads(json.dumps([matches, ratings])),
            "snapshots": snapshot_ids(work / "cluster")}


def _run_scenarios(out: Path, work: Path) -> None:
    findings, backend = _backend_scenario(work)  # starts the local Ray the others use
    try:
        results = {"backend": findings, "cli": _cli_scenario(work), "league": _league_kill_scenario(work)}
    finally:
        backend.close()  # and stops Ray
    results["cluster"] = _cluster_scenario(work)
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    _run_scenarios(Path(sys.argv[1]), Path(sys.argv[2]))
