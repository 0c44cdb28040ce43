"""End-to-end league training on connect four against PettingZoo's random loop, in board moves per second per core.

The league side is everything `ludus train connect_four` does, through the same calls as the CLI
(`ludus.league.api.load_config` on the `connect_four` preset, `League.create`, `run`, `close`): the
initial snapshots, starting the runner processes, matchmaking, playing (the learners against
themselves, their snapshots and the anchor bots, random and MCTS), PPO updates, the ledger with
TrueSkill updates, payoff, snapshots, checkpoints and metric logging. The preset is used as is;
by default the whole run (the preset's 1100 iterations, ~15 minutes), so the figure is what users
get. `--iterations N` measures a shorter run, which is slower per move: early on PFSP sends the
young main agent to the MCTS anchors it still loses to, and their games cost search (measured
before the search was compiled: 0.84x over the first 40 iterations, the whole run faster). The rate is
the board moves of every match played (training and rating) divided by the wall time from
`League.create` to the end of `close`, and the goal divides that ratio by the cores the run used
(its manager and runner processes, at most the machine's cores): PettingZoo's loop is one
process.

The reference is PettingZoo's `connect_four_v3.env()` AEC loop with uniformly random legal moves
(`benchmarks/game_speed.py`'s `PettingZooRun`), measured for `--seconds` right before and right
after each training run, so load from other processes hits both alike; the ratio of a repeat
divides the league's rate by the mean of its two PettingZoo measurements, and the goal is the
median over repeats. For scale: RLlib's OpenSpiel self-play example trains at ~2% of that loop
on this kind of machine.

Where the time goes is read back from the run itself: the manager's phase timers (matchmaking,
waiting for play, record, learn, snapshot, checkpoint; with `pipeline_depth: 2` the runners play
the next iteration while the manager records and learns, so "play" is only the wait) and the
runners' busy time (the ledger stores each match's share of its runner task's wall time). The
CPU time of the manager and of its runner processes (`getrusage`) shows how busy the cores were,
and the MCTS anchors' share of it is estimated by searching again, with the anchor bot itself, the
positions of a sample of its matches from the run's ledger (`--search-sample` per anchor and match
kind; the mean time per move times the anchor's moves).

    python benchmarks/league_training_vs_pettingzoo.py [--iterations N] [--repeats 1] [--seconds 5] [--set key=value]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from game_speed import PettingZooRun  # noqa: E402

if TYPE_CHECKING:
    from ludus.league.config import LeagueConfig

GOAL = 1.0
"""Target of the per-core ratio (issue 19; stretch 2.0)."""
PRESET = "connect_four"
PHASES = ("matchmaking", "play", "record", "learn", "snapshot", "checkpoint")


@dataclass(frozen=True)
class TrainingRun:
    """One timed `ludus train connect_four` run."""

    iterations: int
    moves: int
    """Board moves of every match played (training and rating)."""
    matches: int
    seconds: float
    """Wall time from League.create to the end of close."""
    setup_seconds: float
    """Of which outside the iterations: League.create (ledger, initial snapshots), metrics
    start-up (wandb, TensorBoard) and close. The runner processes start inside iteration 1."""
    phase_seconds: dict[str, float]
    """Manager wall time per phase, summed over iterations."""
    runner_seconds: float
    """Runner busy time summed over runner tasks (from the ledger)."""
    learner_rows: int
    """Transitions the learners trained on (PPO batch rows, all learners)."""
    processes: int
    """The run's processes: the manager and its runners."""
    manager_cpu_seconds: float
    """CPU time (user + system) of the manager's process during the run."""
    runner_cpu_seconds: float
    """CPU time of the runner processes (the manager's children, counted when they exit at close)."""
    search_seconds: dict[str, float]
    """Estimated CPU seconds of the MCTS anchors' moves, per 'kind anchor' (e.g. 'training mcts-100')."""

    @property
    def moves_per_second(self) -> float:
        return self.moves / self.seconds


def _cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def train_once(iterations: int | None, run_dir: Path, overrides: list[str], search_sample: int) -> TrainingRun:
    """`ludus train connect_four --set iterations=N --run run_dir`, timed, without printing the status table."""
    from ludus.league import api
    from ludus.league.manager import League

    config = api.load_config(PRESET, ([f"iterations={iterations}"] if iterations is not None else []) + overrides)
    phases = dict.fromkeys(PHASES, 0.0)
    iteration_seconds = [0.0]
    rows = [0]

    def on_iteration(summary) -> None:
        for phase, value in summary.phase_seconds.items():
            phases[phase] = phases.get(phase, 0.0) + value
        iteration_seconds[0] += summary.seconds
        rows[0] += int(sum(stats.get("batch_size", 0) for stats in summary.losses.values()))

    cpu_before = _cpu_seconds(resource.RUSAGE_SELF), _cpu_seconds(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    league = League.create(config, run_dir)
    league.on_iteration.append(on_iteration)
    try:
        league.run()
    finally:
        league.close()
    seconds = time.perf_counter() - start
    manager_cpu = _cpu_seconds(resource.RUSAGE_SELF) - cpu_before[0]
    runner_cpu = _cpu_seconds(resource.RUSAGE_CHILDREN) - cpu_before[1]
    moves, matches, runner_seconds = _ledger_totals(run_dir)
    if moves != league.total_env_steps:
        raise AssertionError(f"ledger holds {moves} moves, the league counted {league.total_env_steps}")
    return TrainingRun(iterations=config.iterations, moves=moves, matches=matches, seconds=seconds,
                       setup_seconds=seconds - iteration_seconds[0],
                       phase_seconds=phases, runner_seconds=runner_seconds, learner_rows=rows[0],
                       processes=1 + (config.num_runners if config.backend != "serial" else 0),
                       manager_cpu_seconds=manager_cpu, runner_cpu_seconds=runner_cpu,
                       search_seconds=_search_seconds(run_dir, config, search_sample))


def _ledger_totals(run_dir: Path) -> tuple[int, int, float]:
    """(moves, matches, runner seconds) of every match in the run's ledger."""
    from ludus.league.records.ledger import Store

    moves = matches = 0
    runner_seconds = 0.0
    with Store.open(run_dir, mode="read") as store:
        for stored in store.iter_matches():
            result = stored.result
            moves += result.length
            matches += 1
            runner_seconds += result.duration_s
    return moves, matches, runner_seconds


def _search_seconds(run_dir: Path, config: LeagueConfig, sample: int) -> dict[str, float]:
    """Estimated CPU seconds of every MCTS anchor's moves in the run, per match kind: up to `sample`
    of its matches (drawn with a fixed seed) are replayed from the ledger and each of the anchor's
    moves is searched again by the bot itself (`MCTSBot.act` on batches of up to 256 rows, as a
    runner calls it); the mean time per move is scaled to all of the anchor's moves."""
    from ludus.agents.bots.builtin import MCTSBot, make_bot
    from ludus.agents.policy import ActBatch
    from ludus.games.registry import spec as game_spec
    from ludus.league.founders import founding_members
    from ludus.league.records.ledger import Store

    spec = game_spec(config.game)
    bots = {m.player_id: (m.bot, make_bot(m.bot, spec)) for m in founding_members(config, spec) if m.bot}
    searchers = {player: named for player, named in bots.items() if isinstance(named[1], MCTSBot)}
    plays: dict[tuple[str, str], list[tuple[int, tuple[int, ...]]]] = defaultdict(list)
    with Store.open(run_dir, mode="read") as store:
        for stored in store.iter_matches():
            result = stored.result
            for seat in result.seats:
                if seat.player_id in searchers:
                    plays[(result.kind, seat.player_id)].append((seat.seat, result.moves))
    rng = np.random.default_rng(0)
    estimates = {}
    for (kind, player), matches in sorted(plays.items()):
        anchor, bot = searchers[player]
        game = bot.game  # the bot's own pyspiel game: positions are rebuilt as it rebuilds them
        masks, seats, histories = [], [], []
        for index in rng.choice(len(matches), size=min(sample, len(matches)), replace=False).tolist():
            seat, moves = matches[index]
            state = game.new_initial_state()
            for ply, action in enumerate(moves):
                if state.current_player() == seat:
                    mask = np.zeros(spec.num_actions, dtype=bool)
                    mask[state.legal_actions()] = True
                    masks.append(mask)
                    seats.append(seat)
                    histories.append(tuple(moves[:ply]))
                state.apply_action(int(action))
        # one call per runner-sized batch of those positions, as a runner asks the bot
        begin = time.perf_counter()
        for start in range(0, len(masks), 256):
            rows = slice(start, start + 256)
            bot.act(ActBatch(obs=np.zeros((len(masks[rows]), *spec.observation_shape), dtype=np.float32),
                             mask=np.stack(masks[rows]), seats=np.array(seats[rows]), histories=histories[rows]), rng)
        timed_seconds, timed = time.perf_counter() - begin, len(masks)
        # the anchor's moves in all of its matches: the plies its seat was to move
        total = 0
        for seat, moves in matches:
            state = game.new_initial_state()
            for action in moves:
                total += state.current_player() == seat
                state.apply_action(int(action))
        estimates[f"{kind} {anchor}"] = timed_seconds / max(timed, 1) * total
    return estimates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=None,
                        help="league iterations per training run (default: the preset's own count)")
    parser.add_argument("--repeats", type=int, default=1, help="training runs, each between two PettingZoo measurements")
    parser.add_argument("--seconds", type=float, default=5.0, help="PettingZoo seconds per measurement")
    parser.add_argument("--search-sample", type=int, default=200,
                        help="matches per MCTS anchor and match kind whose anchor moves are searched again "
                             "to estimate the anchors' CPU time")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="a config override for the preset, key=value (e.g. inference_dtype=bfloat16)")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    rng = np.random.default_rng(0)
    pettingzoo = PettingZooRun(rng)
    pettingzoo.measure(1.0)  # warm-up
    ratios, runs, pz_rates = [], [], []
    before = pettingzoo.measure(args.seconds)
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="ludus-c4-train-") as tmp:
            run = train_once(args.iterations, Path(tmp) / "run", args.overrides, args.search_sample)
        after = pettingzoo.measure(args.seconds)
        reference = (before + after) / 2
        ratios.append(run.moves_per_second / reference)
        runs.append(run)
        pz_rates += [before, after]
        print(f"repeat {repeat + 1}: league training {run.moves_per_second / 1e3:.1f}k moves/s "
              f"({run.moves:,} moves, {run.matches:,} matches, {run.iterations} iterations in {run.seconds:.1f} s)  "
              f"pettingzoo {before / 1e3:.1f}k / {after / 1e3:.1f}k moves/s before/after  "
              f"ratio {ratios[-1]:.2f}x  load {os.getloadavg()[0]:.1f}", flush=True)
        before = after
    run = runs[len(runs) // 2]
    print(f"profile of repeat {len(runs) // 2 + 1} (manager wall time; runners work in their own processes):")
    print(f"  outside iterations (create, metrics start-up, close): {run.setup_seconds:.1f} s")
    for phase in PHASES:
        seconds = run.phase_seconds.get(phase, 0.0)
        print(f"  {phase:<12} {seconds:6.1f} s  {seconds / run.seconds:5.1%}")
    print(f"  runners busy {run.runner_seconds:.1f} s ({run.moves / max(run.runner_seconds, 1e-9) / 1e3:.1f}k moves/s "
          f"while playing); learners trained on {run.learner_rows:,} transitions "
          f"({run.learner_rows / max(run.phase_seconds['learn'], 1e-9) / 1e3:.1f}k rows/s of learn phase)")
    cpu = run.manager_cpu_seconds + run.runner_cpu_seconds
    usable = run.seconds * min(len(os.sched_getaffinity(0)), run.processes)
    print(f"  CPU: manager {run.manager_cpu_seconds:.1f} s, runners {run.runner_cpu_seconds:.1f} s; the cores were "
          f"busy {cpu / usable:.0%} of the run")
    search = sum(run.search_seconds.values())
    print(f"  MCTS anchors' search (estimated): {search:.0f} s, {search / max(cpu, 1e-9):.0%} of the run's CPU time ("
          + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in run.search_seconds.items()) + ")")
    ratio = float(np.median(ratios))
    # The run's processes (the manager and its runners) share the machine's cores; PettingZoo's
    # loop is one process on one core.
    processes = run.processes
    cores = min(len(os.sched_getaffinity(0)), processes)
    print(f"league training: {np.median([r.moves_per_second for r in runs]) / 1e3:.1f}k moves/s; "
          f"PettingZoo random loop: {np.median(pz_rates) / 1e3:.1f}k moves/s")
    print(f"whole machine: {ratio:.2f}x PettingZoo's one-process loop; the run used {cores} cores "
          f"({processes} processes)")
    per_core = ratio / cores
    print(f"goal league_training_per_core_vs_pettingzoo: {per_core:.2f}x (target {GOAL:.1f}x, stretch 2.0x) "
          f"{'PASS' if per_core >= GOAL else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
