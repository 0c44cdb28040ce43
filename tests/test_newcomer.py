"""Issue 79, the newcomer's path: the final table's score against each anchor for every member,
progress lines and the time budget, `ludus matches`, quiet replays, one wandb setting, ONNX in one
file, and games registered in Python."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import pytest

from ludus.arena.testing import run_ludus
from ludus.league import metrics
from ludus.league.api import League, load_config, preset_names
from ludus.league.cli import duration
from ludus.league.config import LogConfig
from ludus.league.records.ledger import Store
from ludus.league.status import status

SMALL = ["iterations=3", "matches_per_iteration=24", "num_envs=8", "snapshot_every_steps=60", "rating_share=0.5",
         "log.progress=false", "log.tensorboard=false", "ppo.num_minibatches=2", "ppo.update_epochs=2"]
REGISTERED = Path(__file__).parent / "games_registered_in_python"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A small quickstart run (random and perfect anchors) shared by the read-only tests."""
    run = tmp_path_factory.mktemp("newcomer") / "run"
    league = League.create(load_config("quickstart", SMALL), run)
    try:
        league.run()
    finally:
        league.close()
    return run


# ------------------------------------------------------------------ item 2: the final table


def test_every_member_that_met_an_anchor_has_its_score_against_it(run_dir):
    report = status(run_dir)
    assert report.anchors == ("anchor:random", "anchor:perfect")
    # recount from the ledger: each frozen member's head-to-head score with each anchor
    met: dict[tuple[str, str], list[float]] = {}
    with Store.open(run_dir, mode="read") as store:
        for recorded in store.iter_matches():
            match = recorded.result
            for anchor in report.anchors:
                own = [s for s in match.seats if s.player_id == anchor]
                for seat in match.seats:
                    if own and seat.player_id != anchor and seat.team != own[0].team:
                        score = 1.0 if seat.outcome > own[0].outcome else 0.5 if seat.outcome == own[0].outcome else 0.0
                        met.setdefault((seat.player_id, anchor), []).append(score)
    checked = 0
    for member in report.members:
        if member.kind == "learner":
            continue  # the learner's columns are the payoff table's decayed counts (what the run logs)
        for anchor, games, score in member.vs_anchors:
            scores = met.get((member.player_id, anchor))
            if scores is None:
                assert score is None
            else:
                assert games == len(scores) and score == pytest.approx(np.mean(scores))
                checked += 1
    snapshots = [m for m in report.members if m.kind == "snapshot"]
    assert snapshots and checked >= len(snapshots)  # the snapshots' rows are filled, not only the learner's


def test_every_preset_has_one_wandb_setting_and_the_quickstart_learns_in_its_table():
    assert LogConfig().wandb == "disabled"
    assert {load_config(name).log.wandb for name in preset_names()} == {"disabled"}
    quickstart = load_config("quickstart")
    assert quickstart.anchors == ("random", "perfect") and quickstart.game == "tic_tac_toe"


def test_offline_metrics_say_where_in_one_line_and_the_library_prints_nothing(tmp_path):
    pytest.importorskip("wandb")
    proc = subprocess.run([sys.executable, "-m", "ludus", "train", "quickstart", "--run", str(tmp_path / "r"),
                           "--set", "log.wandb=offline", *[a for s in SMALL[:4] for a in ("--set", s)]],
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "WANDB_MODE"})
    assert proc.returncode == 0, proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    assert not [line for line in lines if line.lower().startswith("wandb")], lines  # wandb's own lines
    [said] = [line for line in lines if line.startswith("  wandb ")]
    assert "offline" in said and str(tmp_path / "r" / "wandb") in said


# ------------------------------------------------------------------ item 3: progress and the time budget


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400),
                                           ("1m30s", 90), ("0.5s", 0.5)])
def test_durations(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "30x", "0s", "-5m", "m"])
def test_bad_durations_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)


def test_a_time_budget_stops_at_an_iteration_boundary_and_resume_goes_on(tmp_path, ludus_here):
    run = tmp_path / "run"
    sets = [a for s in SMALL + ["log.progress=true"] for a in ("--set", s)]
    out = ludus_here("train", "quickstart", "--run", str(run), "--time-budget", "0.01s", *sets)
    assert out.returncode == 0, out.stderr
    assert status(run).iteration == 1  # at least one iteration, then the budget stops it
    assert "stopped at iteration 1/3 by the time budget" in out.stderr
    assert f"ludus resume {run}" in out.stdout
    with Store.open(run, mode="read") as store:  # no closing round: the run is not over
        assert {m.result.metadata.get("iteration") for m in store.iter_matches()} == {1}
    out = ludus_here("resume", str(run))
    assert out.returncode == 0, out.stderr
    assert status(run).iteration == 3 and "time budget" not in out.stderr


def test_a_long_phase_gets_a_progress_line(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "HEARTBEAT_S", 0.0)
    log = metrics.RunLog(tmp_path, LogConfig(tensorboard=False), {"game": "g", "iterations": 4},
                         __import__("logging").getLogger("test"))
    err = io.StringIO()
    with redirect_stderr(err):
        log.terminal = False
        log.start(resume=False)
        log.phase("learn", 2, 4)
        time.sleep(2.5)
        log.end_progress()
        log.close()
    beats = [line for line in err.getvalue().splitlines() if line.startswith("it 2/4 learning for")]
    assert beats and "elapsed" in beats[0]


def test_training_says_what_it_builds_before_building_it(tmp_path, ludus_here):
    sets = [a for s in SMALL[:4] + ["log.progress=true"] for a in ("--set", s)]
    out = ludus_here("train", "quickstart", "--run", str(tmp_path / "r"), *sets)
    assert out.returncode == 0, out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith(f"ludus: creating {tmp_path / 'r'}: building the ppo learners for tic_tac_toe")


# ------------------------------------------------------------------ item 4: matches you can find


def test_matches_lists_and_filters_a_runs_matches(run_dir, ludus_here):
    out = ludus_here("matches", str(run_dir), "--all")
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()[1:-1]
    with Store.open(run_dir, mode="read") as store:
        total = store.count_matches()
        ratings = store.count_matches(kinds=["rating"])
    assert len(rows) == total
    out = ludus_here("matches", str(run_dir), "--kind", "rating", "--iteration", "2", "--player", "anchor:random",
                     "--all")
    rows = out.stdout.splitlines()[1:-1]
    assert rows and all(" rating " in r and " 2 " in r and "anchor:random" in r for r in rows)
    assert len(rows) < ratings
    newest = ludus_here("matches", str(run_dir), "--limit", "3").stdout.splitlines()
    assert len(newest) == 5 and f"of {total:,} matches pass" in newest[-1] and "newest 3 shown" in newest[-1]


@pytest.mark.parametrize("args, message", [
    (["--player", "mian"], "no player 'mian' in the ledger"),
    (["--kind", "friendly"], "unknown match kind 'friendly'"),
    (["--status", "lost"], "unknown seat status 'lost'"),
    (["--limit", "0"], "--limit must be >= 1"),
])
def test_matches_refuses_bad_filters_in_one_line(run_dir, ludus_here, args, message):
    out = ludus_here("matches", str(run_dir), *args)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.splitlines()) == 1


def test_matches_needs_a_run_or_an_arena(tmp_path, ludus_here):
    out = ludus_here("matches")
    assert out.returncode == 2 and "ludus matches RUN" in out.stderr
    out = ludus_here("matches", str(tmp_path / "nothing"))
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_a_missing_match_points_to_ludus_matches(run_dir, ludus_here):
    out = ludus_here("replay", str(run_dir), "99999")
    assert out.returncode == 2 and f"`ludus matches {run_dir}` lists" in out.stderr


def test_replay_with_html_prints_only_the_verdict_and_the_file(run_dir, tmp_path, ludus_here):
    out = ludus_here("replay", str(run_dir), "5", "--html", str(tmp_path / "m.html"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"match 5: recorded returns {out.stdout.split('returns ')[1].split(']')[0]}]"
                                       f", replayed {out.stdout.split('replayed ')[1].split(']')[0]}]: OK",
                                       f"replay player: {tmp_path / 'm.html'}"]
    assert "<html" in (tmp_path / "m.html").read_text().lower()


def test_an_arenas_matches_are_listed_and_replayed_to_html(tmp_path, ludus_here):
    arena = str(tmp_path / "arena")
    for bot in ("random", "perfect"):
        assert ludus_here("arena", "submit", f"bot:{bot}", "--game", "tic_tac_toe", "--arena", arena,
                          "--allow-unisolated").returncode == 0
    assert ludus_here("arena", "run", "--arena", arena, "--allow-unisolated", "--workers", "1").returncode == 0
    out = ludus_here("matches", "--arena", arena, "--player", "perfect")
    rows = out.stdout.splitlines()[1:-1]
    assert len(rows) == 2 and all("perfect" in r and " arena " in r for r in rows)
    first = rows[0].split()[0]
    out = ludus_here("arena", "replay", first, "--arena", arena, "--html", str(tmp_path / "a.html"))
    assert out.returncode == 0 and out.stdout.strip() == f"replay player: {tmp_path / 'a.html'}"
    assert "<html" in (tmp_path / "a.html").read_text().lower()
    out = ludus_here("arena", "replay", "999", "--arena", arena)
    assert out.returncode == 2 and "ludus matches --arena" in out.stderr


# ------------------------------------------------------------------ item 5: config, export, registered games


def test_a_misspelt_nested_key_gets_a_suggestion(ludus_here):
    out = ludus_here("train", "quickstart", "--set", "ppo.lr=1e-3")
    assert out.returncode == 2 and "did you mean ppo.learning_rate?" in out.stderr


def test_a_run_exports_to_one_onnx_file_that_reproduces_its_net(run_dir, tmp_path, ludus_here):
    pytest.importorskip("onnx")
    import onnx
    import torch
    from onnx.reference import ReferenceEvaluator

    from ludus.agents.export import example_inputs
    from ludus.agents.mixture import component_paths, read_mixture
    from ludus.agents.snapshot import load_snapshot

    out = ludus_here("export", str(run_dir), "--format", "onnx", "--out", str(tmp_path / "x.onnx"))
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.onnx"]
    assert "one file" in out.stdout and "max |diff|" in out.stdout
    # the file, checked here on our own inputs against the net of the run's output policy
    [member] = component_paths(run_dir / "output_policy", read_mixture(run_dir / "output_policy"))
    net = load_snapshot(member).net
    obs, mask = example_inputs(net.spec, 7, np.random.default_rng(123))
    logits, value = ReferenceEvaluator(onnx.load(str(tmp_path / "x.onnx"))).run(None, {"obs": obs, "mask": mask})
    with torch.inference_mode():
        want_logits, want_value = (t.numpy() for t in net(torch.from_numpy(obs), torch.from_numpy(mask)))
    assert np.abs(logits - want_logits)[mask].max() < 1e-4 and np.abs(value - want_value).max() < 1e-4


def _python(code: str, pythonpath: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def _ludus(args: list[str], pythonpath: Path | None) -> subprocess.CompletedProcess:
    return _python(f"import sys; from ludus.cli import main; sys.exit(main({args!r}))", pythonpath)


MAKE_RUN = """
{prelude}
from ludus.league.api import League, load_config
config = load_config("quickstart", {sets!r})
league = League.create(config, {run!r})
league.run()
league.close()
"""


def test_a_game_registered_in_python_is_usable_by_the_cli(tmp_path):
    run = str(tmp_path / "run")
    # the id as the config spells it carries the parameter; the snapshots' spec id drops it (its default)
    sets = SMALL + ["game=renamed_ttt(label=a)", "anchors=[random]"]
    made = _python(MAKE_RUN.format(prelude="import renamed_game", sets=sets, run=run), REGISTERED)
    assert made.returncode == 0, made.stderr
    assert '"game_module": "renamed_game"' in Path(run, "config.json").read_text()
    out = _ludus(["evaluate", f"{run}/snapshots/main@0", "--against", run, "--games", "2"], REGISTERED)
    assert out.returncode == 0, out.stderr
    assert "game renamed_ttt" in out.stdout
    out = _ludus(["resume", run, "--iterations", "4"], REGISTERED)
    assert out.returncode == 0, out.stderr
    # where the module cannot be imported, one line says which module and what to do
    out = _ludus(["evaluate", f"{run}/snapshots/main@0", "--against", run], None)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert "cannot import 'renamed_game', which registers game 'renamed_ttt(label=a)'" in out.stderr


def test_a_game_registered_by_a_script_is_refused_clearly_by_the_cli(tmp_path):
    run = str(tmp_path / "run")
    prelude = ("from ludus.games.registry import register\n"
               "from renamed_game import RenamedTicTacToe\n"
               "register('script_ttt', RenamedTicTacToe)")
    made = _python(MAKE_RUN.format(prelude=prelude, sets=SMALL + ["game=script_ttt", "anchors=[random]"], run=run),
                   REGISTERED)
    assert made.returncode == 0, made.stderr
    for args in (["matches", run, "--limit", "1"], ["status", run]):  # the ledger alone needs no game
        out = _ludus(args, REGISTERED)
        assert out.returncode == 0, out.stderr
    out = _ludus(["evaluate", f"{run}/snapshots/main@0", "--against", run], REGISTERED)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert "registered by a script (__main__)" in out.stderr and "game_module" in out.stderr


def test_the_import_option_makes_a_registered_game_playable(tmp_path):
    out = _ludus(["--import", "renamed_game", "games", "--describe", "renamed_ttt"], REGISTERED)
    assert out.returncode == 0, out.stderr
    out = _ludus(["--import", "no_such_module_here", "games"], REGISTERED)
    assert out.returncode == 2 and "--import no_such_module_here: cannot import it" in out.stderr


def test_a_run_written_before_game_module_existed_still_resumes(tmp_path, ludus_here):
    import json

    run = tmp_path / "run"
    league = League.create(load_config("quickstart", SMALL[1:] + ["iterations=1"]), run)
    try:
        league.run()
    finally:
        league.close()
    config = json.loads((run / "config.json").read_text())
    del config["game_module"]  # as a run made before the key was added wrote it
    (run / "config.json").write_text(json.dumps(config))
    out = ludus_here("resume", str(run), "--iterations", "2")
    assert out.returncode == 0, out.stderr
    assert status(run).iteration == 2


def test_matches_of_a_directory_that_holds_no_arena_is_one_line(tmp_path, ludus_here):
    out = ludus_here("matches", "--arena", str(tmp_path))
    assert out.returncode == 2 and f"no arena in {tmp_path}" in out.stderr and len(out.stderr.splitlines()) == 1


def test_the_eta_leaves_out_starting_the_runners(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])
    log = metrics.RunLog(tmp_path, LogConfig(tensorboard=False), {"game": "g", "iterations": 10},
                         __import__("logging").getLogger("test"))
    err = io.StringIO()
    summary = metrics.IterationSummary(1, 4, 0, 40, 110.0, dict.fromkeys(metrics.PHASES, 0.0), 1.0, 0.0, 0, (), {},
                                       None)
    totals = metrics.LeagueTotals(10, 40, 4, 3, 0, 1)
    with redirect_stderr(err):
        log.terminal = False
        log.start(resume=False)
        log.phase("start", 1, 10)  # the runners load a model for 100 s
        clock[0] += 100
        log.phase("play", 1, 10)  # then the iteration takes 10 s
        clock[0] += 10
        log.iteration(summary, totals, {}, {})
        log.end_progress()
        log.close()
    [line] = [line for line in err.getvalue().splitlines() if line.startswith("[")]
    assert "it 1/10 1:50 elapsed, ETA 1:30" in line  # 9 iterations of 10 s, not of 110 s


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 5])
def test_the_quickstart_shows_learning_in_its_final_table(tmp_path, seed):
    """The README's first run: its newest main snapshot scores >= 0.3 above anchor:random in the
    table's score column, beats random and holds the perfect player (seed 0 tuned it; 5 is unseen)."""
    run = tmp_path / "run"
    league = League.create(load_config("quickstart", [f"seed={seed}", "log.progress=false"]), run)
    try:
        league.run()
    finally:
        league.close()
    rows = {m.player_id: m for m in status(run).members}
    newest = max((m for m in rows.values() if m.kind == "snapshot"), key=lambda m: m.iteration)
    assert newest.score - rows["anchor:random"].score >= 0.3
    versus = {anchor: score for anchor, _, score in newest.vs_anchors}
    assert versus["anchor:random"] >= 0.8 and versus["anchor:perfect"] >= 0.35


def test_a_learner_with_a_target_table_has_its_exploitability_in_the_header(run_dir, tmp_path):
    import json
    import shutil

    from ludus.league.status import format_status

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    assert status(run).target_exploitability is None  # PPO logs no target table
    with open(run / "metrics.jsonl", "a") as f:  # what text_mmd logs with each update
        f.write(json.dumps({"step": 99, "losses/main/table_exploitability": 0.0437}) + "\n")
    report = status(run)
    assert report.target_exploitability == pytest.approx(0.0437)
    assert "learner's target exploitability 0.0437" in format_status(report).splitlines()[0]
