"""Rating progress on connect four: do the main agent's snapshots get better, by TrueSkill?

1. Trains a connect four league from the `connect_four` preset with `--set` overrides (by
   default 60 of its 1100 iterations, a snapshot every 60k learner steps instead of 250k and a
   rating share of 0.3 instead of 0.1, so a dozen main snapshots get enough rating games within
   a few minutes here); the preset itself is not changed. `--rate-only DIR` rates the run of a
   full `ludus train connect_four` (e.g. the one benchmarks/connect_four_skill.py --run DIR
   keeps) instead.
2. Reads the run's own TrueSkill ratings (`ludus.league.api.stored_ratings`: the ledger's ratings
   history, built from the league's rating matches only).
3. Rating-only round robin after training (unless --round-robin-games 0): every pair of the main
   agent's snapshots and the anchors plays `--round-robin-games` games (half with each player
   first, seeds spawned from --seed, both players sampling from their policies as in the league),
   on a league `Runner` in this process. The games are rated in a seeded random order into a
   `ludus.league.records.ratings.RatingTable` that starts from the run's stored ratings and uses the run's
   TrueSkill constants, i.e. they are more rating matches of the same league. Training
   exploiters' snapshots are left out (they are not the main agent). The same games rated alone,
   from the prior, are printed as an independent check.

Figures, from the final ratings (after the round robin when there is one; the run's stored
ratings are printed beside them):

* the Spearman rank correlation between snapshot index k of 'main@k' and its mu (target >= 0.8);
* the separation (mu - 3 sigma of the last main snapshot) - (mu + 3 sigma of the first,
  'main@0', the initial weights) (target > 0): the last one is better beyond doubt.

    python benchmarks/rating_progress.py [--seed 0] [--iterations 60] [--set key=value ...]
        [--round-robin-games 40] [--run DIR]    # --run keeps the run directory (else a temp dir)
    python benchmarks/rating_progress.py --rate-only DIR   # skip training, rate an existing run
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GOAL_SPEARMAN = 0.8
GOAL_SEPARATION = 0.0
DEFAULT_OVERRIDES = (
    # The main learner takes ~12k steps per iteration of the preset: a snapshot every ~5
    # iterations, a dozen over the default 60 iterations.
    "snapshot_every_steps=60000",
    # A third of the games are rating games (scheduled by rating uncertainty and match quality),
    # so each new snapshot's sigma shrinks before the next one arrives.
    "rating_share=0.3",
    "log.wandb=disabled", "log.tensorboard=false",
)


@dataclass(frozen=True)
class ProgressFigures:
    """The two goals, computed from one set of ratings."""

    snapshots: tuple[str, ...]
    """Main snapshots in index order."""
    mus: tuple[float, ...]
    sigmas: tuple[float, ...]
    spearman: float
    separation: float
    """(last mu - 3 sigma) - (first mu + 3 sigma)."""


def main_snapshots(members, role: str = "main") -> list[str]:
    """'main@k' player ids in index order."""
    ids = [m.player_id for m in members if m.kind == "snapshot" and m.role == role]
    return sorted(ids, key=lambda pid: int(pid.rsplit("@", 1)[1]))


def progress_figures(snapshots: list[str], ratings) -> ProgressFigures:
    from scipy.stats import spearmanr

    rated = [pid for pid in snapshots if pid in ratings]
    mus = [ratings[pid].mu for pid in rated]
    sigmas = [ratings[pid].sigma for pid in rated]
    index = [int(pid.rsplit("@", 1)[1]) for pid in rated]
    rho = float(spearmanr(index, mus).statistic) if len(rated) >= 3 else float("nan")
    first, last = ratings[rated[0]], ratings[rated[-1]]
    separation = (last.mu - 3 * last.sigma) - (first.mu + 3 * first.sigma)
    return ProgressFigures(tuple(rated), tuple(mus), tuple(sigmas), rho, separation)


def round_robin(run_dir: Path, players: list[str], games_per_pair: int, seed: int, num_envs: int = 256):
    """Every pair of `players` plays `games_per_pair` games (half from each seat). Returns the
    played matches, the ratings continued from the run's stored ones with these games, and the
    ratings from these games alone (every player from the prior: an independent check)."""
    from ludus.evaluation.evaluate import pair_seed, play_assignments
    from ludus.league.rundata import open_ledger, read_run, trueskill_params
    from ludus.games.registry import spec as game_spec
    from ludus.league.api import stored_ratings
    from ludus.league.records.ledger import MatchResult, SeatResult, outcomes_from_returns
    from ludus.league.records.population import load_member_policy
    from ludus.league.records.ratings import RatingTable
    from ludus.league.play.runner import MatchAssignment

    run = read_run(run_dir)
    spec = game_spec(run.game_id)
    members = {m.player_id: m for m in run.members}
    policies = {pid: load_member_policy(members[pid], spec) for pid in players}
    assignments = []
    pair = 0
    for i, a in enumerate(players):
        for b in players[i + 1:]:
            for k in range(games_per_pair):
                seats = (a, b) if k % 2 == 0 else (b, a)
                # Both seatings of a seed: the same opening sampling stream from each side.
                game_seed = pair_seed(seed, pair * games_per_pair + k // 2)
                assignments.append(MatchAssignment(len(assignments), game_seed, seats, "rating"))
            pair += 1
    matches = play_assignments(run.game_id, assignments, policies, sample_seed=pair_seed(seed, 1 << 40),
                               num_envs=num_envs)

    with open_ledger(run_dir) as store:
        params = trueskill_params(store, run.config)
    stored = stored_ratings(run_dir)
    continued = RatingTable.from_json({"params": params.to_json(),
                                       "ratings": [[pid, r.mu, r.sigma] for pid, r in stored.items()]})
    fresh = RatingTable(params)
    # TrueSkill updates depend on order; a seeded shuffle keeps any pair from being rated in one block.
    order = np.random.default_rng(seed).permutation(len(matches))
    for index in order.tolist():
        played = matches[index]
        outcomes = outcomes_from_returns(played.returns, spec.team_of_seat)
        seats = tuple(SeatResult(seat=s, team=spec.team_of_seat[s], player_id=pid,
                                 episode_return=float(played.returns[s]), outcome=outcomes[s])
                      for s, pid in enumerate(played.assignment.players))
        result = MatchResult(match_id=played.assignment.match_id, kind="rating", game_id=run.game_id,
                             seed=played.assignment.seed, seats=seats, length=played.length,
                             started_at=0.0, duration_s=0.0)
        continued.update(result)
        fresh.update(result)
    return matches, continued.as_dict(), fresh.as_dict()


def format_figures(title: str, figures: ProgressFigures) -> list[str]:
    lines = [title, f"  {'snapshot':<12} {'mu':>7} {'sigma':>6} {'mu-3s':>7} {'mu+3s':>7}"]
    for pid, mu, sigma in zip(figures.snapshots, figures.mus, figures.sigmas):
        lines.append(f"  {pid:<12} {mu:7.2f} {sigma:6.2f} {mu - 3 * sigma:7.2f} {mu + 3 * sigma:7.2f}")
    lines.append(f"  Spearman(index, mu) = {figures.spearman:.3f}; last mu-3s minus first mu+3s = "
                 f"{figures.separation:.2f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="more overrides of the connect_four preset (repeatable)")
    parser.add_argument("--backend", choices=["serial", "process"], default="process")
    parser.add_argument("--round-robin-games", type=int, default=40,
                        help="games per pair in the post-training round robin (0: stored ratings only)")
    parser.add_argument("--run", default=None, help="keep the run in this directory (must be new)")
    parser.add_argument("--rate-only", default=None, metavar="RUN_DIR",
                        help="do not train: rate the main snapshots of this existing run")
    args = parser.parse_args()

    from ludus.league.rundata import read_run
    from ludus.league.api import League, load_config, stored_ratings

    with tempfile.TemporaryDirectory() as tmp:
        if args.rate_only:
            run_dir = Path(args.rate_only)
            print(f"rating the existing run {run_dir} (no training)")
        else:
            run_dir = Path(args.run) if args.run else Path(tmp) / "run"
            overrides = [f"seed={args.seed}", f"iterations={args.iterations}", f"backend={args.backend}",
                         *( ["num_runners=2"] if args.backend == "process" else []),
                         *DEFAULT_OVERRIDES, *args.overrides]
            config = load_config("connect_four", overrides)
            print(f"training connect_four preset with --set {' --set '.join(overrides)}")
            load_before = os.getloadavg()
            start = time.perf_counter()
            league = League.create(config, run_dir)
            try:
                league.run()
                env_steps = league.total_env_steps
            finally:
                league.close()
            seconds = time.perf_counter() - start
            load_after = os.getloadavg()
            print(f"trained {config.iterations} iterations, {env_steps:,} env steps in {seconds:.0f} s "
                  f"({env_steps / seconds:,.0f} steps/s); load average before {load_before[0]:.1f}, "
                  f"after {load_after[0]:.1f} (1 min) on {os.cpu_count()} cores")

        run = read_run(run_dir)
        snapshots = main_snapshots(run.members)
        stored = stored_ratings(run_dir)
        stored_figures = progress_figures(snapshots, stored)
        print("\n".join(format_figures("the run's own ratings (league rating matches):", stored_figures)))
        figures = stored_figures
        if args.round_robin_games > 0:
            anchors = [m.player_id for m in run.members if m.kind == "anchor"]
            players = snapshots + anchors
            start = time.perf_counter()
            matches, final, fresh = round_robin(run_dir, players, args.round_robin_games, args.seed)
            print(f"round robin: {len(players)} players ({', '.join(players)}), {args.round_robin_games} games per "
                  f"pair, {len(matches):,} games in {time.perf_counter() - start:.0f} s, rated on top of the "
                  f"stored ratings")
            figures = progress_figures(snapshots, final)
            print("\n".join(format_figures("after the round robin:", figures)))
            for anchor in anchors:
                print(f"  {anchor}: mu {final[anchor].mu:.2f} sigma {final[anchor].sigma:.2f}")
            print("\n".join(format_figures("the round robin's games alone, rated from the prior (a check, not the "
                                            "goal):", progress_figures(snapshots, fresh))))

    # A Spearman rho is a ratio of small integers: compare it rounded, so 0.8 computed as
    # 0.7999999999 still counts as 0.8.
    rho_ok = round(figures.spearman, 9) >= GOAL_SPEARMAN
    sep_ok = figures.separation > GOAL_SEPARATION
    print(f"goal rating_progress_spearman: {figures.spearman:.3f} (target {GOAL_SPEARMAN}) "
          f"{'PASS' if rho_ok else 'FAIL'}")
    print(f"goal rating_progress_separation: {figures.separation:.2f} (target > {GOAL_SEPARATION:g}) "
          f"{'PASS' if sep_ok else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
