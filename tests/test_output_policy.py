"""The league's output policy as a checkpoint (agents/mixture.py, league/output.py): written at
every population change, scored by `ludus evaluate` exactly as the league scores it, played by
`ludus play`, exported, and accepted by the arena."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ludus.agents.mixture import (MIXTURE_FILE, Mixture, MixtureComponent, MixtureError, is_mixture, load_mixture_policy,
                            read_mixture, write_mixture)
from ludus.agents.play import play_terminal
from ludus.evaluation.evaluate import evaluate_checkpoint
from ludus.cli import main
from ludus.league.psro import clear_payoff_caches

KUHN = "spiel:kuhn_poker"
SMALL = ["iterations=4", "matches_per_iteration=48", "num_envs=16", "snapshot_every_steps=40",
         "log.progress=false", "log.wandb=disabled", "log.tensorboard=false", "ppo.num_minibatches=2",
         "ppo.update_epochs=1"]


@pytest.fixture(scope="module")
def kuhn_run(tmp_path_factory) -> Path:
    """A short PSRO league on Kuhn poker, trained by the CLI (which attaches the exploitability hook)."""
    run = tmp_path_factory.mktemp("kuhn") / "run"
    args = ["train", "kuhn_poker", "--run", str(run)]
    for override in SMALL:
        args += ["--set", override]
    assert main(args) == 0
    clear_payoff_caches()
    return run


def _metric(run: Path, name: str) -> float:
    values = [row[name] for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if name in row]
    assert values, f"no {name} in metrics.jsonl"
    return values[-1]


def test_output_policy_is_written_and_scored_as_the_league_scores_it(kuhn_run, capsys):
    output = kuhn_run / "output_policy"
    mixture = read_mixture(output)
    assert mixture.game_id == KUHN and "meta-Nash" in mixture.source
    assert sum(c.weight for c in mixture.components) == pytest.approx(1.0)
    capsys.readouterr()
    assert main(["evaluate", str(output), "--exploitability", "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)["exploitability"]["exploitability"]
    assert measured == _metric(kuhn_run, "eval/exploitability")  # the same computation, bit for bit


def test_run_exploitability_reports_output_newest_and_best(kuhn_run, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(kuhn_run), "--exploitability", "--json"]) == 0
    rows = {row["label"]: row for row in json.loads(capsys.readouterr().out)["exploitability"]}
    assert set(rows) == {"output policy", "newest snapshot", "best snapshot"}
    assert rows["output policy"]["exploitability"] == _metric(kuhn_run, "eval/exploitability")
    assert rows["newest snapshot"]["exploitability"] == _metric(kuhn_run, "eval/main_exploitability")
    assert rows["best snapshot"]["exploitability"] <= rows["newest snapshot"]["exploitability"]


def _two_member_mixture(run: Path, directory: Path) -> Path:
    """main@1 and the random bot, half and half, pointing into the run's snapshots."""
    member = json.loads((run / "snapshots" / "main@1" / "manifest.json").read_text())
    from ludus.agents.snapshot import verify_snapshot

    ref = verify_snapshot(run / "snapshots" / "main@1")
    assert member["game_id"] == KUHN
    relative = str(Path("..") / run.name / "snapshots" / "main@1")
    write_mixture(directory, Mixture(KUHN, (MixtureComponent("main@1", 0.5, snapshot=relative,
                                                             snapshot_id=ref.snapshot_id),
                                            MixtureComponent("random", 0.5, bot="random")), "test", 0))
    return directory


def test_evaluate_plays_one_member_per_game(kuhn_run, tmp_path):
    mixture_dir = _two_member_mixture(kuhn_run, kuhn_run.parent / "half")
    report = evaluate_checkpoint(mixture_dir, kuhn_run, games_per_opponent=200, include_anchors=True, seed=1)
    assert report.snapshot_id == "mixture" and report.total_games == 200 * len(report.opponents)
    pure = evaluate_checkpoint(kuhn_run / "snapshots" / "main@1", kuhn_run, games_per_opponent=200,
                               include_anchors=True, seed=1)
    assert report.score != pure.score  # the random half changed the games


def test_play_and_draws(kuhn_run):
    policy = load_mixture_policy(_two_member_mixture(kuhn_run, kuhn_run.parent / "half2"))
    rng = np.random.default_rng(0)
    drawn = [policy.start_game(rng) for _ in range(400)]
    assert 150 < drawn.count("random") < 250 and set(drawn) == {"main@1", "random"}
    lines: list[str] = []
    result = play_terminal(KUHN, str(kuhn_run), human_seat=0, seed=3, input_fn=lambda _: "0",
                           print_fn=lambda *a: lines.append(" ".join(map(str, a))))
    assert result.finished and any(line.startswith("the mixture plays") for line in lines)


def test_a_mixture_makes_its_components_forget_their_readings():
    """Runners clear kept readings (an LM's prompt store) at each task; a mixture passes that on."""
    from ludus.agents.mixture import MixturePolicy
    from ludus.agents.policy import KeepsReadings

    class Keeps:
        forgotten = 0

        def forget_readings(self):
            self.forgotten += 1

    keeps, plain = Keeps(), object()
    mixture = Mixture(KUHN, (MixtureComponent("lm@1", 0.5, snapshot="lm@1"), MixtureComponent("random", 0.5, bot="random")),
                      source="test", iteration=0)
    policy = MixturePolicy(mixture, [keeps, plain])
    assert isinstance(policy, KeepsReadings)
    policy.forget_readings()
    assert keeps.forgotten == 1


def test_damaged_mixtures_give_one_line_errors(kuhn_run, tmp_path):
    good = _two_member_mixture(kuhn_run, kuhn_run.parent / "half3")
    data = json.loads((good / MIXTURE_FILE).read_text())

    def broken(change) -> Path:
        # beside the run, as the good one is: its relative paths still reach the run's snapshots
        target = kuhn_run.parent / f"broken-{len(list(kuhn_run.parent.glob('broken-*')))}"
        target.mkdir()
        copy = json.loads(json.dumps(data))
        change(copy)
        (target / MIXTURE_FILE).write_text(json.dumps(copy))
        return target

    cases = {
        "sum to 0.9": broken(lambda d: d["components"][0].update(weight=0.4)),
        "content": broken(lambda d: d["components"][0].update(snapshot_id="0" * 64)),
        "relative path": broken(lambda d: d["components"][0].update(snapshot="/etc")),
        "exactly one of": broken(lambda d: d["components"][1].pop("bot")),
    }
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / MIXTURE_FILE).write_bytes(b"\x00\xff not json")
    cases["not JSON"] = tmp_path / "garbage"
    for expected, directory in cases.items():
        with pytest.raises(MixtureError, match=expected) as info:
            read_mixture(directory)
        assert "\n" not in str(info.value)
    assert main(["evaluate", str(cases["content"]), "--exploitability"]) == 2


def test_export_and_arena_accept_the_output_policy(kuhn_run, tmp_path):
    from ludus.arena.match import MatchLimits, play_match
    from ludus.arena.match import make_player
    from ludus.arena.submission import SubmissionError, SubmissionKind, validate_submission

    with pytest.raises(SubmissionError, match="outside the folder"):
        validate_submission(kuhn_run / "output_policy", KUHN)
    packed = tmp_path / "packed"
    assert main(["export", str(kuhn_run / "output_policy"), "--format", "mixture", "--out", str(packed)]) == 0
    assert is_mixture(packed) and all(c.snapshot is None or c.snapshot.startswith("members/")
                                      for c in read_mixture(packed).components)
    moved = tmp_path / "moved"
    shutil.move(packed, moved)  # self-contained: it works from anywhere
    submission = validate_submission(moved, KUHN)
    assert submission.kind == SubmissionKind.MIXTURE
    agent = make_player(submission, KUHN)
    random_bot = make_player(validate_submission("random", KUHN), KUHN)
    with agent:
        records = [play_match(KUHN, [agent, random_bot], seed=s, limits=MatchLimits(time_per_move_s=2, overage_s=5))
                   for s in range(4)]
    assert all(r.statuses[0].value == "ok" for r in records)
    onnx_dir = tmp_path / "onnx"
    assert main(["export", str(moved), "--format", "onnx", "--out", str(onnx_dir)]) == 0
    members = json.loads((onnx_dir / "members.json").read_text())
    assert sum(c["weight"] for c in members["components"]) == pytest.approx(1.0)
    assert all((onnx_dir / c["file"]).is_file() for c in members["components"] if "file" in c)


def test_non_psro_runs_output_their_main_agent_and_a_run_is_a_checkpoint(tmp_path):
    args = ["train", "quickstart", "--run", str(tmp_path / "ttt")]
    for override in ["iterations=3", "matches_per_iteration=24", "num_envs=8", "snapshot_every_steps=60",
                     "anchors=[random]", "log.progress=false", "log.wandb=disabled", "log.tensorboard=false",
                     "ppo.num_minibatches=2", "ppo.update_epochs=1"]:
        args += ["--set", override]
    assert main(args) == 0
    mixture = read_mixture(tmp_path / "ttt" / "output_policy")
    newest = max((p for p in (tmp_path / "ttt" / "snapshots").iterdir() if p.name.startswith("main@")),
                 key=lambda p: int(p.name.split("@")[1]))
    assert [(c.player_id, c.weight) for c in mixture.components] == [(newest.name, 1.0)]
    # A run directory is accepted wherever a checkpoint is: it stands for its output policy ...
    run = str(tmp_path / "ttt")
    assert main(["evaluate", run, "--against", run, "--games", "2", "--json"]) == 0
    assert main(["export", run, "--format", "torchscript", "--out", str(tmp_path / "export")]) == 0
    assert json.loads((tmp_path / "export" / "members.json").read_text())["components"][0]["player_id"] == newest.name
    # ... and in the arena for its newest main snapshot, named after the run
    from ludus.arena.api import Arena
    from tests.test_arena import require_isolation

    require_isolation()
    assert main(["arena", "submit", run, "--game", "tic_tac_toe", "--arena", str(tmp_path / "arena")]) == 0
    assert [e.player_id for e in Arena.open(tmp_path / "arena").list()] == [f"ttt/{newest.name}"]
