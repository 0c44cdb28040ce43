"""The league manager: matchmaking -> runners -> learners -> ledger, ratings, snapshots.

One iteration (the data flow of docs/reference.md §5):

1. plan: each learner role draws its training opponents (self-play / PFSP / uniform over its
   candidate pool); a share of games are rating matches between frozen members and anchors,
   scheduled by rating uncertainty and match quality; every match gets an id and a seed spawned
   from the run's SeedSequence by that id; matches are split into one task per runner shard.
2. play: the backend plays every task to the end (serial, processes or Ray — same results).
3. record: each runner batch is appended to the ledger in one transaction, with the TrueSkill
   updates of its rating matches; training matches update only the payoff table (a live
   learner is not a fixed player, so it is never rated).
4. learn: each learner takes one PPO update on its trajectories (stale data dropped).
5. freeze: learners due a snapshot are frozen into immutable snapshot directories that join
   the population; league exploiters are reset after a number of snapshots (AlphaStar).
6. checkpoint: everything a resume needs is written atomically; `resume` continues exactly.

Only the manager writes to the run directory; it holds the ledger's exclusive writer lock.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from agents.rollout import RolloutBatch
from agents.snapshot import Lineage, verify_snapshot
from games.core import GameSpec
from games.registry import spec as game_spec
from league.backends import Backend, LearnerWeights, ProcessBackend, SerialBackend
from league.checkpoint import (CREATING_PREFIX, LedgerMark, PendingPlay, RunError, check_ledger,
                               clean_stale_creations, clean_stale_temporaries, config_digest, ledger_mark)
from league.config import LeagueConfig, RoleConfig, config_from_dict, config_to_dict
from league.learners import LeagueLearner, make_learner, module_weights
from league.ledger import (LEDGER_FILENAME, MatchResult, PlayerRecord, SeatResult, Store, atomic_write_bytes,
                           atomic_write_json, outcomes_from_returns)
from league.matchmaking import MatchmakingMix, sample_opponents, schedule_rating_matches
from league.payoff import PayoffTable
from league.population import Member, Population
from league.ratings import RatingTable, TrueSkillParams, ensure_params, rate_and_record
from league.runner import MatchAssignment, PlayedMatch, PlayResult, PlayTask
from league.stats import wilson_interval

CHECKPOINT_POINTER = "checkpoint.json"
CONFIG_FILE = "config.json"
FORMAT_VERSION = 2
"""2: the checkpoint records the ledger position, the config digest and the plan in flight."""
log = logging.getLogger("ludus.league")



def match_seed(run_seed: int, match_id: int) -> int:
    """The seed of match `match_id`: a SeedSequence child spawned by match id (order-free)."""
    state = np.random.SeedSequence(run_seed, spawn_key=(0, match_id)).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def stream_seed(run_seed: int, *key: int) -> int:
    """A seed for another named random stream of the run (sampling per task, initial weights...)."""
    return int(np.random.SeedSequence(run_seed, spawn_key=(1, *key)).generate_state(1, np.uint32)[0])


@dataclass
class Learner:
    """A live learner: one role's net, PPO state and bookkeeping (mutable, manager-internal)."""

    role: RoleConfig
    impl: LeagueLearner
    steps: int = 0
    """Env steps (own decisions) trained on."""
    steps_at_snapshot: int = 0
    snapshots: int = 0
    resets: int = 0
    last_snapshot: str | None = None
    """player_id of its latest snapshot."""
    window_wins: float = 0.0
    window_draws: float = 0.0
    window_games: float = 0.0
    dropped_stale: int = 0

    @property
    def player_id(self) -> str:
        return self.role.name

    @property
    def version(self) -> int:
        return self.impl.updates

    def weights(self) -> LearnerWeights:
        return LearnerWeights(self.player_id, self.version, module_weights(self.impl.module))


@dataclass(frozen=True)
class IterationSummary:
    """What one iteration did (returned by `League.step`, logged as metrics)."""

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


class League:
    """A league run. `League.create(config, run_dir)` or `League.resume(run_dir)`, then `run()`."""

    def __init__(self, config: LeagueConfig, run_dir: Path, store: Store):
        self.config = config
        self.run_dir = run_dir
        self.store = store
        torch.set_num_threads(config.torch_threads)
        # Adam's second-moment estimates decay into denormal floats, which CPUs process ~100x
        # slower (measured here: sqrt of denormals 0.16 s vs 0.0016 s); flush them to zero.
        torch.set_flush_denormal(True)
        self.spec: GameSpec = game_spec(config.game)
        self.population = Population()
        self.payoff = PayoffTable(config.payoff_decay)
        params = TrueSkillParams(draw_probability=max(config.draw_probability, 1e-6))
        self.params = ensure_params(store, params)
        self.ratings = RatingTable(self.params)
        self.learners: dict[str, Learner] = {}
        self.iteration = 0
        self.next_match_id = 0
        self.total_env_steps = 0
        self.total_matches = 0
        self.rng = np.random.default_rng(stream_seed(config.seed, 2))
        self.backend: Backend | None = None
        self.metrics = None
        self.on_iteration: list[Callable[[IterationSummary], None]] = []
        self._checkpoint_seq = 0
        """Ledger seq at the last checkpoint: later matches belong to an interrupted iteration."""
        self._in_flight: PendingPlay | None = None
        """Asynchronous mode: the next iteration's tasks already with the runners, and their weights."""
        self._started = time.perf_counter()

    # ----------------------------------------------------------------------------- creation

    @classmethod
    def create(cls, config: LeagueConfig, run_dir: str | os.PathLike) -> "League":
        """Start a new run in `run_dir` (must be new or empty).

        The run is built in a sibling ``.creating-<name>-<pid>`` directory and renamed into place
        after its first checkpoint, so a refused config or a kill during creation leaves no half
        run behind (a killed creation's directory is removed by the next `create` there)."""
        run_dir = Path(run_dir)
        if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
            raise RunError(f"run directory {run_dir} already exists and is not empty; "
                           f"use `ludus resume {run_dir}` or pick another --run")
        config_from_dict(config_to_dict(config))  # validate the game id before touching the disk
        parent = run_dir.resolve().parent
        parent.mkdir(parents=True, exist_ok=True)
        clean_stale_creations(parent)
        building = parent / f"{CREATING_PREFIX}{run_dir.name}-{os.getpid()}"
        store = Store.open(building, mode="write")
        try:
            league = cls(config, building, store)
            atomic_write_json(building / CONFIG_FILE, config_to_dict(config))
            store.set_meta("config", config_to_dict(config))
            league._init_population()
            league._write_checkpoint()
            store.close()
            if run_dir.exists():
                run_dir.rmdir()  # empty (checked above)
            os.replace(building, run_dir)
        except BaseException:
            store.close()
            shutil.rmtree(building, ignore_errors=True)
            raise
        # every path the league keeps is relative to its run directory: carry on there
        league.run_dir = run_dir
        league.store = Store.open(run_dir, mode="write")
        league._setup_logging()
        return league

    @classmethod
    def resume(cls, run_dir: str | os.PathLike) -> "League":
        """Continue a run from its last checkpoint; the result equals an uninterrupted run.

        The run directory must be the unit the checkpoint describes: its ledger, config and
        snapshots are checked against it, and anything else is refused with a one-line error
        before anything is written."""
        run_dir = Path(run_dir)
        if not (run_dir / CONFIG_FILE).is_file() or not (run_dir / CHECKPOINT_POINTER).is_file():
            raise RunError(f"{run_dir} is not a Ludus run directory (no {CONFIG_FILE} / {CHECKPOINT_POINTER})")
        if not (run_dir / LEDGER_FILENAME).is_file():
            raise RunError(f"{run_dir}: {LEDGER_FILENAME} is missing, but the checkpoint needs the ledger it was "
                           f"written with; restore it, or start a new run")
        try:
            config_data = json.loads((run_dir / CONFIG_FILE).read_text())
            pointer = json.loads((run_dir / CHECKPOINT_POINTER).read_text())
            directory = run_dir / pointer["path"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise RunError(f"{run_dir}: damaged run files ({type(exc).__name__}: {exc}); cannot resume") from None
        config = config_from_dict(config_data)
        _check_before_writing(run_dir, directory, config)
        store = Store.open(run_dir, mode="write")
        try:
            league = cls(config, run_dir, store)
            league._load_checkpoint(directory)
            clean_stale_temporaries(run_dir)
            league._setup_logging()
        except BaseException:
            store.close()
            raise
        return league

    def _setup_logging(self) -> None:
        (self.run_dir / "logs").mkdir(exist_ok=True)
        handler = logging.FileHandler(self.run_dir / "logs" / "manager.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        self._log_handler = handler

    def _init_population(self) -> None:
        config = self.config
        for name in config.anchors:
            if os.path.isdir(name):
                self._add_imported_snapshot(name, role="anchor")
            else:
                from agents.bots import make_bot

                make_bot(name, self.spec)  # refuse a bad bot name now
                self._add_member(Member(f"anchor:{name}", "anchor", "anchor", bot=name))
        for source in config.seed_population:
            self._seed_from(source)
        for index, role in enumerate(config.roles):
            learner = Learner(role, self._make_learner_impl(index))
            self.learners[role.name] = learner
            self._add_member(Member(role.name, "learner", role.name))
            # The initial weights: the first frozen member of the role, and what league
            # exploiters are reset to.
            self._freeze(learner)

    def _seed_from(self, source: str) -> None:
        path = Path(source)
        if (path / "manifest.json").is_file():
            self._add_imported_snapshot(str(path), role="seed")
            return
        if (path / CHECKPOINT_POINTER).is_file():
            pointer = json.loads((path / CHECKPOINT_POINTER).read_text())
            state = json.loads((path / pointer["path"] / "state.json").read_text())
            for member in Population.from_json(state["population"]).snapshots():
                snapshot = Path(member.snapshot_path)
                if not snapshot.is_absolute():
                    snapshot = path / snapshot
                self._add_imported_snapshot(str(snapshot), role="seed")
            return
        raise RunError(f"seed_population entry {source!r} is neither a snapshot nor a run directory")

    def _add_imported_snapshot(self, path: str, role: str) -> None:
        from agents.snapshot import load_snapshot

        loaded = load_snapshot(path, expect_game=self.spec.id)
        player_id = f"{role}:{loaded.ref.snapshot_id[:12]}"
        if player_id not in self.population:
            self._add_member(Member(player_id, "snapshot", role, snapshot_path=str(Path(path).resolve()),
                                    snapshot_id=loaded.ref.snapshot_id))

    def _add_member(self, member: Member) -> None:
        self.population.add(member)
        if member.kind != "learner":
            self.payoff.add(member.player_id)
        if self.store.player(member.player_id) is not None:
            return  # re-created while replaying an interrupted iteration
        self.store.add_player(PlayerRecord(
            player_id=member.player_id, kind=member.kind, created_at=time.time(), role=member.role,
            snapshot_path=member.snapshot_path or "", snapshot_hash=member.snapshot_id or "",
            metadata={"parent": member.parent, "iteration": member.iteration, "steps": member.steps,
                      "bot": member.bot}))

    # ----------------------------------------------------------------------------- snapshots

    def _freeze(self, learner: Learner) -> str:
        """Freeze the learner's current weights into a snapshot member; returns its player_id."""
        index = learner.snapshots
        player_id = f"{learner.player_id}@{index}"
        directory = self.run_dir / "snapshots" / player_id
        parent_id = (self.population[learner.last_snapshot].snapshot_id if learner.last_snapshot else None)
        ref = learner.impl.freeze(directory, Lineage(parent=parent_id, role=learner.role.name, steps=learner.steps,
                                                     created_by="ludus train"))
        self._add_member(Member(player_id, "snapshot", learner.role.name,
                                snapshot_path=str(directory.relative_to(self.run_dir)),
                                snapshot_id=ref.snapshot_id, parent=learner.last_snapshot,
                                iteration=self.iteration, steps=learner.steps))
        learner.snapshots += 1
        learner.last_snapshot = player_id
        learner.steps_at_snapshot = learner.steps
        learner.window_wins = learner.window_draws = learner.window_games = 0.0
        return player_id

    def _members_for_runners(self) -> list[Member]:
        """Frozen members with absolute snapshot paths (runners may run elsewhere)."""
        out = []
        for m in self.population.frozen():
            if m.snapshot_path and not os.path.isabs(m.snapshot_path):
                m = replace(m, snapshot_path=str(self.run_dir / m.snapshot_path))
            out.append(m)
        return out

    # ----------------------------------------------------------------------------- planning

    def _candidates(self, learner: Learner) -> list[str]:
        """The opponent pool of a role (AlphaStar, Vinyals et al. 2019, 'League composition')."""
        frozen = [m for m in self.population.frozen()]
        kind = learner.role.kind
        if kind == "main_exploiter":
            # Main exploiters attack the main agents: their snapshots (latest ones matter most;
            # PFSP 'var' weighting keeps it on the ones it can almost beat).
            mains = [r.name for r in self.config.roles if r.kind == "main"]
            pool = [m.player_id for m in frozen if m.kind == "snapshot" and m.role in mains]
        else:
            pool = [m.player_id for m in frozen]
        # Bound the distinct opponents per iteration (bounds inference batches and cache churn):
        # keep the newest ones and the anchors.
        limit = self.config.max_opponents_per_iteration
        if len(pool) > limit:
            anchors = [p for p in pool if self.population[p].kind == "anchor"]
            rest = [p for p in pool if self.population[p].kind != "anchor"]
            pool = anchors + rest[-(limit - len(anchors)):] if limit > len(anchors) else anchors[:limit]
        return pool

    def _allocate(self, players: tuple[str, ...], kind: str) -> MatchAssignment:
        match_id = self.next_match_id
        self.next_match_id += 1
        return MatchAssignment(match_id, match_seed(self.config.seed, match_id), players, kind)

    def _sides(self) -> list[tuple[int, ...]]:
        """Seats grouped by team, teams in order of first seat: each side is one player's to fill."""
        sides: dict[int, list[int]] = {}
        for seat, team in enumerate(self.spec.team_of_seat):
            sides.setdefault(team, []).append(seat)
        return [tuple(seats) for seats in sides.values()]

    def _side_of_member(self, member: Member) -> int | None:
        """The side a frozen member plays in an asymmetric team game (None: any side)."""
        role = next((r for r in self.config.roles if r.name == member.role), None)
        return role.team if role is not None else None

    def _seat_players(self, sides: list[tuple[int, ...]], side_players: list[str]) -> tuple[str, ...]:
        players = [""] * self.spec.num_players
        for seats, player in zip(sides, side_players):
            for seat in seats:
                players[seat] = player
        return tuple(players)

    def plan(self) -> list[PlayTask]:
        """The tasks of the next iteration (consumes the matchmaking RNG and match ids).

        A learner fills every seat of one side (a team shares one policy; in a free-for-all a side
        is one seat); every other side gets one opponent drawn by the role's matchmaking mix. In
        symmetric games the learner's side rotates, so every seat of the game is learnt.
        """
        config, rng = self.config, self.rng
        sides = self._sides()
        shares = np.array([r.learner_share for r in config.roles])
        counts = np.floor(config.matches_per_iteration * shares / shares.sum()).astype(int)
        counts = np.maximum(counts, 1)
        assignments: list[MatchAssignment] = []
        for role, count in zip(config.roles, counts.tolist()):
            learner = self.learners[role.name]
            mix = (MatchmakingMix(self_play=role.self_play, pfsp=role.pfsp, uniform=role.uniform,
                                  pfsp_weighting=role.pfsp_weighting, pfsp_p=role.pfsp_power)
                   if role.self_play + role.pfsp + role.uniform > 0 else None)
            candidates = self._candidates(learner)
            if role.team is None:
                # Symmetric game: every other side draws from the same pool.
                drawn = self._draw_opponents(role, mix, learner.player_id, candidates, count * (len(sides) - 1))
                draws_of_side = {side: drawn for side in range(len(sides))}
            else:
                draws_of_side = {}
                for side in range(len(sides)):
                    if side == role.team:
                        continue
                    pool = [c for c in candidates if self._side_of_member(self.population[c]) in (None, side)]
                    drawn = sample_opponents(rng, mix, learner.player_id, pool, self.payoff, self.ratings, count)
                    # Asymmetric sides: 'self-play' means the newest snapshot of the other side.
                    newest = pool[-1] if pool else learner.player_id
                    draws_of_side[side] = [newest if d == learner.player_id else d for d in drawn]
            for j in range(count):
                # In symmetric games the learner takes every side in turn, so all seats are learnt.
                own = role.team if role.team is not None else (self.iteration * count + j) % len(sides)
                side_players, k = [], 0
                for side in range(len(sides)):
                    if side == own:
                        side_players.append(learner.player_id)
                    elif role.team is None:
                        side_players.append(draws_of_side[side][j * (len(sides) - 1) + k])
                        k += 1
                    else:
                        side_players.append(draws_of_side[side][j])
                assignments.append(self._allocate(self._seat_players(sides, side_players), "training"))
        assignments.extend(self._plan_rating_matches(sides))
        return self._shard(assignments)

    def _draw_opponents(self, role: RoleConfig, mix: MatchmakingMix | None, learner_id: str,
                        candidates: list[str], n: int) -> list[str]:
        """n opponents: a `meta_nash` share from the meta-game's Nash mixture, the rest by `mix`."""
        rng = self.rng
        total = role.self_play + role.pfsp + role.uniform + role.meta_nash
        num_nash = int(rng.binomial(n, role.meta_nash / total)) if role.meta_nash > 0 and candidates else 0
        drawn: list[str] = []
        if num_nash:
            from league.psro import meta_nash_distribution

            members = [self.population[c] for c in candidates]
            weights = meta_nash_distribution(self.spec, members, self.run_dir)
            drawn = [candidates[i] for i in rng.choice(len(candidates), size=num_nash, p=weights).tolist()]
        if n - num_nash > 0:
            drawn += sample_opponents(rng, mix, learner_id, candidates, self.payoff, self.ratings, n - num_nash)
        if not num_nash:
            return drawn
        # Interleave deterministically so seat rotation mixes both kinds of opponents.
        order = rng.permutation(len(drawn))
        return [drawn[i] for i in order.tolist()]

    def _plan_rating_matches(self, sides: list[tuple[int, ...]]) -> list[MatchAssignment]:
        """Rating matches between frozen members: a `rating_share` of all games."""
        config, rng = self.config, self.rng
        frozen = [m.player_id for m in self.population.frozen()]
        num_rating = int(round(config.matches_per_iteration * config.rating_share / (1 - config.rating_share)))
        if len(sides) < 2 or len(frozen) < 2 or num_rating <= 0:
            return []
        out = []
        if len(sides) == 2 and all(r.team is None for r in config.roles):
            # Two symmetric sides: pairs by rating uncertainty and match quality (the arena's ladder too).
            for a, b in schedule_rating_matches(rng, self.ratings, frozen, num_rating):
                out.append(self._allocate(self._seat_players(sides, [a, b]), "rating"))
            return out
        pools = [[p for p in frozen if self._side_of_member(self.population[p]) in (None, side)]
                 for side in range(len(sides))]
        if any(not pool for pool in pools):
            return []
        for _ in range(num_rating):
            chosen: list[str] = []
            for pool in pools:
                fresh = [p for p in pool if p not in chosen]
                if not fresh:
                    # A player cannot hold two sides of one rating match: wait for more members.
                    return out
                chosen.append(fresh[int(rng.integers(len(fresh)))])
            out.append(self._allocate(self._seat_players(sides, chosen), "rating"))
        return out

    def _shard(self, assignments: list[MatchAssignment]) -> list[PlayTask]:
        shards = self.config.num_runners
        # Contiguous chunks: tasks in order hold matches in id order (the ledger order).
        bounds = np.linspace(0, len(assignments), shards + 1).astype(int)
        learners = tuple(self.learners)
        versions = tuple(self.learners[p].version for p in learners)
        tasks = []
        for shard in range(shards):
            chunk = tuple(assignments[bounds[shard]:bounds[shard + 1]])
            if not chunk:
                continue
            tasks.append(PlayTask(
                task_id=self.iteration * shards + shard, assignments=chunk,
                sample_seed=stream_seed(self.config.seed, 5, self.iteration, shard),
                learners=learners, learner_versions=versions,
                gamma=self.config.ppo.gamma, gae_lambda=self.config.ppo.gae_lambda))
        return tasks

    # ----------------------------------------------------------------------------- recording

    def _match_result(self, played: PlayedMatch, started_at: float, duration: float) -> MatchResult:
        a = played.assignment
        teams = self.spec.team_of_seat
        outcomes = outcomes_from_returns(played.returns, teams)
        seats = tuple(
            SeatResult(seat=s, team=teams[s], player_id=pid, episode_return=played.returns[s],
                       outcome=outcomes[s], player_version=self._version_label(pid, played.player_versions[s]))
            for s, pid in enumerate(a.players))
        return MatchResult(match_id=a.match_id, kind=a.kind, game_id=self.spec.id, seed=a.seed, seats=seats,
                           length=played.length, started_at=started_at, duration_s=duration,
                           metadata={"moves": list(played.moves), "truncated": played.truncated})

    def _version_label(self, player_id: str, version: int) -> str:
        member = self.population[player_id]
        if member.kind == "learner":
            return f"v{version}"
        return member.snapshot_id or member.bot or ""

    def _record(self, results: list[PlayResult]) -> tuple[int, int]:
        """Append each runner batch to the ledger (one transaction each) and update ratings/payoff."""
        already = self.store.max_match_id()
        training = rating = 0
        now = time.time()
        for result in results:
            per_match = result.seconds / max(len(result.matches), 1)
            batch = [self._match_result(m, now, per_match) for m in result.matches]
            # After a crash mid-iteration the replayed iteration re-creates matches already in the
            # ledger (same ids, same seeds, same play): they are not appended twice.
            new = [r for r in batch if r.match_id > already]
            replayed = [r for r in batch if r.match_id <= already]
            self._check_replayed(replayed)
            for r in replayed:
                if r.kind == "rating":
                    self.ratings.update(r)
            if new:
                rate_and_record(self.store, self.ratings, new, kinds=("rating",))
            games = []
            for r in batch:
                if r.kind == "training":
                    training += 1
                    games.extend(self._training_pairs(r))
                else:
                    rating += 1
            self.payoff.update_pairs(games)
        return training, rating

    def _check_replayed(self, batch: list[MatchResult]) -> None:
        if not batch:
            return
        stored = {m.result.match_id: m.result for m in self.store.iter_matches(after_seq=self._checkpoint_seq)}
        for r in batch:
            old = stored.get(r.match_id)
            if old is not None and [s.episode_return for s in old.seats] != [s.episode_return for s in r.seats]:
                raise RunError(f"resumed play of match {r.match_id} differs from the ledger; the run is not "
                               f"deterministic (was the code or an installed package changed?)")

    def _training_pairs(self, match: MatchResult) -> list[tuple[str, str, float]]:
        """(learner, opponent, learner's score) for the payoff table, plus window stats."""
        pairs = []
        seats = match.seats
        for s in seats:
            learner = self.learners.get(s.player_id)
            if learner is None:
                continue
            opponents = {o.player_id: o for o in seats if o.team != s.team}  # a team counts once
            for o in opponents.values():
                if o.player_id == s.player_id:
                    continue  # self-play teaches the payoff table nothing
                # Head to head: did the learner's team finish above this opponent's?
                score = 1.0 if s.outcome > o.outcome else 0.5 if s.outcome == o.outcome else 0.0
                pairs.append((s.player_id, o.player_id, score))
                learner.window_games += 1
                learner.window_wins += score == 1.0
                learner.window_draws += score == 0.5
            break  # one row per match for the learner (its other seats are the same team)
        return pairs

    # ----------------------------------------------------------------------------- learning

    def _learn(self, results: list[PlayResult]) -> tuple[dict[str, dict[str, float]], float, int]:
        stats: dict[str, dict[str, float]] = {}
        lags, dropped_total = [], 0
        for player_id, learner in self.learners.items():
            batches = [r.rollouts[player_id] for r in results if player_id in r.rollouts]
            batch = _concat(batches)
            if batch is None or len(batch) == 0:
                continue
            lag = learner.version - batch.policy_version
            keep = lag <= self.config.max_policy_lag
            dropped = int((~keep).sum())
            if dropped:
                batch = _select(batch, keep)
                learner.dropped_stale += dropped
                dropped_total += dropped
            if len(batch) == 0:
                continue
            stats[player_id] = learner.impl.update(batch, progress=self.iteration / self.config.iterations)
            learner.steps += len(batch)
            lags.append(float(lag[keep].mean()))
        return stats, float(np.mean(lags)) if lags else 0.0, dropped_total

    def _snapshots_due(self) -> list[str]:
        config = self.config
        frozen = []
        for learner in self.learners.values():
            due = learner.steps - learner.steps_at_snapshot >= config.snapshot_every_steps
            if not due and config.snapshot_win_rate_lcb > 0 and learner.window_games >= 20:
                lower, _ = wilson_interval(learner.window_wins + learner.window_draws / 2, learner.window_games)
                due = lower >= config.snapshot_win_rate_lcb
            if due:
                frozen.append(self._freeze(learner))
                reset_every = learner.role.reset_every_snapshots
                if reset_every and (learner.snapshots - 1) % reset_every == 0 and learner.snapshots > 1:
                    self._reset(learner)
        return frozen

    def _reset(self, learner: Learner) -> None:
        """Reset a learner to its initial weights with a fresh optimizer (AlphaStar's exploiter reset)."""
        index = list(self.learners).index(learner.player_id)
        learner.impl.reset_to(self.run_dir / "snapshots" / f"{learner.player_id}@0",
                              seed=stream_seed(self.config.seed, 4, index, learner.resets + 1))
        learner.resets += 1
        log.info("reset learner %s to its initial weights (reset %d)", learner.player_id, learner.resets)

    def _make_learner_impl(self, index: int) -> LeagueLearner:
        return make_learner(self.spec, self.config, index, seed=stream_seed(self.config.seed, 4, index),
                            init_seed=stream_seed(self.config.seed, 3, index))

    # ----------------------------------------------------------------------------- the loop

    def _make_backend(self) -> Backend:
        config = self.config
        if config.backend == "serial":
            backend: Backend = SerialBackend(config.game, self.spec, self._architecture(), config.num_envs,
                                             config.policy_cache_size, seed=config.seed)
        elif config.backend == "process":
            backend = ProcessBackend(config.game, self.spec, self._architecture(), config.num_envs,
                                     config.policy_cache_size,
                                     num_workers=config.num_runners, seed=config.seed,
                                     log_dir=str(self.run_dir / "logs"))
        else:
            from league.ray_backend import RayBackend

            backend = RayBackend(config.game, self.spec, self._architecture(), config.num_envs,
                                 config.policy_cache_size,
                                 num_workers=config.num_runners, seed=config.seed, address=config.ray_address)
        backend.set_population(self._members_for_runners())
        return backend

    def _architecture(self):
        return next(iter(self.learners.values())).impl.architecture

    def _weights(self) -> list[LearnerWeights]:
        return [learner.weights() for learner in self.learners.values()]

    def step(self, pending: tuple[list[PlayTask], object] | None = None,
             prefetch: bool = False) -> tuple[IterationSummary, tuple[list[PlayTask], object] | None]:
        """Run one iteration. With `prefetch` (async mode) the next iteration's tasks are submitted
        before learning, so runners play them with the current (soon one version old) weights."""
        phases = dict.fromkeys(("matchmaking", "play", "record", "learn", "snapshot", "checkpoint"), 0.0)
        clock = [time.perf_counter()]

        def lap(phase: str) -> None:
            now = time.perf_counter()
            phases[phase] += now - clock[0]
            clock[0] = now

        start = clock[0]
        if self.backend is None:
            self.backend = self._make_backend()
        if pending is None:
            tasks = self.plan()
            lap("matchmaking")
            pending = (tasks, self.backend.submit(tasks, self._weights()))
        tasks, handle = pending
        results = self.backend.collect(handle)
        lap("play")
        nxt = None
        self._in_flight = None
        if prefetch and self.iteration + 1 < self.config.iterations:
            self.iteration += 1
            next_tasks = self.plan()
            self.iteration -= 1
            lap("matchmaking")
            weights = self._weights()
            nxt = (next_tasks, self.backend.submit(next_tasks, weights))
            # kept in the checkpoint: a resume replays exactly these tasks with these weights
            self._in_flight = PendingPlay(tuple(next_tasks), tuple(weights))
            lap("play")
        training, rating = self._record(results)
        lap("record")
        losses, lag, dropped = self._learn(results)
        lap("learn")
        snapshots = self._snapshots_due()
        eval_metrics: dict[str, float] = {}
        if snapshots:
            self.backend.set_population(self._members_for_runners())
            psro_role = next((role for role in self.config.roles if role.meta_nash > 0), None)
            if psro_role is not None:
                # PSRO: the league's output is the meta-Nash mixture; log its exploitability
                # (exact, OpenSpiel) whenever the population changes.
                from league.psro import exploitability_metrics

                eval_metrics = exploitability_metrics(self.spec, self.population.frozen(), self.run_dir,
                                                      role=psro_role.name)
        lap("snapshot")
        env_steps = sum(r.env_steps for r in results)
        self.total_env_steps += env_steps
        self.total_matches += training + rating
        self.iteration += 1
        self._write_checkpoint()
        lap("checkpoint")
        seconds = time.perf_counter() - start
        summary = IterationSummary(self.iteration, training, rating, env_steps, seconds, phases,
                                   env_steps / max(seconds, 1e-9), lag, dropped, tuple(snapshots), losses,
                                   self._main_rating())
        self._log(summary, eval_metrics)
        for callback in self.on_iteration:
            callback(summary)
        return summary, nxt

    def _main_rating(self) -> tuple[float, float] | None:
        """Rating of the newest snapshot of the first role (the main agent's progress)."""
        first = next(iter(self.learners.values()))
        if first.last_snapshot and first.last_snapshot in self.ratings:
            r = self.ratings.rating(first.last_snapshot)
            return r.mu, r.sigma
        return None

    def run(self, until_iteration: int | None = None) -> list[IterationSummary]:
        """Run iterations until `until_iteration` (default: config.iterations).

        A higher `until_iteration` than the config's is written to config.json once the first
        iteration of this call has been checkpointed (a refused or failed resume changes nothing)."""
        if until_iteration is not None and until_iteration < 1:
            raise RunError(f"--iterations must be >= 1, got {until_iteration}")
        until = min(until_iteration or self.config.iterations, self.config.iterations)
        extend = until_iteration is not None and until_iteration > self.config.iterations
        if extend:
            self.config = replace(self.config, iterations=until_iteration)
            until = until_iteration
        self._start_metrics()
        summaries = []
        pending = None
        if self._in_flight is not None and self.iteration < until:
            # resumed in asynchronous mode: the checkpoint's tasks, with the weights they were sent with
            if self.backend is None:
                self.backend = self._make_backend()
            pending = (list(self._in_flight.tasks),
                       self.backend.submit(list(self._in_flight.tasks), list(self._in_flight.weights)))
        prefetch = self.config.pipeline_depth == 2
        while self.iteration < until:
            summary, pending = self.step(pending, prefetch=prefetch and self.iteration + 1 < until)
            summaries.append(summary)
            if extend:
                atomic_write_json(self.run_dir / CONFIG_FILE, config_to_dict(self.config))
                extend = False
        if self.config.log.progress:
            sys.stderr.write("\n")
        return summaries

    # ----------------------------------------------------------------------------- metrics

    def _start_metrics(self) -> None:
        if self.metrics is not None:
            return
        from league.metrics import MetricsLogger

        log_config = self.config.log
        self.metrics = MetricsLogger(self.run_dir, wandb_mode=log_config.wandb, wandb_project=log_config.wandb_project,
                                     tensorboard=log_config.tensorboard, run_name=self.run_dir.name,
                                     config=config_to_dict(self.config), resume=self.iteration > 0)

    def _log(self, s: IterationSummary, extra: dict[str, float] | None = None) -> None:
        metrics = {
            **(extra or {}),
            "charts/steps_per_second": s.steps_per_second,
            "charts/env_steps": float(self.total_env_steps),
            "charts/matches": float(self.total_matches),
            "charts/iteration_seconds": s.seconds,
            **{f"charts/{phase}_seconds": value for phase, value in s.phase_seconds.items()},
            "league/policy_lag": s.policy_lag,
            "league/dropped_transitions": float(s.dropped_transitions),
            "league/population": float(len(self.population)),
            "league/runner_restarts": float(self.backend.restarts if self.backend else 0),
            "league/queue_depth": float(self.config.pipeline_depth),
        }
        for pid, st in s.losses.items():
            for key, value in st.items():
                metrics[f"losses/{pid}/{key}"] = value
        for pid, r in self.ratings.as_dict().items():
            metrics[f"league/rating/{pid}"] = r.mu
        if s.main_rating:
            metrics["league/main_mu"] = s.main_rating[0]
        if self.metrics is not None:
            self.metrics.log(self.total_env_steps, metrics)
        log.info("iteration %d: %d training + %d rating matches, %d steps, %.0f steps/s, lag %.2f, snapshots %s",
                 s.iteration, s.training_matches, s.rating_matches, s.env_steps, s.steps_per_second, s.policy_lag,
                 list(s.snapshots))
        if self.config.log.progress:
            rating = f"{s.main_rating[0]:.1f}±{s.main_rating[1]:.1f}" if s.main_rating else "-"
            width = 24
            done = int(width * self.iteration / self.config.iterations)
            sys.stderr.write(
                f"\r[{'#' * done}{'.' * (width - done)}] it {self.iteration}/{self.config.iterations} "
                f"{s.steps_per_second:,.0f} steps/s  games {self.total_matches:,}  lag {s.policy_lag:.1f}  "
                f"main {rating}  pop {len(self.population)}   ")
            sys.stderr.flush()

    # ----------------------------------------------------------------------------- checkpoints

    def _write_checkpoint(self) -> None:
        """Atomically write everything a resume needs, then flip the pointer to it."""
        from safetensors.torch import save as safetensors_bytes

        name = f"checkpoints/iter-{self.iteration:06d}"
        directory = self.run_dir / name
        if directory.exists():
            shutil.rmtree(directory)
        tmp = self.run_dir / f"checkpoints/.tmp-{self.iteration:06d}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        learners = {}
        for pid, learner in self.learners.items():
            atomic_write_bytes(tmp / f"learner-{pid}.safetensors", safetensors_bytes(
                {k: v.contiguous() for k, v in learner.impl.state_dict().items()}))
            learners[pid] = {"steps": learner.steps, "steps_at_snapshot": learner.steps_at_snapshot,
                             "snapshots": learner.snapshots, "resets": learner.resets,
                             "last_snapshot": learner.last_snapshot, "window": [
                                 learner.window_wins, learner.window_draws, learner.window_games],
                             "dropped_stale": learner.dropped_stale}
        state = {
            "format_version": FORMAT_VERSION,
            "iteration": self.iteration,
            "next_match_id": self.next_match_id,
            "total_env_steps": self.total_env_steps,
            "total_matches": self.total_matches,
            "ledger_last_seq": self.store.last_seq(),
            "ledger": ledger_mark(self.store).to_json(),
            "config_digest": config_digest(config_to_dict(self.config)),
            "rng": _rng_state_to_json(self.rng),
            "population": self.population.to_json(),
            "payoff": self.payoff.to_json(),
            "ratings": self.ratings.to_json(),
            "learners": learners,
        }
        if self._in_flight is not None:
            self._in_flight.save(tmp)
        atomic_write_json(tmp / "state.json", state)
        os.replace(tmp, directory)
        atomic_write_json(self.run_dir / CHECKPOINT_POINTER, {"path": name, "iteration": self.iteration})
        self._checkpoint_seq = state["ledger_last_seq"]
        # Keep the last two checkpoints.
        for old in sorted((self.run_dir / "checkpoints").glob("iter-*"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)

    def _load_checkpoint(self, directory: Path) -> None:
        """Restore the state of `directory`, after checking that the run directory matches it; any
        damage is a one-line RunError."""
        try:
            self._restore(directory)
        except RunError:
            raise
        except Exception as exc:  # a damaged file of any kind (JSON, safetensors, arrays of the wrong shape)
            raise RunError(f"checkpoint {directory} is damaged ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); cannot resume") from None

    def _restore(self, directory: Path) -> None:
        from safetensors.torch import load as safetensors_load

        try:
            state = json.loads((directory / "state.json").read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RunError(f"checkpoint {directory} is unreadable ({exc}); cannot resume") from None
        if state.get("format_version") != FORMAT_VERSION:
            raise RunError(f"checkpoint {directory} has format {state.get('format_version')}, expected {FORMAT_VERSION}")
        # config, ledger and snapshots were checked against this state by _check_before_writing
        self.iteration = state["iteration"]
        self._checkpoint_seq = state["ledger_last_seq"]
        self.next_match_id = state["next_match_id"]
        self.total_env_steps = state["total_env_steps"]
        self.total_matches = state["total_matches"]
        self.rng = _rng_from_json(state["rng"])
        self.population = Population.from_json(state["population"])
        self.payoff = PayoffTable.from_json(state["payoff"])
        # Ratings as of the checkpoint. The ledger may hold matches of the interrupted iteration
        # beyond it; those are re-played identically, re-rated in order, not appended again (_record).
        self.ratings = RatingTable.from_json(state["ratings"])
        for index, role in enumerate(self.config.roles):
            impl = self._make_learner_impl(index)
            blob = (directory / f"learner-{role.name}.safetensors").read_bytes()
            impl.load_state_dict(safetensors_load(blob))
            info = state["learners"][role.name]
            learner = Learner(role, impl, steps=info["steps"], steps_at_snapshot=info["steps_at_snapshot"],
                              snapshots=info["snapshots"], resets=info["resets"], last_snapshot=info["last_snapshot"],
                              dropped_stale=info["dropped_stale"])
            learner.window_wins, learner.window_draws, learner.window_games = info["window"]
            self.learners[role.name] = learner
        self._in_flight = PendingPlay.load(directory)

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if getattr(self, "_log_handler", None) is not None:
            log.removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None
        self.store.close()


def _check_before_writing(run_dir: Path, directory: Path, config: LeagueConfig) -> None:
    """What a checkpoint says the run directory holds (config, ledger, snapshots), checked before
    the ledger is opened for writing: a refused resume leaves every file as it was."""
    try:
        state = json.loads((directory / "state.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunError(f"checkpoint {directory} is unreadable ({type(exc).__name__}); cannot resume") from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        found = state.get("format_version") if isinstance(state, dict) else None
        raise RunError(f"checkpoint {directory} has format {found}, expected {FORMAT_VERSION}; it was written by "
                       f"another version of Ludus")
    try:
        mark = LedgerMark.from_json(state["ledger"])
        digest = state["config_digest"]
        members = Population.from_json(state["population"]).snapshots()
    except (KeyError, TypeError, ValueError) as exc:
        raise RunError(f"checkpoint {directory} is damaged ({type(exc).__name__}: {exc}); cannot resume") from None
    if digest != config_digest(config_to_dict(config)):
        raise RunError(f"{run_dir}/{CONFIG_FILE} differs from the config the checkpoint was written with "
                       f"(only 'iterations' may change, through `ludus resume --iterations N`)")
    with Store.open(run_dir, mode="read") as store:
        check_ledger(store, mark, run_dir)
    for member in members:
        _check_snapshot(run_dir, member)


def _check_snapshot(run_dir: Path, member: Member) -> None:
    path = Path(member.snapshot_path)
    ref = verify_snapshot(path if path.is_absolute() else run_dir / path)
    if ref.snapshot_id != member.snapshot_id:
        raise RunError(f"snapshot {member.player_id} at {path} holds {ref.snapshot_id[:12]}, not the "
                       f"{member.snapshot_id[:12]} the run recorded (copied over from another member?); "
                       f"restore it, or start a new run")


def _rng_state_to_json(rng: np.random.Generator) -> dict:
    state = rng.bit_generator.state
    return json.loads(json.dumps(state, default=int))


def _rng_from_json(state: dict) -> np.random.Generator:
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = state
    return np.random.Generator(bit_generator)


def _concat(batches: list[RolloutBatch]) -> RolloutBatch | None:
    if not batches:
        return None
    if len(batches) == 1:
        return batches[0]
    fields = RolloutBatch.__dataclass_fields__
    return RolloutBatch(**{name: np.concatenate([getattr(b, name) for b in batches]) for name in fields})


def _select(batch: RolloutBatch, keep: np.ndarray) -> RolloutBatch:
    fields = RolloutBatch.__dataclass_fields__
    return RolloutBatch(**{name: getattr(batch, name)[keep] for name in fields})
