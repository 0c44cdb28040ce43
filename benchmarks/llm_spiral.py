"""SPIRAL's three-game mix, trained as a user would: `ludus train llm_spiral` for a wall clock (issue 76).

Runs the command line (`ludus train llm_spiral --run DIR --time-budget MINUTES`) in a child
process, the run's progress lines passing through, then reads the run as `ludus status` does:
for each of the three TextArena games (TicTacToe, KuhnPoker, SimpleNegotiation), the TrueSkill of
the newest snapshot of the learner and of the untrained base model (`anchor:base`) from that
game's rating matches, their games, score and share of invalid answers, side by side.

With `--games N` it then plays the newest snapshot against the base in each game alone, N games a
seat, with a Wilson 95% interval (`goal llm_spiral_mix`, issue 77: the lower bound above 0.5 in
every game); `--games 0` skips it.

    python benchmarks/llm_spiral.py --minutes 30 --seed 0
    python benchmarks/llm_spiral.py --minutes 30 --seed 1 --games 100

Ends with ``goal llm_spiral_mix_plays: ... PASS|FAIL``: the run exited cleanly after using its
budget (stopped by it, or within a tenth of it), and every game shows a rating and an
invalid-answer rate for the newest snapshot and for the base.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.host import host_line  # noqa: E402

PRESET = "llm_spiral"
BASE = "anchor:base"


def newest_snapshot(run_dir: Path) -> tuple[str, Path]:
    from ludus.league.rundata import read_run

    run = read_run(run_dir)
    snapshots = [m for m in run.members if m.kind == "snapshot" and m.role == "main"]
    if not snapshots:
        raise SystemExit(f"{run_dir}: the run froze no snapshot")
    newest = snapshots[-1]
    return newest.player_id, run_dir / newest.snapshot_path


def per_game_rows(run_dir: Path) -> tuple[list[str], bool]:
    """Per game, the lines of the learner's newest snapshot rated in that game and of the base, and
    whether every game has both players' rating and invalid-answer rate. (The snapshot frozen at
    the budget's last iteration has played no rating match yet: no iteration followed to rate it.)"""
    from ludus.league.status import status

    report = status(run_dir)
    lines, complete = [], bool(report.games)
    for game in report.games:
        lines.append(f"{game.game}: {game.matches:,} matches")
        rows = {m.player_id: m for m in game.members}
        rated = [m.player_id for m in game.members if m.player_id.startswith("main@") and m.mu is not None]
        newest = max(rated, key=lambda pid: int(pid.split("@")[1]), default="main@?")
        for pid in (newest, BASE):
            m = rows.get(pid)
            if m is None or m.mu is None or m.invalid_answers is None:
                complete = False
            if m is None:
                lines.append(f"  {pid:<14} no matches")
                continue
            rating = "unrated" if m.mu is None else f"mu {m.mu:6.2f} sigma {m.sigma:5.2f} (mu-3s {m.conservative:6.2f})"
            invalid = "-" if m.invalid_answers is None else f"{m.invalid_answers:.2f} a turn"
            lines.append(f"  {pid:<14} {rating}  games {m.games:>5}  score {m.score:.3f}  invalid answers {invalid}")
    return lines, complete


def versus_base(run_dir: Path, snapshot: Path, games: int, seed: int, threads: int) -> list[tuple[str, tuple]]:
    """(game, (score, low, high, legal first answers)) of the snapshot against the base in each game alone."""
    import torch

    from ludus.agents.lm.pretrained import trained_state
    from ludus.agents.lm.text_policy import TextLMPolicy, text_policy_from_snapshot
    from ludus.evaluation.evaluate import evaluate_policies
    from ludus.games.mix import mix_parts
    from ludus.league.rundata import read_run

    out = []
    for k, part in enumerate(mix_parts(read_run(run_dir).game_id)):
        policy = text_policy_from_snapshot(snapshot, expect_game=part.game_id)
        zeros = {name: torch.zeros_like(v) for name, v in trained_state(policy.model).items()}
        base = TextLMPolicy(policy.model, policy.tokenizer, policy.view, policy.play, adapters=zeros)
        (result,) = evaluate_policies(part.game_id, policy, {"base": base}, 2 * games, seed=seed + k,
                                      num_envs=min(2 * games, 64), threads=threads)
        legal = policy.counts["first_valid"] / max(policy.counts["turns"], 1)
        out.append((part.game_id, (result.score, result.lower, result.upper, legal)))
        print(f"  {part.game_id}: score {result.score:.3f} [{result.lower:.3f}, {result.upper:.3f}] over "
              f"{2 * games} games, first answers that counted {legal:.3f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="the run's --time-budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--games", type=int, default=0, help="games a seat against the base in each game (0: none)")
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="key=value on top of the preset (not for goal runs)")
    parser.add_argument("--read", type=Path, default=None, metavar="RUN",
                        help="no training: read a run this script trained before (its log gave the exit code and "
                             "minutes, passed again with --exited-after MINUTES)")
    parser.add_argument("--exited-after", type=float, default=None, help="with --read: the minutes it took")
    args = parser.parse_args()
    print(f"{host_line()}; load {os.getloadavg()}", flush=True)
    if args.read is not None:
        if args.exited_after is None:
            raise SystemExit("--read RUN needs --exited-after MINUTES (from the log of the run)")
        run_dir, code, wall = args.read, 0, 60 * args.exited_after
    else:
        run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="ludus-spiral-")) / "run"
        command = ["ludus", "train", PRESET, "--run", str(run_dir), "--time-budget", f"{args.minutes:g}m",
                   "--set", f"seed={args.seed}", "--set", "iterations=1000000", "--set", "log.wandb=disabled",
                   *[x for item in args.overrides for x in ("--set", item)]]
        print("$ " + " ".join(command), flush=True)
        start = time.monotonic()
        code = subprocess.run(command).returncode
        wall = time.monotonic() - start
    print(f"`ludus train` exited {code} after {wall / 60:.1f} min", flush=True)
    if code != 0:
        print(f"goal llm_spiral_mix_plays: exit {code} (target 0, a {args.minutes:g} min run) FAIL")
        raise SystemExit(1)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    seconds = [float(m["charts/iteration_seconds"]) for m in metrics if "charts/iteration_seconds" in m]
    trained, iterations = sum(seconds), len(seconds)
    newest, snapshot = newest_snapshot(run_dir)
    lines, complete = per_game_rows(run_dir)
    print(f"{iterations} iterations, {trained / 60:.1f} min of training; newest snapshot {newest}")
    print("\n".join(lines), flush=True)
    # the run stops at the iteration boundary after which the next would overrun the budget
    used = iterations > 0 and wall + max(seconds) >= 60 * args.minutes
    ok = complete and used
    if args.games > 0:
        threads = 2
        print(f"the newest snapshot against the base, {2 * args.games} games in each game alone:", flush=True)
        scores = versus_base(run_dir, snapshot, args.games, 7000 + args.seed, threads)
        worst = min(low for _, (_, low, _, _) in scores)
        print(f"goal llm_spiral_mix: worst lower bound against anchor:base {worst:.3f} (target > 0.5) "
              f"{'PASS' if worst > 0.5 else 'FAIL'}")
    print(f"goal llm_spiral_mix_plays: {wall / 60:.1f} min, {iterations} iterations, ratings and invalid-answer "
          f"rates per game {'complete' if complete else 'INCOMPLETE'} (target {args.minutes:g} min, complete) "
          f"{'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
