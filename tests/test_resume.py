"""A run directory is one consistent unit: kill -9 at any moment, then resume, gives the uninterrupted
run; whatever does not match its checkpoint, or is damaged, is refused with one line and left as it was.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from ludus.arena.testing import run_ludus
from ludus.league.api import League, load_config
from ludus.league.records.ledger import Store


REPO = Path(__file__).resolve().parent.parent
# The connect_four preset's kind of run, scaled down, and the kill loop: benchmarks/resume_kills.py
# (which does the same 20 times and prints goal resume_exact_kills).
_spec = importlib.util.spec_from_file_location("resume_kills", REPO / "benchmarks" / "resume_kills.py")
resume_kills = importlib.util.module_from_spec(_spec)
sys.modules["resume_kills"] = resume_kills  # its dataclasses resolve their annotations through it
_spec.loader.exec_module(resume_kills)
ASYNC, run_with_kills, train_args = resume_kills.ASYNC, resume_kills.run_with_kills, resume_kills.train_args
ledger_rows, snapshot_ids = resume_kills.ledger_rows, resume_kills.snapshot_ids


def ludus(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m ludus ARGS...`, its exit code left for the test to check."""
    return run_ludus(*args, check=False, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ludus: error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_async_process_run_killed_at_random_moments_resumes_exactly(tmp_path):
    """kill -9 at random moments of an asynchronous process-backend run (creation included),
    `ludus resume` after each: the ledger (every row, its seq, moves and ratings) and every
    snapshot equal the uninterrupted run's."""
    reference = tmp_path / "reference"
    assert ludus(*train_args(reference, ASYNC)).returncode == 0
    killed = tmp_path / "killed"
    rng = np.random.default_rng(7)
    # one kill while the run is being created, then three inside iterations (planning, playing,
    # learning or checkpointing: wherever the random delay lands)
    kills = [(-1, float(rng.uniform(0.5, 4.0)))] + [(int(i), float(rng.uniform(0.0, 0.6)))
                                                   for i in sorted(rng.choice(np.arange(1, 9), 3, replace=False))]
    landed = run_with_kills(killed, ASYNC, kills)
    assert landed >= 3
    assert ledger_rows(killed) == ledger_rows(reference)
    assert snapshot_ids(killed) == snapshot_ids(reference) and len(snapshot_ids(reference)) >= 3
    assert not list(tmp_path.glob(".creating-*")) and not list(killed.glob("checkpoints/.tmp-*"))


# --------------------------------------------------------------------- what resume refuses

SMALL = ["iterations=3", "matches_per_iteration=24", "num_envs=8", "snapshot_every_steps=60", "anchors=[random]",
         "log.progress=false", "log.wandb=disabled", "log.tensorboard=false", "ppo.num_minibatches=2",
         "ppo.update_epochs=2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A small finished run and a second one with another seed (to be copied from, never changed)."""
    root = tmp_path_factory.mktemp("runs")
    for name, seed in (("a", 0), ("b", 1)):
        league = League.create(load_config("quickstart", SMALL + [f"seed={seed}"]), root / name)
        try:
            league.run()
        finally:
            league.close()
    return root


def tree(root: Path) -> dict[str, object]:
    """Every file's bytes, but the ledger by its content (opening SQLite for writing flips its
    journal-mode bytes in the header without changing a row)."""
    files: dict[str, object] = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                                for p in sorted(root.rglob("*")) if p.is_file() and p.name != "manager.log"
                                and not p.name.startswith("ledger.sqlite")}
    if (root / "ledger.sqlite").exists():
        files["ledger"] = ledger_rows(root)
    return files


def copy_run(finished: Path, tmp_path: Path, name: str = "a") -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished / name, run)
    return run


def damage_ledger_missing(run: Path, other: Path) -> None:
    for p in run.glob("ledger.sqlite*"):
        p.unlink()


def damage_ledger_empty(run: Path, other: Path) -> None:
    for p in run.glob("ledger.sqlite*"):
        p.unlink()
    Store.open(run, mode="write").close()


def damage_ledger_foreign(run: Path, other: Path) -> None:
    for p in run.glob("ledger.sqlite*"):
        p.unlink()
    for p in other.glob("ledger.sqlite*"):
        shutil.copy(p, run / p.name)


def damage_snapshot_swapped(run: Path, other: Path) -> None:
    snaps = sorted((run / "snapshots").iterdir())
    shutil.rmtree(snaps[1])
    shutil.copytree(snaps[0], snaps[1])  # a valid snapshot, but another member's


def damage_checkpoint_empty(run: Path, other: Path) -> None:
    (run / "checkpoint.json").write_text("{}")


def damage_weights_truncated(run: Path, other: Path) -> None:
    pointer = json.loads((run / "checkpoint.json").read_text())
    weights = run / pointer["path"] / "learner-main.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])


def damage_weights_reshaped(run: Path, other: Path) -> None:
    # What a run made by an older version of its game holds (e.g. simple_tag's global state grew
    # by two entries): well-formed tensors of another shape.
    import torch
    from safetensors.torch import load, save

    pointer = json.loads((run / "checkpoint.json").read_text())
    path = run / pointer["path"] / "learner-main.safetensors"
    tensors = load(path.read_bytes())
    key = "net.actor_trunk.0.weight"  # the layer that reads the observation
    tensors[key] = torch.cat([tensors[key], tensors[key][:, :2]], dim=1)
    path.write_bytes(save(tensors))


def damage_config_changed(run: Path, other: Path) -> None:
    config = json.loads((run / "config.json").read_text())
    config["seed"] = 5
    (run / "config.json").write_text(json.dumps(config))


def damage_state_garbage(run: Path, other: Path) -> None:
    pointer = json.loads((run / "checkpoint.json").read_text())
    (run / pointer["path"] / "state.json").write_bytes(os.urandom(300))


@pytest.mark.parametrize("damage, message", [
    (damage_ledger_missing, "ledger.sqlite is missing"),
    (damage_ledger_empty, "the ledger does not match the checkpoint"),
    (damage_ledger_foreign, "the ledger does not match the checkpoint"),
    (damage_snapshot_swapped, "not the"),
    (damage_checkpoint_empty, "damaged run files"),
    (damage_weights_truncated, "is damaged"),
    (damage_weights_reshaped, "start a new run"),
    (damage_config_changed, "differs from the config the checkpoint was written with"),
    (damage_state_garbage, "unreadable"),
])
def test_resume_refuses_what_does_not_match_the_checkpoint(finished, tmp_path, ludus_here, damage, message):
    run = copy_run(finished, tmp_path)
    damage(run, finished / "b")
    before = tree(run)
    command = ludus if damage is damage_ledger_missing else ludus_here  # one case as a real process
    one_line_error(command("resume", str(run), "--iterations", "5"), message)
    assert tree(run) == before  # nothing written, config.json included


def test_resume_iterations_is_written_only_once_an_iteration_succeeded(finished, tmp_path):
    run = copy_run(finished, tmp_path)
    before = (run / "config.json").read_text()
    one_line_error(ludus("resume", str(run), "--iterations", "0"), "--iterations must be >= 1")
    assert (run / "config.json").read_text() == before
    assert ludus("resume", str(run), "--iterations", "4").returncode == 0
    assert json.loads((run / "config.json").read_text())["iterations"] == 4


def test_stale_temporaries_are_removed_on_resume(finished, tmp_path):
    run = copy_run(finished, tmp_path)
    (run / "checkpoints" / ".tmp-000002-424242").mkdir()
    (run / "snapshots" / ".main@9.tmp-abcd").mkdir()
    assert ludus("resume", str(run)).returncode == 0
    assert not list(run.glob("checkpoints/.tmp-*")) and not list(run.glob("snapshots/.*"))


def test_a_killed_rewrite_of_the_same_iteration_leaves_the_checkpoint_in_force(finished, tmp_path, monkeypatch):
    """The closing round checkpoints the last iteration a second time; a kill while it writes
    (here: an interrupt when its state.json is due) must leave the pointer's checkpoint whole —
    it once deleted that directory first (CI caught a kill -9 landing there)."""
    from ludus.league import checkpoint
    from ludus.league.rundata import read_run

    run = copy_run(finished, tmp_path)
    pointer = json.loads((run / "checkpoint.json").read_text())
    assert pointer["path"] == "checkpoints/iter-000003-001"  # iteration 3, then the closing round's rewrite
    state = checkpoint.read_checkpoint(run / pointer["path"])
    tensors = {"main": checkpoint.read_learner_tensors(run / pointer["path"], "main")}
    real = checkpoint.atomic_write_json

    def killed_at_state(path, data):
        if Path(path).name == checkpoint.STATE_FILE:
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(checkpoint, "atomic_write_json", killed_at_state)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.write_checkpoint(run, state, tensors, None)
    assert json.loads((run / "checkpoint.json").read_text()) == pointer
    assert read_run(run).iteration == 3
    monkeypatch.setattr(checkpoint, "atomic_write_json", real)
    checkpoint.write_checkpoint(run, state, tensors, None)  # the retry goes to a new name, the old one pruned
    assert json.loads((run / "checkpoint.json").read_text())["path"] == "checkpoints/iter-000003-002"
    assert sorted(p.name for p in (run / "checkpoints").glob("iter-*")) == ["iter-000003-001", "iter-000003-002"]
    assert ludus("resume", str(run), "--iterations", "4").returncode == 0


# --------------------------------------------------------------------- what train refuses


@pytest.mark.parametrize("override, message", [
    ("seed=-1", "seed=-1 is outside its range [0, 2**63)"),
    ("ppo.learning_rate=0", "ppo.learning_rate=0 is outside its range (0, 1]"),
    ("anchors=[no_such_bot]", "no_such_bot"),
])
def test_bad_config_values_leave_no_run_directory(tmp_path, ludus_here, override, message):
    run = tmp_path / "run"
    one_line_error(ludus_here(*train_args(run, SMALL + [override])), message)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_binary_garbage_config_file_is_one_line(tmp_path):
    config = tmp_path / "garbage.yaml"
    config.write_bytes(bytes(range(256)) * 4)
    one_line_error(ludus("train", str(config), "--run", str(tmp_path / "run")), "garbage.yaml")
    assert not (tmp_path / "run").exists()


def test_a_creation_killed_earlier_is_cleaned_and_the_name_is_free(tmp_path):
    dead = tmp_path / ".creating-run-999999999"
    (dead / "snapshots").mkdir(parents=True)
    (dead / "ledger.sqlite").write_bytes(b"half")
    assert ludus(*train_args(tmp_path / "run", SMALL + ["iterations=1"])).returncode == 0
    assert not dead.exists() and (tmp_path / "run" / "checkpoint.json").exists()


def test_full_disk_is_one_line(tmp_path):
    """A run on a filesystem that fills up: one line, exit 2 (as root: a 3 MiB tmpfs)."""
    if os.geteuid() != 0:
        if os.environ.get("LUDUS_CI") == "1":
            pytest.fail("the full-disk test mounts a small tmpfs: needs root")
        pytest.skip("needs root to mount a small tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], check=True)
    try:
        result = ludus(*train_args(mount / "run", SMALL + ["iterations=200", "snapshot_every_steps=10"]))
        one_line_error(result, "No space left on device")
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


# --------------------------------------------------------------------- runner failures


def _backend():
    from ludus.agents.nets import NetConfig
    from ludus.games.registry import spec
    from ludus.league.play.backends import ProcessBackend
    from ludus.league.learners.base import ActorCriticArchitecture

    game = spec("tic_tac_toe")
    architecture = ActorCriticArchitecture(NetConfig(hidden=(8,)))
    return ProcessBackend("tic_tac_toe", game, architecture, num_envs=2, cache_size=4, num_workers=1)


def test_a_runner_exception_stops_the_run_with_one_line_and_no_retry():
    from ludus.league.play.backends import RunnerError
    from ludus.league.play.runner import MatchAssignment, PlayTask

    backend = _backend()
    try:
        task = PlayTask(0, (MatchAssignment(0, 1, ("nobody", "nobody")),), sample_seed=0)
        handle = backend.submit([task], [])
        with pytest.raises(RunnerError) as info:
            backend.collect(handle)
        assert "\n" not in str(info.value) and "nobody" in str(info.value)
        assert backend.restarts == 0
    finally:
        backend.close()


def test_a_runner_that_died_between_plays_is_restarted_not_a_broken_pipe():
    backend = _backend()
    try:
        process, _ = backend.workers[0]
        process.kill()
        process.join()
        time.sleep(0.1)
        backend.set_population([])  # the first message after the death
        assert backend.restarts == 1 and backend.workers[0][0].is_alive()
    finally:
        backend.close()
