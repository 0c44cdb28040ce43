"""Team leagues: MAPPO vs IPPO on predator-prey (simple_tag), and whether each side's ratings rise.

For each seed, two leagues train the `simple_tag` preset (predators and prey, each a rated
population; the predators draw prey snapshots by PFSP, the prey draws predator snapshots
uniformly) for its 300 iterations of 256 matches (9.6M steps, ~5 min with two at a time):
one with `learner=mappo` (centralised critics on the seat's own observation and the game's
global state), one with `learner=ippo` (the same learner, each critic on the row's own
observation). Each run is a process with one torch thread, two at a time.

Cross-play: the final predators of each league (the live learners' actors) play against every
prey snapshot of both leagues, on the same game seeds and sampling streams (duplicate games:
each (prey, seed) is played once by MAPPO's predators and once by IPPO's). A seed's figure is the
mean over those pairs of the predators' catch reward (a predator's return: +10 per tag, -10 for an
episode without one) of MAPPO's minus IPPO's; the goal's figure is the mean over seeds with a 95%
Student-t interval over seeds (the interval over all pairs, which takes each training run as
given, is printed beside it).

Ratings, in the team-vs-team presets trained with MAPPO: the Spearman correlation between a
side's snapshot index k and its TrueSkill mu from the run's rating matches, for each side of
simple_tag ('predators@k', 'prey@k') and for `tic_tac_toe_2v2` (2v2 tic-tac-toe, games/builtin/teams.py,
whose one role 'main' plays both sides).

    python benchmarks/team_leagues.py [--seeds 0 1 ... 31] [--games 40] [--set K=V] [--set-2v2 K=V]

Thirty-two seeds by default: ~3.7 hours on two cores, measured as two sixteen-seed runs (6696 s
and 6794 s on a host without AMX tiles, each with CI beside it for 45-75 minutes; less alone).
The training run is the unit of chance: a seed's figure spreads by ~6 catch reward over seeds
against a mean MAPPO lead of ~2.5-4, so the t interval's half-width, ~2.04 x 6 / sqrt(seeds), is
~3.2 at sixteen seeds and ~2.2 at thirty-two (docs/league.md).

Ends with ``goal mappo_vs_ippo_tag: <diff> [low, high] (target: interval above 0) PASS|FAIL`` and
``goal team_rating_progress: <worst side's Spearman> (target 0.8) PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

GAME = "simple_tag"
FINAL = "final-predators"
TARGET_SPEARMAN = 0.8


def train(preset: str, learner: str, seed: int, root: str, overrides: list[str]) -> str:
    import torch

    from ludus.league.api import League, load_config

    torch.set_num_threads(1)
    run_dir = Path(root) / f"{preset}-{learner}-{seed}"
    config = load_config(preset, [f"learner={learner}", f"seed={seed}", "log.wandb=disabled",
                                  "log.tensorboard=false", "log.progress=false", *overrides])
    from ludus.agents.snapshot import Lineage

    league = League.create(config, run_dir)
    try:
        league.run()
        if "predators" in league.learners:
            # the final predators: the live learner's actor, frozen beside the run
            league.learners["predators"].impl.freeze(run_dir / FINAL, Lineage(role="predators", created_by="benchmark"))
    finally:
        league.close()
    return str(run_dir)


def side_snapshots(run_dir: Path, role: str) -> list[str]:
    from ludus.league.rundata import read_run

    ids = [m.player_id for m in read_run(run_dir).members if m.kind == "snapshot" and m.role == role]
    return sorted(ids, key=lambda pid: int(pid.rsplit("@", 1)[1]))


def spearman(run_dir: Path, role: str) -> float:
    from scipy.stats import spearmanr

    from ludus.league.api import stored_ratings

    ratings = stored_ratings(run_dir)
    rated = [pid for pid in side_snapshots(run_dir, role) if pid in ratings]
    if len(rated) < 3:
        return float("nan")
    return float(spearmanr([int(p.rsplit("@", 1)[1]) for p in rated], [ratings[p].mu for p in rated]).statistic)


def cross_play(runs: dict[str, Path], games: int, seed: int) -> np.ndarray:
    """Per (prey snapshot, game seed): MAPPO's predators' catch reward minus IPPO's."""
    from ludus.agents.snapshot import policy_from_snapshot
    from ludus.evaluation.evaluate import pair_seed, play_assignments
    from ludus.league.records.population import load_member_policy
    from ludus.league.rundata import read_run
    from ludus.league.play.runner import MatchAssignment
    from ludus.games.registry import spec as game_spec

    spec = game_spec(GAME)
    policies, prey = {}, []
    for name, run_dir in runs.items():
        members = {m.player_id: m for m in read_run(run_dir).members}
        policies[f"{name}:predators"] = policy_from_snapshot(run_dir / FINAL, expect_game=GAME)
        for pid in side_snapshots(run_dir, "prey"):
            policies[f"{name}:{pid}"] = load_member_policy(members[pid], spec)
            prey.append(f"{name}:{pid}")
    assignments = []
    for p in prey:
        for k in range(games):
            for predators in ("mappo:predators", "ippo:predators"):
                assignments.append(MatchAssignment(len(assignments), pair_seed(seed, k), (predators,) * 3 + (p,),
                                                   "evaluation"))
    matches = sorted(play_assignments(GAME, assignments, policies, sample_seed=pair_seed(seed, 1 << 30),
                                      num_envs=256), key=lambda m: m.assignment.match_id)
    catch = np.array([m.returns[0] for m in matches], dtype=np.float64).reshape(-1, 2)
    return catch[:, 0] - catch[:, 1]


def seed_interval(per_seed: list[float]) -> tuple[float, float, float]:
    """Mean of the seeds' figures and its 95% Student-t interval over seeds. The training run is
    the unit of chance here: one seed's pairs share its predators and prey, and the seeds' means
    differ far more than its pairs' interval says (docs/league.md)."""
    from scipy.stats import t

    x = np.asarray(per_seed, dtype=np.float64)
    if len(x) < 2:
        return float(x.mean()), float("-inf"), float("inf")
    half = float(t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return float(x.mean()), float(x.mean()) - half, float(x.mean()) + half


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(32)))
    parser.add_argument("--games", type=int, default=40, help="games per (prey snapshot, predators)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="simple_tag preset overrides (key=value; roles by name, e.g. roles.prey.uniform=0.5)")
    parser.add_argument("--set-2v2", dest="overrides_2v2", action="append", default=[],
                        help="tic_tac_toe_2v2 preset overrides (key=value)")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"simple_tag preset{' with ' + ' '.join(args.overrides) if args.overrides else ''}, "
          f"learners mappo and ippo, seeds {args.seeds}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    diffs, rhos = [], []
    with tempfile.TemporaryDirectory(prefix="ludus-tag-") as root, \
            ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = {(learner, seed): pool.submit(train, GAME, learner, seed, root, args.overrides)
                for seed in args.seeds for learner in ("mappo", "ippo")}
        teams = {seed: pool.submit(train, "tic_tac_toe_2v2", "mappo", seed, root, args.overrides_2v2) for seed in args.seeds}
        for seed in args.seeds:
            runs = {learner: Path(jobs[(learner, seed)].result()) for learner in ("mappo", "ippo")}
            d = cross_play(runs, args.games, seed=1000 + seed)
            diffs.append(d)
            sides = {role: spearman(runs["mappo"], role) for role in ("predators", "prey")}
            rhos.extend(sides.values())
            print(f"seed {seed}: MAPPO - IPPO predators' catch reward {d.mean():+.2f} over {len(d)} pairs; "
                  f"MAPPO league Spearman(index, mu): predators {sides['predators']:.3f}, prey {sides['prey']:.3f}; "
                  f"IPPO league: predators {spearman(runs['ippo'], 'predators'):.3f}, "
                  f"prey {spearman(runs['ippo'], 'prey'):.3f}", flush=True)
        for seed in args.seeds:
            rho = spearman(Path(teams[seed].result()), "main")
            rhos.append(rho)
            print(f"seed {seed}: tic_tac_toe_2v2 (MAPPO) Spearman(index, mu) of main: {rho:.3f}", flush=True)
    from ludus.evaluation.negotiation import mean_interval

    d = np.concatenate(diffs)
    pairs = mean_interval(d)
    print(f"over all {len(d)} pairs: {pairs.mean:+.3f} [{pairs.low:+.3f}, {pairs.high:+.3f}] "
          f"(counts each training run as fixed)")
    mean, low, high = seed_interval([float(x.mean()) for x in diffs])
    print(f"wall {time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.2f}")
    print(f"goal mappo_vs_ippo_tag: {mean:+.3f} [{low:+.3f}, {high:+.3f}] (mean of {len(diffs)} seeds, t interval "
          f"over seeds; target: interval above 0) {'PASS' if low > 0 else 'FAIL'}")
    worst = float(np.nanmin(rhos)) if not all(np.isnan(rhos)) else float("nan")
    print(f"goal team_rating_progress: {worst:.3f} (worst side of simple_tag and tic_tac_toe_2v2 over seeds "
          f"{args.seeds}; target {TARGET_SPEARMAN}) "
          f"{'PASS' if worst >= TARGET_SPEARMAN else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
