"""The league loop: plan -> play -> record -> learn -> snapshot -> checkpoint (docs/league.md).

Each phase is one timed call into its own module: plan (league/planner.py: opponents, rating
matches, match ids and seeds, runner shards), play (league/play/backends.py: serial, processes or Ray,
the same results), record (league/records/recorder.py: ledger, TrueSkill ratings, payoff table), learn and
snapshot (league/learners/learning.py; exploiters reset as in AlphaStar; hooks on `on_population_change`,
e.g. evaluation's PSRO exploitability, add metrics), checkpoint (league/checkpoint.py: everything a
resume needs, written atomically).

In asynchronous mode (`pipeline_depth: 2`) iteration i+1 is planned and handed to the runners
right after iteration i's play, with the weights of before i's update; that plan is part of the
checkpoint, so a resume replays exactly what the uninterrupted run played. Only this loop writes
to the run directory; it holds the ledger's exclusive writer lock.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ludus.games.core import GameSpec
from ludus.games.registry import spec as game_spec
from ludus.league.play.backends import Backend, ProcessBackend, SerialBackend
from ludus.league.checkpoint import (CHECKPOINT_POINTER, CONFIG_FILE, CheckpointState, LearnerState, PendingPlay, RunError,
                               building_run, checked_run, clean_stale_temporaries, config_digest, ledger_mark,
                               read_learner_tensors, write_checkpoint)
from ludus.league.config import LeagueConfig, config_from_dict, config_to_dict, registering_module
from ludus.league.founders import BASE_ANCHOR, base_anchor, founding_members
from ludus.league.learners.base import LeagueLearner, PolicyArchitecture
from ludus.league.learners.learning import Learner, due_for_snapshot, freeze, learn, make_learner, reset, reset_due, track_gain
from ludus.league.records.ledger import Store
from ludus.league.metrics import IterationSummary, LeagueTotals, PhaseClock, RunLog
from ludus.league.output import write_output_policy
from ludus.league.records.payoff import PayoffTable
from ludus.league.planner import LeagueView, Planner
from ludus.league.records.population import Member, Population, with_absolute_paths
from ludus.league.records.ratings import RatingTable, TrueSkillParams, ensure_params
from ludus.league.records.recorder import Recorder
from ludus.league.play.runner import PlayTask
from ludus.league.seeds import INIT_WEIGHTS, LEARNER, MATCHMAKING, rng_from_json, rng_to_json, stream_seed
from ludus.files import atomic_write_json

__all__ = ["League", "IterationSummary", "RunError", "CHECKPOINT_POINTER", "CONFIG_FILE"]
log = logging.getLogger("ludus.league")

InFlight = tuple[PendingPlay, Any]
"""Tasks with the runners, the weights they were sent with, and the backend's handle."""


# The choice among the backends sits here, above league/play/backends.py: the Ray backend builds on
# that module, so the module cannot name it back.
def make_backend(config, spec: GameSpec, architectures: Mapping[str, PolicyArchitecture], members: list[Member],
                 log_dir: str) -> Backend:
    """The backend `config.backend` names (a LeagueConfig), holding `members` for its runners;
    `architectures`: each learner's, by player id (the first is the runners' default)."""
    default = next(iter(architectures.values()))
    common = dict(game_id=config.game, spec=spec, architecture=default, num_envs=config.num_envs,
                  cache_size=config.policy_cache_size, seed=config.seed, runner_threads=config.runner_threads,
                  inference_dtype=config.inference_dtype,
                  learner_architectures={pid: a for pid, a in architectures.items() if a != default})
    if config.backend == "serial":
        backend: Backend = SerialBackend(**common)
    elif config.backend == "process":
        backend = ProcessBackend(**common, num_workers=config.num_runners, log_dir=log_dir)
    else:
        from ludus.league.play.ray_backend import RayBackend  # Ray is imported only by runs that use it

        backend = RayBackend(**common, num_workers=config.num_runners, address=config.ray_address)
    backend.set_population(members)
    return backend


class League:
    """A league run. `League.create(config, run_dir)` or `League.resume(run_dir)`, then `run()`."""

    def __init__(self, config: LeagueConfig, run_dir: Path, store: Store):
        self.config = config
        torch.set_num_threads(config.torch_threads)
        # Adam's second-moment estimates decay into denormal floats, which CPUs process ~100x
        # slower (measured here: sqrt of denormals 0.16 s vs 0.0016 s); flush them to zero.
        torch.set_flush_denormal(True)
        self.spec: GameSpec = game_spec(config.game)
        params = ensure_params(store, TrueSkillParams(draw_probability=max(config.draw_probability, 1e-6)))
        self.recorder = Recorder(store, self.spec, Population(), PayoffTable(config.payoff_decay), RatingTable(params))
        self.planner = Planner(config, self.spec, run_dir)
        self.run_dir = run_dir
        self.learners: dict[str, Learner] = {}
        self.iteration = self.next_match_id = self.total_env_steps = self.total_matches = 0
        self.rng = np.random.default_rng(stream_seed(config.seed, MATCHMAKING))
        self.backend: Backend | None = None
        self.metrics: RunLog | None = None
        self.on_iteration: list[Callable[[IterationSummary], None]] = []
        self.on_population_change: list[Callable[["League"], dict[str, float]]] = []
        """Called after new snapshots join; the metrics they return are logged with the iteration."""
        self._checkpoint_seq = 0
        """Ledger seq at the last checkpoint: later matches belong to an interrupted iteration."""
        self.closing_rated = False
        """Whether the run's closing rating round is recorded (`_closing_round`)."""
        self._in_flight: PendingPlay | None = None
        self.stopped_by_budget = False
        """Whether the last `run` stopped on its time budget before its last iteration."""
        self.ranks = None
        """The helper ranks of data-parallel learners (learner_backend.ranks > 1; league/learners/ranks.py)."""
        if config.learner_backend.ranks > 1:
            from ludus.league.learners.ranks import RankGroup

            self.ranks = RankGroup(config, config.learner_backend.ranks)

    population = property(lambda self: self.recorder.population)
    payoff = property(lambda self: self.recorder.payoff)
    ratings = property(lambda self: self.recorder.ratings)
    store = property(lambda self: self.recorder.store)

    # ----------------------------------------------------------------------------- creation

    @classmethod
    def create(cls, config: LeagueConfig, run_dir: str | os.PathLike) -> "League":
        """Start a new run in `run_dir` (must be new or empty); nothing is left there if it fails."""
        run_dir = Path(run_dir)
        config_from_dict(config_to_dict(config))  # validate the game id before touching the disk
        if not config.game_module:  # a game registered in Python: the CLI imports its module to read the run
            config = replace(config, game_module=registering_module(config.game))
        with building_run(run_dir) as building:
            store = Store.open(building, mode="write")
            try:
                league = cls(config, building, store)
                atomic_write_json(building / CONFIG_FILE, config_to_dict(config))
                store.set_meta("config", config_to_dict(config))
                league._found()
                league._checkpoint()
            finally:
                store.close()
        # every path the league keeps is relative to its run directory: carry on there
        league.run_dir = league.planner.run_dir = run_dir
        league.recorder.store = Store.open(run_dir, mode="write")
        league.metrics = RunLog(run_dir, config.log, config_to_dict(config), log)
        return league

    @classmethod
    def resume(cls, run_dir: str | os.PathLike) -> "League":
        """Continue a run from its last checkpoint; the result equals an uninterrupted run."""
        run_dir = Path(run_dir)
        config, directory, state = checked_run(run_dir)
        store = Store.open(run_dir, mode="write")
        try:
            league = cls(config, run_dir, store)
            league._restore(directory, state)
            clean_stale_temporaries(run_dir)
            league.metrics = RunLog(run_dir, config.log, config_to_dict(config), log)
        except BaseException:
            store.close()
            raise
        return league

    def _found(self) -> None:
        """Anchors and seeded members, then one learner per role, each frozen once: its first
        snapshot is its initial weights (what league exploiters are reset to)."""
        for member in founding_members(self.config, self.spec):
            self.recorder.add_member(member)
        for index, role in enumerate(self.config.roles):
            learner = self.learners[role.name] = Learner(role, self._make_learner_impl(index), LearnerState())
            self.recorder.add_member(Member(role.name, "learner", role.name))
            first = self._freeze(learner)
            if index == 0 and BASE_ANCHOR in self.config.anchors:
                self.recorder.add_member(base_anchor(self.population[first]))

    def _make_learner_impl(self, index: int) -> LeagueLearner:
        return make_learner(self.spec, self.config, index, seed=stream_seed(self.config.seed, LEARNER, index),
                            init_seed=stream_seed(self.config.seed, INIT_WEIGHTS, index), ranks=self.ranks)

    def _make_backend(self) -> Backend:
        architectures = {pid: learner.impl.architecture for pid, learner in self.learners.items()}
        return make_backend(self.config, self.spec, architectures, with_absolute_paths(self.population.frozen(), self.run_dir),
                            str(self.run_dir / "logs"))

    # ----------------------------------------------------------------------------- the loop

    def step(self, pending: InFlight | None = None, prefetch: bool = False,
             matches: int | None = None) -> tuple[IterationSummary, InFlight | None]:
        """Run one iteration. With `prefetch` (async mode) the next iteration's tasks are submitted
        before learning, so runners play them with the current (soon one version old) weights.
        `matches`: this iteration's training matches, if not the config's `matches_per_iteration`
        (a run on a wall clock ends with a shorter iteration: benchmarks/lm_training.py)."""
        if matches is not None and pending is not None:
            raise RunError("an iteration whose matches were planned already cannot be resized")
        clock = PhaseClock(on_enter=lambda phase: self.metrics.phase(phase, self.iteration + 1, self.config.iterations))
        if self.backend is None:
            self.metrics.phase("start", self.iteration + 1, self.config.iterations)
            self.backend = self._make_backend()
        if pending is None:
            with clock("matchmaking"):
                tasks = self._plan(self.iteration, matches)
            with clock("play"):
                pending = self._submit(tasks)
        with clock("play"):
            results = self.backend.collect(pending[1])
        nxt, self._in_flight = None, None
        if prefetch and self.iteration + 1 < self.config.iterations:
            with clock("matchmaking"):
                tasks = self._plan(self.iteration + 1)
            with clock("play"):
                nxt = self._submit(tasks)
            self._in_flight = nxt[0]  # kept in the checkpoint: a resume replays exactly these tasks
        with clock("record"):
            recorded = self.recorder.record(results, self.learners, self._checkpoint_seq, self.iteration + 1)
        with clock("learn"):
            learned = learn(self.learners, results, self.config.max_policy_lag, self.iteration / self.config.iterations)
        with clock("snapshot"):
            snapshots, eval_metrics = self._snapshot_phase()
        env_steps = sum(r.env_steps for r in results)
        self.total_env_steps += env_steps
        self.total_matches += recorded.training + recorded.rating
        self.iteration += 1
        with clock("checkpoint"):
            self._checkpoint()
        seconds = clock.total()
        summary = IterationSummary(self.iteration, recorded.training, recorded.rating, env_steps, seconds, clock.phases,
                                   env_steps / max(seconds, 1e-9), learned.policy_lag, learned.dropped,
                                   tuple(snapshots), learned.losses, self._main_rating(), recorded.learner_return,
                                   recorded.learner_length)
        totals = LeagueTotals(self.config.iterations, self.total_env_steps, self.total_matches, len(self.population),
                              self.backend.restarts, self.config.pipeline_depth)
        self.metrics.iteration(summary, totals, {p: r.mu for p, r in self.ratings.as_dict().items()},
                               {**self._anchor_win_rates(), **eval_metrics})
        for callback in self.on_iteration:
            callback(summary)
        return summary, nxt

    def run(self, until_iteration: int | None = None, time_budget: float | None = None,
            started: float | None = None) -> list[IterationSummary]:
        """Run iterations until `until_iteration` (default: config.iterations).

        A higher `until_iteration` than the config's is written to config.json once the first
        iteration of this call has been checkpointed (a refused or failed resume changes nothing).
        `time_budget` (seconds of wall clock from `started`, a `time.monotonic()` reading, default
        now): stop at the end of the iteration after which the next one (as long as the mean so far)
        would not finish in it; at least one iteration runs.
        The stop is a checkpoint like any other (`stopped_by_budget` is set; `ludus resume` goes on)."""
        if until_iteration is not None and until_iteration < 1:
            raise RunError(f"--iterations must be >= 1, got {until_iteration}")
        if time_budget is not None and not time_budget > 0:
            raise RunError(f"--time-budget must be > 0 seconds, got {time_budget}")
        began = time.monotonic() if started is None else started
        self.stopped_by_budget = False
        until = min(until_iteration or self.config.iterations, self.config.iterations)
        extend = until_iteration is not None and until_iteration > self.config.iterations
        if extend:
            self.config = replace(self.config, iterations=until_iteration)
            until = until_iteration
        self.metrics.start(resume=self.iteration > 0, iteration=self.iteration)
        summaries, pending = [], None
        if self._in_flight is not None and self.iteration < until:
            # resumed in asynchronous mode: the checkpoint's tasks, with the weights they were sent with
            if self.backend is None:
                self.backend = self._make_backend()
            pending = (self._in_flight, self.backend.submit(list(self._in_flight.tasks), list(self._in_flight.weights)))
        while self.iteration < until:
            prefetch = self.config.pipeline_depth == 2 and self.iteration + 1 < until
            summary, pending = self.step(pending, prefetch=prefetch)
            summaries.append(summary)
            if extend:
                atomic_write_json(self.run_dir / CONFIG_FILE, config_to_dict(self.config))
                extend = False
                self.closing_rated = False  # the extended run ends with its own closing round
            spent = time.monotonic() - began
            per_iteration = sum(s.seconds for s in summaries) / len(summaries)
            if time_budget is not None and self.iteration < until and spent + per_iteration > time_budget:
                self.stopped_by_budget = True
                self.metrics.note(f"ludus: stopped at iteration {self.iteration}/{self.config.iterations} by the "
                                  f"time budget ({spent:.0f} s of {time_budget:.0f} s spent, an iteration takes "
                                  f"{per_iteration:.0f} s); `ludus resume {self.run_dir}` goes on")
                log.info("stopped by the time budget at iteration %d", self.iteration)
                break
        if self.iteration >= self.config.iterations and not self.closing_rated:
            self.metrics.phase("closing", self.iteration, self.config.iterations)
            self._closing_round()
        self.metrics.end_progress()
        return summaries

    def _closing_round(self) -> None:
        """After the last iteration, one round of rating matches, so the snapshots frozen in it
        are rated before the run ends (no iteration follows to rate them); checkpointed, so a
        resume of a finished run does not play it again."""
        if self.backend is None:
            self.backend = self._make_backend()
        view = LeagueView(self.population, self.payoff, self.ratings,
                          {pid: learner.version for pid, learner in self.learners.items()}, self.recorder.game_payoffs)
        plan = self.planner.closing(self.iteration, self.next_match_id, view, self.rng)
        if plan.tasks:
            self.next_match_id = plan.next_match_id
            results = self.backend.collect(self._submit(list(plan.tasks))[1])
            recorded = self.recorder.record(results, self.learners, self._checkpoint_seq, self.iteration)
            self.total_env_steps += sum(r.env_steps for r in results)
            self.total_matches += recorded.rating
            log.info("closing round: %d rating matches rate the last iteration's snapshots", recorded.rating)
        self.closing_rated = True
        self._checkpoint()

    def _plan(self, iteration: int, matches: int | None = None) -> list[PlayTask]:
        view = LeagueView(self.population, self.payoff, self.ratings,
                          {pid: learner.version for pid, learner in self.learners.items()}, self.recorder.game_payoffs)
        plan = self.planner.plan(iteration, self.next_match_id, view, self.rng, matches)
        self.next_match_id = plan.next_match_id
        return list(plan.tasks)

    def _submit(self, tasks: list[PlayTask]) -> InFlight:
        weights = [learner.weights() for learner in self.learners.values()]
        return PendingPlay(tuple(tasks), tuple(weights)), self.backend.submit(tasks, weights)

    def _snapshot_phase(self) -> tuple[list[str], dict[str, float]]:
        frozen = []
        for index, learner in enumerate(self.learners.values()):
            track_gain(learner)
            if not due_for_snapshot(learner, self.config):
                continue
            frozen.append(self._freeze(learner))
            if reset_due(learner):
                reset(learner, self.run_dir, stream_seed(self.config.seed, LEARNER, index, learner.state.resets + 1))
                log.info("reset learner %s to its initial weights (reset %d)", learner.player_id, learner.state.resets)
        metrics: dict[str, float] = {}
        if frozen:
            self.backend.set_population(with_absolute_paths(self.population.frozen(), self.run_dir))
            write_output_policy(self.spec, self.config, self.population, self.run_dir, self.iteration)
            for hook in self.on_population_change:
                metrics.update(hook(self))
        return frozen, metrics

    def _freeze(self, learner: Learner) -> str:
        parent = self.population[learner.last_snapshot].snapshot_id if learner.last_snapshot else None
        member = freeze(learner, self.run_dir, self.iteration, parent)
        self.recorder.add_member(member)
        return member.player_id

    def _anchor_win_rates(self) -> dict[str, float]:
        """``eval/win_rate_vs_<anchor>``: the main learner's (first role's) score against each
        anchor, win 1 and draw 1/2, over its recent games with it (the payoff table's decay)."""
        main = next(iter(self.learners))
        rates = {}
        for member in self.population.frozen():
            if member.kind != "anchor":
                continue
            wins, draws, games = self.payoff.counts(main, member.player_id)
            if games > 0:
                rates[f"eval/win_rate_vs_{member.bot or member.player_id}"] = (wins + draws / 2) / games
        return rates

    def _main_rating(self) -> tuple[float, float] | None:
        """Rating of the newest snapshot of the first role (the main agent's progress)."""
        newest = next(iter(self.learners.values())).last_snapshot
        rating = self.ratings.rating(newest) if newest and newest in self.ratings else None
        return (rating.mu, rating.sigma) if rating else None

    # ----------------------------------------------------------------------------- checkpoints

    def _checkpoint(self) -> None:
        state = CheckpointState(
            iteration=self.iteration, next_match_id=self.next_match_id, total_env_steps=self.total_env_steps,
            total_matches=self.total_matches, ledger=ledger_mark(self.store),
            config_digest=config_digest(config_to_dict(self.config)), rng=rng_to_json(self.rng),
            population=self.population, payoff=self.payoff.to_json(), ratings=self.ratings.to_json(),
            learners={pid: learner.state for pid, learner in self.learners.items()},
            closing_rated=self.closing_rated,
            game_payoffs={game: table.to_json() for game, table in self.recorder.game_payoffs.items()})
        write_checkpoint(self.run_dir, state, {pid: learner.impl.state_dict() for pid, learner in self.learners.items()},
                         self._in_flight)
        self._checkpoint_seq = state.ledger.last_seq

    def _restore(self, directory: Path, state: CheckpointState) -> None:
        """The loop as `state` left it (config, ledger and snapshots were checked against it); any
        damage to the tensors is a one-line RunError."""
        self.iteration, self.next_match_id = state.iteration, state.next_match_id
        self.closing_rated = state.closing_rated
        self.total_env_steps, self.total_matches = state.total_env_steps, state.total_matches
        self._checkpoint_seq = state.ledger.last_seq
        try:
            self.rng = rng_from_json(state.rng)
            self.recorder.restore(state.population, state.payoff, state.ratings, state.game_payoffs)
            for index, role in enumerate(self.config.roles):
                impl = self._make_learner_impl(index)
                impl.load_state_dict(read_learner_tensors(directory, role.name))
                self.learners[role.name] = Learner(role, impl, state.learners[role.name])
            self._in_flight = PendingPlay.load(directory)
        except Exception as exc:  # a damaged file of any kind (safetensors, arrays of the wrong shape, JSON)
            text = str(exc)
            if "size mismatch for" in text:
                # Well-formed weights of another shape (torch's load_state_dict says which): the
                # game's observation or global state, or the learner's net, is not what it was
                # when the run was made, e.g. simple_tag's global state grew by its clock.
                which = "size mismatch for" + text.split("size mismatch for", 1)[1].splitlines()[0].rstrip(".")
                raise RunError(f"checkpoint {directory} holds weights of another shape ({which}): the run was made by "
                               f"a version of Ludus whose game or learner differed; start a new run") from None
            detail = text.splitlines()[0] if text else "no detail"
            raise RunError(f"checkpoint {directory} is damaged ({type(exc).__name__}: {detail}); cannot resume") from None

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        if self.ranks is not None:
            self.ranks.close()
            self.ranks = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        self.store.close()
