"""Metrics sinks: wandb, TensorBoard and a JSON-lines file in the run directory.

This is the one module that imports wandb. Keys are grouped like CleanRL's: `charts/`
(throughput, games), `losses/` (PPO statistics), `league/` (ratings, lag, queue, restarts).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ludus.errors import UserError


PHASES = ("matchmaking", "play", "record", "learn", "snapshot", "checkpoint")


class PhaseClock:
    """Wall time per phase of one iteration (Sample Factory's timed loop): `with clock("learn"): ...`.
    `on_enter(phase)`, if given, is told each phase as it starts (the progress line's heartbeat)."""

    def __init__(self, on_enter: Callable[[str], None] | None = None) -> None:
        self.phases = dict.fromkeys(PHASES, 0.0)
        self._start = time.perf_counter()
        self.on_enter = on_enter

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.on_enter is not None:
            self.on_enter(phase)
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.phases[phase] += time.perf_counter() - begin

    def total(self) -> float:
        return time.perf_counter() - self._start


@dataclass(frozen=True)
class IterationSummary:
    """What one league iteration did (returned by `League.step`, logged as metrics)."""

    iteration: int
    training_matches: int
    rating_matches: int
    env_steps: int
    seconds: float
    phase_seconds: dict[str, float]
    """Wall time per phase: matchmaking, play, record (ledger, ratings, payoff), learn, snapshot,
    checkpoint."""
    steps_per_second: float
    policy_lag: float
    dropped_transitions: int
    snapshots: tuple[str, ...]
    losses: dict[str, dict[str, float]]
    main_rating: tuple[float, float] | None
    """(mu, sigma) of the first role's newest snapshot, once it is rated."""
    episodic_return: float | None = None
    """Mean return of the learners' seats in this iteration's training matches."""
    episodic_length: float | None = None
    """Mean length of those matches."""


@dataclass(frozen=True)
class LeagueTotals:
    """Counts over the whole run at the end of an iteration."""

    iterations: int
    """The run's target number of iterations."""
    env_steps: int
    matches: int
    population: int
    runner_restarts: int
    queue_depth: int


def iteration_metrics(s: IterationSummary, totals: LeagueTotals, ratings: Mapping[str, float],
                      extra: Mapping[str, float]) -> dict[str, float]:
    """One iteration's scalars, keyed like CleanRL's (`ratings`: mu per rated player)."""
    metrics = {
        **extra,
        "charts/steps_per_second": s.steps_per_second,
        "charts/env_steps": float(totals.env_steps),
        "charts/matches": float(totals.matches),
        "charts/iteration_seconds": s.seconds,
        **{f"charts/{phase}_seconds": value for phase, value in s.phase_seconds.items()},
        "league/policy_lag": s.policy_lag,
        "league/dropped_transitions": float(s.dropped_transitions),
        "league/population": float(totals.population),
        "league/runner_restarts": float(totals.runner_restarts),
        "league/queue_depth": float(totals.queue_depth),
    }
    for pid, st in s.losses.items():
        for key, value in st.items():
            metrics[f"losses/{pid}/{key}"] = value
    for pid, mu in ratings.items():
        metrics[f"league/rating/{pid}"] = mu
    if s.main_rating:
        metrics["league/main_mu"] = s.main_rating[0]
    if s.episodic_return is not None:
        metrics["charts/episodic_return"] = s.episodic_return
        metrics["charts/episodic_length"] = s.episodic_length
    return metrics


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def progress_line(s: IterationSummary, totals: LeagueTotals, elapsed: float, eta: float | None,
                  width: int = 24) -> str:
    """The progress line of `ludus train` (without a line ending: a terminal redraws it in place)."""
    rating = f"{s.main_rating[0]:.1f}±{s.main_rating[1]:.1f}" if s.main_rating else "-"
    done = int(width * s.iteration / totals.iterations)
    return (f"[{'#' * done}{'.' * (width - done)}] it {s.iteration}/{totals.iterations} "
            f"{_duration(elapsed)} elapsed, ETA {_duration(eta) if eta is not None else '-'}  "
            f"{s.steps_per_second:,.0f} steps/s  games {totals.matches:,}  lag {s.policy_lag:.1f}  "
            f"main {rating}  pop {totals.population}")


class MetricsLogger:
    """Writes scalar metrics to every configured sink; `close()` flushes them."""

    def __init__(self, run_dir: str | os.PathLike, wandb_mode: str = "disabled", wandb_project: str = "ludus",
                 tensorboard: bool = False, run_name: str | None = None, config: dict | None = None,
                 resume: bool = False):
        self.run_dir = Path(run_dir)
        self.jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        self.tb = None
        self.wandb_run = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            # One chart of every member's rating and one of the learner against the anchors (the
            # Custom Scalars tab), instead of a chart per snapshot.
            self.tb.add_custom_scalars({"league": {
                "ratings (TrueSkill mu) of every member": ["Multiline", [r"league/rating/.*"]],
                "main learner's score against each anchor": ["Multiline", [r"eval/win_rate_vs_.*"]]}})
        mode = os.environ.get("WANDB_MODE", wandb_mode)
        if mode != "disabled":
            self.wandb_run = self._start_wandb(mode, wandb_project, run_name, config, resume)

    def _start_wandb(self, mode: str, project: str, run_name: str | None, config: dict | None, resume: bool):
        import wandb

        if mode == "online" and not os.environ.get("WANDB_API_KEY"):
            # With no key, wandb raises deep inside init; say what to do instead.
            mode = "offline"
        try:
            # silent, no console capture: the banner's one wandb line says where the run goes
            return wandb.init(project=project, name=run_name, dir=str(self.run_dir), mode=mode, config=config,
                              id=run_name, resume="allow" if resume else None, reinit="finish_previous",
                              settings=wandb.Settings(silent=True, console="off"))
        except wandb.errors.UsageError as exc:
            raise UserError(f"wandb could not start ({exc}); set --set log.wandb=disabled or WANDB_MODE=offline") \
                from None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record: dict[str, Any] = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.jsonl.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for key, value in metrics.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)

    def close(self) -> None:
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


PLAIN_PROGRESS_EVERY_S = 10.0
"""When stderr is not a terminal, a progress line at most this often (and at the last iteration)."""
HEARTBEAT_S = 15.0
"""A phase that runs this long without a progress line gets one saying what the run is doing
(a language model's first iteration plays and learns for minutes)."""
PHASE_WORDS = {"matchmaking": "planning matches", "play": "playing", "record": "recording", "learn": "learning",
               "snapshot": "snapshotting", "checkpoint": "checkpointing", "start": "starting the runners",
               "closing": "playing the closing rating round"}
"""What the heartbeat line says a phase is doing."""


class RunLog:
    """Where a league run reports: ``logs/manager.log``, the metric sinks (started on the first
    iteration, so creating or refusing a run never starts wandb) and the progress line."""

    def __init__(self, run_dir: Path, log_config: Any, run_config: dict, logger: logging.Logger):
        self.run_dir = run_dir
        self.log_config = log_config
        self.run_config = run_config
        self.logger = logger
        (run_dir / "logs").mkdir(exist_ok=True)
        self.handler = logging.FileHandler(run_dir / "logs" / "manager.log")
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(self.handler)
        logger.setLevel(logging.INFO)
        self.sinks: MetricsLogger | None = None
        self.terminal = sys.stderr.isatty()
        """Redraw one progress line in place (a terminal) or write plain lines (a log file, a pipe)."""
        self.started: float | None = None
        self.first_iteration = 0
        self.last_line = 0.0
        self.phase_name: str | None = None
        """The phase the loop is in (`PhaseClock` tells `phase`), and since when (monotonic)."""
        self.phase_started = 0.0
        self.phase_iteration = self.phase_total = 0
        self.lock = threading.Lock()
        """Serialises stderr writes of the loop and the heartbeat thread."""
        self.stop_heartbeat = threading.Event()
        self.heartbeat: threading.Thread | None = None
        self.width = 0
        """Length of the progress line on a terminal now (a shorter one is padded over it)."""
        self.startup = 0.0
        """Seconds spent starting the runners, left out of the ETA (a pace of iterations)."""

    def start(self, resume: bool, iteration: int = 0) -> None:
        self.started, self.first_iteration = time.monotonic(), iteration
        if self.sinks is None:
            c = self.log_config
            self.sinks = MetricsLogger(self.run_dir, wandb_mode=c.wandb, wandb_project=c.wandb_project,
                                       tensorboard=c.tensorboard, run_name=self.run_dir.name, config=self.run_config,
                                       resume=resume)
            if c.progress:
                sys.stderr.write(self.banner(resume) + "\n")
                sys.stderr.flush()
        if self.log_config.progress and self.heartbeat is None:
            self.last_line = time.monotonic()
            self.heartbeat = threading.Thread(target=self._beat, name="ludus-progress", daemon=True)
            self.heartbeat.start()

    def phase(self, name: str, iteration: int, iterations: int) -> None:
        """The loop enters phase `name` of iteration `iteration` (1-based) of `iterations`."""
        with self.lock:
            now = time.monotonic()
            if self.phase_name == "start":  # starting the runners (loading a model) is no iteration's pace
                self.startup += now - self.phase_started
            self.phase_name, self.phase_started = name, now
            self.phase_iteration, self.phase_total = iteration, iterations

    def _beat(self) -> None:
        """Every few seconds: when no progress line was written for `HEARTBEAT_S`, one saying which
        phase of which iteration runs, for how long, and the time since the start."""
        while not self.stop_heartbeat.wait(1.0):
            with self.lock:
                now = time.monotonic()
                if self.phase_name is None or now - self.last_line < HEARTBEAT_S:
                    continue
                line = (f"it {self.phase_iteration}/{self.phase_total} "
                        f"{PHASE_WORDS.get(self.phase_name, self.phase_name)} for {_duration(now - self.phase_started)}, "
                        f"{_duration(now - (self.started or now))} elapsed")
                sys.stderr.write(self._redrawn(line) if self.terminal else line + "\n")
                sys.stderr.flush()
                self.last_line = now

    def _redrawn(self, line: str) -> str:
        """`line` over the terminal's progress line, padded to cover a longer previous one."""
        text = "\r" + line.ljust(self.width) + "   "
        self.width = len(line)
        return text

    def banner(self, resume: bool) -> str:
        """Where this run's results go, said once when it starts."""
        run = self.run_dir
        lines = [f"ludus: {'resuming' if resume else 'training'} {run} ({self.run_config.get('game')}, "
                 f"{self.run_config.get('iterations')} iterations)",
                 f"  metrics      {run / 'metrics.jsonl'}   log {run / 'logs' / 'manager.log'}"]
        if self.sinks is not None and self.sinks.tb is not None:
            lines.append(f"  tensorboard  tensorboard --logdir {run / 'tensorboard'}")
        wandb_run = self.sinks.wandb_run if self.sinks is not None else None
        if wandb_run is None:
            lines.append("  wandb        disabled")
        else:
            mode = str(wandb_run.settings.mode)
            where = Path(wandb_run.dir).parent
            lines.append(f"  wandb        {mode}, {where}" + (f"   (upload: wandb sync {where})" if mode == "offline" else ""))
        return "\n".join(lines)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Extra scalars (e.g. a benchmark's evaluation) into the run's metric sinks."""
        if self.sinks is not None:
            self.sinks.log(step, metrics)

    def iteration(self, s: IterationSummary, totals: LeagueTotals, ratings: Mapping[str, float],
                  extra: Mapping[str, float]) -> None:
        self.log(totals.env_steps, iteration_metrics(s, totals, ratings, extra))
        self.logger.info("iteration %d: %d training + %d rating matches, %d steps, %.0f steps/s, lag %.2f, "
                         "snapshots %s", s.iteration, s.training_matches, s.rating_matches, s.env_steps,
                         s.steps_per_second, s.policy_lag, list(s.snapshots))
        if self.log_config.progress:
            now = time.monotonic()
            elapsed = now - (self.started or now)
            done = s.iteration - self.first_iteration
            eta = max(elapsed - self.startup, 0.0) / done * (totals.iterations - s.iteration) if done > 0 else None
            line = progress_line(s, totals, elapsed, eta)
            with self.lock:
                first = s.iteration == self.first_iteration + 1
                if self.terminal:
                    sys.stderr.write(self._redrawn(line))
                    self.last_line = now
                elif first or now - self.last_line >= PLAIN_PROGRESS_EVERY_S or s.iteration == totals.iterations:
                    sys.stderr.write(line + "\n")  # a log gets plain lines, every so often
                    self.last_line = now
                sys.stderr.flush()

    def note(self, text: str) -> None:
        """One line of its own on stderr (e.g. why the run stopped), after the progress line."""
        if self.log_config.progress:
            with self.lock:
                sys.stderr.write(("\n" if self.terminal else "") + text + "\n")
                sys.stderr.flush()
                self.last_line = time.monotonic()

    def end_progress(self) -> None:
        self.stop_heartbeat.set()
        if self.heartbeat is not None:
            self.heartbeat.join()
            self.heartbeat = None
        self.stop_heartbeat.clear()
        with self.lock:
            self.phase_name = None
        if self.log_config.progress and self.terminal:
            sys.stderr.write("\n")

    def close(self) -> None:
        if self.heartbeat is not None:  # the loop ended by an exception: stop the heartbeat too
            self.stop_heartbeat.set()
            self.heartbeat.join()
            self.heartbeat = None
        if self.sinks is not None:
            self.sinks.close()
            self.sinks = None
        self.logger.removeHandler(self.handler)
        self.handler.close()
