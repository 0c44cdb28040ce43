"""Connect four skill after a time-boxed `ludus train connect_four`: the main agent, with no search,
against random play and OpenSpiel's MCTS.

1. Train: runs the CLI, `ludus train connect_four --run DIR` (the preset as is; `--set` passes
   overrides through), for at most `--budget-seconds` of wall time (15 minutes by default). The
   preset is sized to finish inside that on a quiet 2-core machine; if it has not finished, the
   run is interrupted (SIGINT: the league closes cleanly) and the last checkpoint is evaluated.
2. Evaluate the main agent: the live learner 'main' at the last checkpoint (its weights exactly
   as training left them), acting from the policy net alone — greedy (argmax of the masked
   policy) by default, or sampling (`--mode sampling`). Opponents: `random`, and
   `make_bot("mcts-K(compiled=false)", spec)` (agents/bots/builtin.py: OpenSpiel's own C++ MCTS with random
   rollouts and MCTS-Solver; the league's anchors play the same search compiled for connect four,
   which plays the same distribution of moves, but the goals keep OpenSpiel's as their reference).
   The MCTS bot seeds its search afresh at every move from the runner's generator, so every game
   is a different game. Every opponent is played `--games-per-seat`
   times from each seat, on the league's own runners (`ProcessBackend`, one worker per core);
   results are reported per seat and overall, with Wilson 95% intervals, draws counting one half.
3. k*: the largest simulation count in {25, 50, 100, 200, 400, 800} the agent scores >= 50%
   against. MCTS gets stronger with more simulations, so the ladder climbs until the first
   count scored below 50% and stops there.

Goals: wins >= 95% of games against random; score >= 0.60 against MCTS-100 with the Wilson 95%
lower bound >= 0.50 (stretch: k* >= 200).

    python benchmarks/connect_four_skill.py [--budget-seconds 900] [--run DIR] [--set KEY=VALUE]
    python benchmarks/connect_four_skill.py --evaluate RUN_DIR      # evaluate an existing run only
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PRESET = "connect_four"
LADDER = (25, 50, 100, 200, 400, 800)
RANDOM_TARGET = 0.95
MCTS100_TARGET = 0.60
MAIN = "main"


@dataclass(frozen=True)
class SeatRecord:
    """Results of the evaluated agent from one seat (or from all seats: seat None)."""

    seat: int | None
    games: int
    wins: int
    draws: int
    losses: int
    score: float
    """(wins + draws / 2) / games."""
    lower: float
    upper: float
    """Wilson 95% interval of the score."""

    @property
    def win_rate(self) -> float:
        return self.wins / self.games


@dataclass(frozen=True)
class MatchupResult:
    """The evaluated agent against one opponent: per seat and overall."""

    opponent: str
    seats: tuple[SeatRecord, ...]
    overall: SeatRecord
    seconds: float


@dataclass(frozen=True)
class TrainingOutcome:
    """What the time-boxed training run did."""

    run_dir: Path
    seconds: float
    finished: bool
    """The preset's iterations all ran within the budget."""
    iteration: int
    """Iteration of the checkpoint that is evaluated."""
    iterations: int
    """Iterations the configuration asked for."""
    env_steps: int


def seat_record(outcomes: list[float], seat: int | None) -> SeatRecord:
    """Tally outcomes (1 win, 0.5 draw, 0 loss) into a SeatRecord with a Wilson interval."""
    from ludus.league.stats import wilson_interval

    games = len(outcomes)
    wins = sum(o == 1.0 for o in outcomes)
    losses = sum(o == 0.0 for o in outcomes)
    total = float(sum(outcomes))
    lower, upper = wilson_interval(total, games)
    return SeatRecord(seat, games, wins, games - wins - losses, losses, total / games if games else float("nan"),
                      lower, upper)


# ------------------------------------------------------------------------------------------ training


def train(run_dir: Path, budget_seconds: float, overrides: list[str]) -> TrainingOutcome:
    """`ludus train connect_four --run run_dir`, interrupted with SIGINT at the budget if still running."""
    command = [sys.executable, "-m", "ludus", "train", PRESET, "--run", str(run_dir)]
    for override in overrides:
        command += ["--set", override]
    print("$ " + " ".join(command[2:]), flush=True)
    start = time.monotonic()
    # A shell starts background jobs with SIGINT ignored and a child inherits that (Python then
    # installs no KeyboardInterrupt handler): restore the default so the budget's SIGINT stops it.
    process = subprocess.Popen(command, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    finished = True
    try:
        process.wait(timeout=budget_seconds)
    except subprocess.TimeoutExpired:
        finished = False
        # SIGINT raises KeyboardInterrupt in the manager: `League.close` stops the runners and
        # the last checkpoint (written atomically after every iteration) stays the run's state.
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    seconds = time.monotonic() - start
    if finished and process.returncode != 0:
        raise SystemExit(f"ludus train exited with code {process.returncode}")
    return read_training(run_dir, seconds, finished)


def read_training(run_dir: Path, seconds: float, finished: bool) -> TrainingOutcome:
    pointer = json.loads((run_dir / "checkpoint.json").read_text())
    state = json.loads((run_dir / pointer["path"] / "state.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    return TrainingOutcome(run_dir, seconds, finished, int(state["iteration"]), int(config["iterations"]),
                           int(state["total_env_steps"]))


def freeze_main(run_dir: Path, directory: Path) -> Path:
    """Save the live learner 'main' of the run's last checkpoint as a snapshot directory."""
    from safetensors.torch import load as safetensors_load

    from ludus.agents.nets import ActorCritic
    from ludus.agents.snapshot import Lineage, save_snapshot
    from ludus.games.registry import spec as game_spec
    from ludus.league.config import config_from_dict

    config = config_from_dict(json.loads((run_dir / "config.json").read_text()))
    pointer = json.loads((run_dir / "checkpoint.json").read_text())
    state = safetensors_load((run_dir / pointer["path"] / f"learner-{MAIN}.safetensors").read_bytes())
    spec = game_spec(config.game)
    net = ActorCritic(spec, config.net)
    # The learner's checkpoint holds the net under "net." next to the optimizer state.
    net.load_state_dict({key[len("net."):]: value for key, value in state.items() if key.startswith("net.")})
    save_snapshot(net, spec, config.net, directory, Lineage(role=MAIN, created_by="connect_four_skill"))
    return directory


# ---------------------------------------------------------------------------------------- evaluation


def evaluate(snapshot: Path, opponents: list[str], games_per_seat: int, greedy: bool, seed: int,
             workers: int, num_envs: int = 128) -> list[MatchupResult]:
    """The snapshot against each bot, `games_per_seat` games from each seat, on league runners."""
    from ludus.agents.nets import NetConfig
    from ludus.evaluation.evaluate import pair_seed
    from ludus.games.registry import spec as game_spec
    from ludus.league.play.backends import ProcessBackend
    from ludus.league.learners.base import ActorCriticArchitecture
    from ludus.league.records.ledger import outcomes_from_returns
    from ludus.league.records.population import Member
    from ludus.league.play.runner import MatchAssignment, PlayTask

    spec = game_spec("connect_four")
    candidate = Member("candidate", "snapshot", "evaluated", snapshot_path=str(snapshot.resolve()))
    members = [candidate] + [Member(f"bot:{name}", "anchor", "anchor", bot=name) for name in opponents]
    backend = ProcessBackend(spec.id, spec, ActorCriticArchitecture(NetConfig()), num_envs, cache_size=len(members),
                             num_workers=workers, seed=seed, log_dir=None)
    results = []
    try:
        backend.set_population(members)
        for index, name in enumerate(opponents):
            start = time.perf_counter()
            assignments = []
            for game in range(games_per_seat):
                for seat in range(spec.num_players):
                    players = tuple("candidate" if s == seat else f"bot:{name}" for s in range(spec.num_players))
                    assignments.append(MatchAssignment(len(assignments), pair_seed(seed, game), players, "evaluation"))
            # One task per worker; each task's sampling generator also seeds the MCTS searches.
            chunk = -(-len(assignments) // workers)
            tasks = [PlayTask(task_id=w, assignments=tuple(assignments[w * chunk:(w + 1) * chunk]),
                              sample_seed=pair_seed(seed, (1 << 30) + 1000 * index + w),
                              greedy=("candidate",) if greedy else ())
                     for w in range(workers) if assignments[w * chunk:(w + 1) * chunk]]
            played = [m for r in backend.collect(backend.submit(tasks, [])) for m in r.matches]
            by_seat: dict[int, list[float]] = {s: [] for s in range(spec.num_players)}
            for match in played:
                seat = match.assignment.players.index("candidate")
                by_seat[seat].append(outcomes_from_returns(match.returns, spec.team_of_seat)[seat])
            seats = tuple(seat_record(by_seat[s], s) for s in sorted(by_seat))
            overall = seat_record([o for s in sorted(by_seat) for o in by_seat[s]], None)
            results.append(MatchupResult(name, seats, overall, time.perf_counter() - start))
            print("  " + format_matchup(results[-1]), flush=True)
    finally:
        backend.close()
    return results


def format_record(r: SeatRecord) -> str:
    return (f"{r.games} games W/D/L {r.wins}/{r.draws}/{r.losses} score {r.score:.3f} "
            f"[{r.lower:.3f}, {r.upper:.3f}]")


def format_matchup(m: MatchupResult) -> str:
    seats = "; ".join(f"seat {r.seat}: {format_record(r)}" for r in m.seats)
    return f"vs {m.opponent:<9} overall {format_record(m.overall)} | {seats} ({m.seconds:.0f} s)"


def reference_mcts(simulations: int) -> str:
    """OpenSpiel's own MCTS with `simulations` per move, the opponent the goals are defined against."""
    return f"mcts-{simulations}(compiled=false)"


def ladder(snapshot: Path, games_per_seat: int, greedy: bool, seed: int, workers: int,
           known: dict[int, MatchupResult]) -> tuple[int | None, list[MatchupResult]]:
    """k*: climb the MCTS ladder until the first simulation count scored below 50%."""
    k_star, played = None, []
    for k in LADDER:
        result = known.get(k)
        if result is None:
            result = evaluate(snapshot, [reference_mcts(k)], games_per_seat, greedy, seed + k, workers)[0]
        played.append(result)
        if result.overall.score < 0.5:
            break
        k_star = k
    return k_star, played


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-seconds", type=float, default=900.0, help="wall-time cap of `ludus train`")
    parser.add_argument("--run", default=None, help="run directory to train into (default: a temporary one)")
    parser.add_argument("--evaluate", default=None, metavar="RUN_DIR", help="skip training; evaluate this run")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override passed to `ludus train` (repeatable)")
    parser.add_argument("--mode", choices=("greedy", "sampling"), default="greedy",
                        help="how the main agent picks moves from its policy (no search either way)")
    parser.add_argument("--games-per-seat", type=int, default=400, help="games per seat against random and MCTS-100")
    parser.add_argument("--ladder-games-per-seat", type=int, default=200,
                        help="games per seat against the other MCTS ladder levels")
    parser.add_argument("--workers", type=int, default=2, help="evaluation runner processes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    greedy = args.mode == "greedy"

    with tempfile.TemporaryDirectory(prefix="ludus-c4-skill-") as tmp:
        load_before = os.getloadavg()
        if args.evaluate:
            training = read_training(Path(args.evaluate), float("nan"), True)
        else:
            run_dir = Path(args.run) if args.run else Path(tmp) / "run"
            training = train(run_dir, args.budget_seconds, args.overrides)
        load_after = os.getloadavg()
        print(f"training: {training.seconds:.0f} s wall, iteration {training.iteration}/{training.iterations} "
              f"({'finished' if training.finished else 'stopped at the budget'}), {training.env_steps:,} board moves; "
              f"load average before/after {load_before[0]:.1f}/{load_after[0]:.1f} "
              f"(15-min {load_after[2]:.1f}) on {os.cpu_count()} cores", flush=True)
        snapshot = freeze_main(training.run_dir, Path(tmp) / "main-final")
        print(f"main agent: learner '{MAIN}' at iteration {training.iteration}, {args.mode}, no search", flush=True)
        vs_random, vs_mcts100 = evaluate(snapshot, ["random", reference_mcts(100)], args.games_per_seat, greedy,
                                         args.seed, args.workers)
        k_star, rungs = ladder(snapshot, args.ladder_games_per_seat, greedy, args.seed, args.workers,
                               known={100: vs_mcts100})
    print(f"ladder ({args.ladder_games_per_seat} games per seat, {args.games_per_seat} for mcts-100): "
          + ", ".join(f"mcts-{k} {r.overall.score:.3f}" for k, r in zip(LADDER, rungs)))
    print(f"k* = {k_star if k_star is not None else 'none (below 50% against mcts-25)'} "
          f"(largest MCTS simulation count in {{{', '.join(map(str, LADDER))}}} scored >= 50% against; "
          f"stretch >= 200)")
    random_rate = vs_random.overall.win_rate
    print(f"goal connect_four_vs_random: {random_rate:.3f} (target {RANDOM_TARGET:.2f}) "
          f"{'PASS' if random_rate >= RANDOM_TARGET else 'FAIL'}")
    mcts = vs_mcts100.overall
    ok = mcts.score >= MCTS100_TARGET and mcts.lower >= 0.5
    print(f"goal connect_four_vs_mcts100: {mcts.score:.3f} (target {MCTS100_TARGET:.2f}) {'PASS' if ok else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
