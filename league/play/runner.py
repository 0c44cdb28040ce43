"""Game runners: play assigned matches in batches and return results and trajectories.

`Runner.play(task)` is pure compute in the Sample Factory sense: given the matches to play
(who sits where, with which seed) and the policies, it steps `num_envs` games at once,
batches inference per policy across games and seats, records the learners' trajectories and
returns finished matches. The serial backend calls it in the manager's process; the process
and Ray backends call the very same method in workers, so their results are identical.

Every match of a task is played to its end before `play` returns, so no game is ever half
recorded and a run can resume exactly from any iteration boundary.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from ludus.agents.policy import ActBatch, KeepsReadings, Policy, act_in_order
from ludus.agents.rollout import RolloutBatch, SeatTrajectoryBuilder, side_critic_inputs, stable_order, take_rows
from ludus.games.core import TextGameRecord, VectorGame, forfeit_returns


@dataclass(frozen=True)
class MatchAssignment:
    """One match to play: who sits on each seat, and its seed."""

    match_id: int
    """Unique, increasing id (allocated by the league manager)."""
    seed: int
    """Game seed, spawned from the run's SeedSequence by match id."""
    players: tuple[str, ...]
    """player_id per seat."""
    kind: str = "training"
    """'training' (updates the payoff table), 'rating' (updates TrueSkill) or 'evaluation'."""


@dataclass(frozen=True)
class PlayTask:
    """A batch of matches for one runner."""

    task_id: int
    """Id of the task (iteration * shards + shard) — also names the sampling stream."""
    assignments: tuple[MatchAssignment, ...]
    """Matches to play, in the order they are started."""
    sample_seed: int
    """Seed of the Generator the policies sample actions with."""
    learners: tuple[str, ...] = ()
    """player_ids whose seats are recorded as trajectories (the live learners)."""
    learner_versions: tuple[int, ...] = ()
    """Policy version of each learner in `learners` (stored with its transitions)."""
    greedy: tuple[str, ...] = ()
    """player_ids that act greedily instead of sampling (evaluation)."""
    gamma: float = 0.99
    """Discount for the learners' GAE (the learner's PPO config)."""
    gae_lambda: float = 0.95
    """GAE lambda for the learners' trajectories."""


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection inside: playing a task and reading its result allocate tens of
    thousands of small objects (moves, match records as they are read), which trigger full
    collections that scan the whole heap (torch, the policy cache: ~0.1 s each, measured);
    reference counting still frees everything that is not in a cycle, and the collector resumes
    afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class LearnerWeights:
    """A learner's weights at one policy version, as numpy arrays (cheap to send to runners)."""

    player_id: str
    version: int
    arrays: dict[str, np.ndarray]


@dataclass(frozen=True)
class PlayedMatch:
    """A finished match."""

    assignment: MatchAssignment
    returns: tuple[float, ...]
    """Final return per seat."""
    length: int
    """Number of steps the game took."""
    moves: tuple[int, ...]
    """The actions applied, in order (the game's history): enough, with the seed, to replay it."""
    player_versions: tuple[int, ...]
    """Policy version per seat (learners' version; 0 for frozen players)."""
    truncated: bool = False
    """The game hit its step limit rather than ending by its rules."""
    forfeited: tuple[int, ...] = ()
    """Seats that gave up the match (`ActOutput.forfeits`): it ended there, `moves` is the prefix
    played, and `returns` follow `ludus.games.core.forfeit_returns`."""
    text: TextGameRecord | None = None
    """Text-move games: every move's text (with the seed, the replay), invalid moves per seat as
    the game judged them, and the game's own error if it failed."""
    turns: tuple[int, ...] = ()
    """Text agents' games: per seat, turns taken (each answered by one or more responses)."""
    invalid_answers: tuple[int, ...] = ()
    """Per seat, responses its agent found invalid and answered again (`ActOutput.invalid_answers`)."""
    said: tuple[tuple[int, int, str], ...] = ()
    """(move index, seat, whole response) of the turns whose agent reasons before it answers
    (`ActOutput.said`): what transcripts show beside the moves."""


@dataclass(frozen=True, eq=False)
class PlayedMatches(Sequence[PlayedMatch]):
    """A task's finished matches, column by column; indexing or iterating gives `PlayedMatch`
    records, in match-id order.

    A task ends ~10^4 matches: a record object per match, built in the runner, pickled to the
    manager and unpickled there, cost ~10% of a self-play task and ~0.1 s per 16k matches of
    pickling (measured); columns cost a few array writes per step and pickle as a few buffers.
    """

    assignments: tuple[MatchAssignment, ...]
    returns: np.ndarray
    """[M, P] float64 final return per seat."""
    lengths: np.ndarray
    """[M] int64 number of steps each game took."""
    move_starts: np.ndarray
    """[M + 1] int64: match i's moves are `moves[move_starts[i]:move_starts[i + 1]]`."""
    moves: np.ndarray
    """int64 actions applied, match after match, in order."""
    player_versions: np.ndarray
    """[M, P] int64 policy version per seat."""
    truncated: np.ndarray
    """[M] bool: the game hit its step limit."""
    forfeited: np.ndarray
    """[M, P] bool: the seat gave up the match."""
    texts: tuple[TextGameRecord | None, ...] | None = None
    """Text-move games: per match, its `TextGameRecord`; None for other games."""
    turns: np.ndarray | None = None
    """[M, P] int64 turns each seat took, where text agents played (None otherwise)."""
    invalid_answers: np.ndarray | None = None
    """[M, P] int64 responses each seat's agent found invalid (None where none were counted)."""
    said: tuple[tuple[tuple[int, int, str], ...], ...] | None = None
    """Per match, `PlayedMatch.said` (None when no agent reasoned aloud)."""

    def _text_fields(self, i: int) -> dict:
        return dict(text=None if self.texts is None else self.texts[i],
                    turns=() if self.turns is None else tuple(self.turns[i].tolist()),
                    invalid_answers=() if self.invalid_answers is None else tuple(self.invalid_answers[i].tolist()),
                    said=() if self.said is None else self.said[i])

    def __len__(self) -> int:
        return len(self.assignments)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self)[index]
        i = range(len(self))[index]  # negative indices, and IndexError past the end
        return PlayedMatch(
            assignment=self.assignments[i], returns=tuple(self.returns[i].tolist()), length=int(self.lengths[i]),
            moves=tuple(self.moves[self.move_starts[i]:self.move_starts[i + 1]].tolist()),
            player_versions=tuple(self.player_versions[i].tolist()), truncated=bool(self.truncated[i]),
            forfeited=tuple(np.flatnonzero(self.forfeited[i]).tolist()), **self._text_fields(i))

    def __iter__(self) -> Iterator[PlayedMatch]:
        # Each column converted once (per-record numpy calls would cost more than the records).
        moves, starts = self.moves.tolist(), self.move_starts.tolist()
        forfeits = {i: tuple(np.flatnonzero(self.forfeited[i]).tolist())
                    for i in np.flatnonzero(self.forfeited.any(axis=1)).tolist()}
        for i, (assignment, returns, length, versions, cut) in enumerate(zip(
                self.assignments, map(tuple, self.returns.tolist()), self.lengths.tolist(),
                map(tuple, self.player_versions.tolist()), self.truncated.tolist())):
            extra = self._text_fields(i) if (self.texts is not None or self.turns is not None
                                             or self.said is not None) else {}
            yield PlayedMatch(assignment=assignment, returns=returns, length=length,
                              moves=tuple(moves[starts[i]:starts[i + 1]]), player_versions=versions,
                              truncated=cut, forfeited=forfeits.get(i, ()), **extra)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (PlayedMatches, tuple, list)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # mutable arrays inside


@dataclass(frozen=True)
class PlayResult:
    """What a runner returns for a task."""

    task_id: int
    matches: PlayedMatches
    rollouts: dict[str, RolloutBatch] = field(default_factory=dict)
    """Trajectories per learner player_id."""
    env_steps: int = 0
    """Decisions taken in the assigned matches (board moves; a simultaneous step counts each seat)."""
    learner_steps: dict[str, int] = field(default_factory=dict)
    """Decisions taken by each learner."""
    seconds: float = 0.0
    """Wall time of the task."""
    inference_seconds: float = 0.0
    """Of which spent in policy inference."""


class Runner:
    """Steps `num_envs` games of one game id; reusable across tasks."""

    def __init__(self, make_vector: Callable[[int], VectorGame], num_envs: int):
        self.vec = make_vector(num_envs)
        self.spec = self.vec.spec
        self.num_envs = num_envs

    @gc_paused()  # a record per match: no full collections over the policies' heap meanwhile
    def play(self, task: PlayTask, policy_of: Callable[[str], Policy]) -> PlayResult:
        """Play every match of `task` to its end. `policy_of(player_id)` gives each seat's policy."""
        start = time.perf_counter()
        spec, vec, num_slots, num_players = self.spec, self.vec, self.num_envs, self.spec.num_players
        rng = np.random.default_rng(task.sample_seed)
        queue = task.assignments
        num_matches = len(queue)

        # Players are coded 0..K-1; per match, the code of each seat; per code, the policy version
        # stored with its moves (learners' version, 0 for frozen players).
        player_ids: list[str] = sorted({p for a in queue for p in a.players})
        code_of = {pid: i for i, pid in enumerate(player_ids)}
        match_codes = np.array([code_of[p] for a in queue for p in a.players], dtype=np.int64).reshape(
            num_matches, num_players)
        match_seeds = np.array([a.seed for a in queue], dtype=np.uint64)
        policies = [policy_of(pid) for pid in player_ids]
        for policy in policies:
            if isinstance(policy, KeepsReadings):
                policy.forget_readings()
        greedy_codes = {code_of[p] for p in task.greedy if p in code_of}
        learner_codes = {code_of[p]: (p, v) for p, v in zip(task.learners, task.learner_versions) if p in code_of}
        code_version = np.zeros(len(player_ids) + 1, dtype=np.int64)  # last entry: idle seats (code -1)
        for code, (_, version) in learner_codes.items():
            code_version[code] = version
        # Binary observations (boards) are stored as uint8: exact, and a quarter of the memory
        # traffic of float32 when trajectories are copied, sorted and sent between processes.
        storage_dtype = "uint8" if spec.binary_observations else spec.observation_dtype
        # Centralised critics (MAPPO sides) read each row's side input: the game's global state or
        # the side's joint observation, computed once per step for every seat when one acts.
        critic_codes = {code for code in learner_codes if getattr(policies[code], "needs_critic_input", False)}
        builders = {
            code: SeatTrajectoryBuilder(num_slots, num_players, spec.observation_shape, spec.num_actions,
                                        storage_dtype,
                                        # np.zeros is lazy (calloc): untouched rows cost no memory.
                                        capacity=min(max(num_matches, num_slots) * spec.max_length, 1 << 22))
            for code in learner_codes
        }

        # Slot bookkeeping: the match index each slot plays (-1 = idle), its seats' player codes.
        slot_match = np.full(num_slots, -1, dtype=np.int64)
        seat_codes = np.full((num_slots, num_players), -1, dtype=np.int64)
        started: list[int] = []
        next_match = min(num_slots, num_matches)

        def seed_source(n: int) -> np.ndarray:
            # Auto-reset asks for seeds of the games that just ended, slots in increasing order:
            # each gets the next match (slots past the end of the queue idle on seed 0).
            nonlocal next_match
            take = np.arange(next_match, min(next_match + n, num_matches))
            next_match += len(take)
            started.extend(take.tolist() + [-1] * (n - len(take)))
            seeds = np.zeros(n, dtype=np.uint64)
            seeds[:len(take)] = match_seeds[take]
            return seeds

        vec.seed_source = seed_source
        slot_match[:next_match] = np.arange(next_match)
        seat_codes[:next_match] = match_codes[:next_match]
        seeds = np.zeros(num_slots, dtype=np.uint64)
        seeds[:next_match] = match_seeds[:next_match]
        ts = vec.reset(seeds)

        max_len = spec.max_length
        move_log = np.full((num_slots, max_len + 1, num_players), -1, dtype=np.int64)
        log_rows = move_log.reshape(num_slots * (max_len + 1), num_players)  # a view: row (slot, step)
        slot_log_start = np.arange(num_slots) * (max_len + 1)
        move_count = np.zeros(num_slots, dtype=np.int64)
        actions = np.zeros((num_slots, num_players), dtype=np.int64)
        log_probs = np.zeros((num_slots, num_players), dtype=np.float32)
        values = np.zeros((num_slots, num_players), dtype=np.float32)
        # Text learners' responses per (slot, seat) of this step, by player code: [S, P, W] tokens and log-probs.
        responses: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # Seats giving up this step (ActOutput.forfeits), and each seat's reward so far in its match
        # (a forfeit sets the match's returns: the learners' last transitions get the difference).
        gave_up = np.zeros((num_slots, num_players), dtype=bool)
        rewarded = np.zeros((num_slots, num_players), dtype=np.float64)
        # The finished matches' columns, by the match's place in the queue (PlayedMatches); their
        # moves come in chunks, one per finish() call: (queue places, moves in order, move counts).
        match_returns = np.zeros((num_matches, num_players), dtype=np.float64)
        match_lengths = np.zeros(num_matches, dtype=np.int64)
        match_versions = np.zeros((num_matches, num_players), dtype=np.int64)
        match_truncated = np.zeros(num_matches, dtype=bool)
        match_forfeited = np.zeros((num_matches, num_players), dtype=bool)
        finished = np.zeros(num_matches, dtype=bool)
        # Text agents and text-move games: each seat's turns and invalid answers, per slot while
        # its match runs and per match once it ends; the text moves of this step; each match's record.
        text_moves = spec.text_moves
        texts_now = np.full((num_slots, num_players), None, dtype=object) if text_moves else None
        counting = False  # set once a text agent reports invalid answers or a text-move game is played
        slot_turns = np.zeros((num_slots, num_players), dtype=np.int64)
        slot_invalid = np.zeros((num_slots, num_players), dtype=np.int64)
        match_turns = np.zeros((num_matches, num_players), dtype=np.int64)
        match_invalid = np.zeros((num_matches, num_players), dtype=np.int64)
        match_records: list[TextGameRecord | None] = [None] * num_matches
        # Responses of agents that reason aloud: per slot while its match runs, per match after.
        slot_said: list[list[tuple[int, int, str]]] = [[] for _ in range(num_slots)]
        match_said: list[tuple[tuple[int, int, str], ...]] = [()] * num_matches
        any_said = False
        move_chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        env_steps = 0
        learner_steps = {pid: 0 for pid, _ in learner_codes.values()}
        inference = 0.0
        live_slots_count = int((slot_match >= 0).sum())

        def finish(rows: np.ndarray, returns: np.ndarray, lengths: np.ndarray, truncated: np.ndarray,
                   forfeited: np.ndarray | None = None, records: Sequence[TextGameRecord | None] | None = None) -> None:
            # The matches these slots play are over (by the game's rules, or a forfeit): their
            # columns are written, and their moves taken from the log in one array pass (a task
            # ends ~10^4 matches; per-slot numpy calls were a tenth of its time).
            places = slot_match[rows]
            counts = move_count[rows]
            logged = move_log[rows, :int(counts.max(initial=0))]  # [E, steps, P]; past a slot's count: stale
            kept = (logged >= 0) & (np.arange(logged.shape[1])[None, :, None] < counts[:, None, None])
            move_chunks.append((places, logged[kept], kept.reshape(len(rows), -1).sum(axis=1)))
            match_returns[places] = returns
            match_lengths[places] = lengths
            match_truncated[places] = truncated
            match_versions[places] = code_version[seat_codes[rows]]
            if forfeited is not None:
                match_forfeited[places] = forfeited
            match_turns[places] = slot_turns[rows]
            match_invalid[places] = slot_invalid[rows]
            slot_turns[rows] = 0
            slot_invalid[rows] = 0
            if any_said:
                for place, row in zip(places.tolist(), rows.tolist()):
                    match_said[place] = tuple(slot_said[row])
                    slot_said[row] = []
            if records is not None:
                for place, record in zip(places.tolist(), records):
                    match_records[place] = record
            finished[places] = True

        # (a slot whose match was forfeited idles until its game ends, then takes the next match)
        while live_slots_count > 0 or next_match < num_matches:
            acting = ts.acting
            live = acting & (seat_codes >= 0)
            # Idle slots play their first legal action: cheap, and they never reach the ledger.
            idle = acting & (seat_codes < 0)
            if idle.any():
                actions[idle] = np.argmax(ts.mask[idle], axis=1)
            t0 = time.perf_counter()
            # Group the live seats (flat index slot * num_players + seat) by player with one stable
            # sort (a radix sort on 16-bit codes), gather observations and masks once in that
            # order, and give each policy a contiguous slice: one batched act() per policy.
            seats_flat = np.flatnonzero(live)
            codes_now = seat_codes.reshape(-1)[seats_flat]
            order = stable_order(codes_now, len(player_ids))
            codes_sorted, flat_sorted = codes_now[order], seats_flat[order]
            slots_sorted, seats_sorted = np.divmod(flat_sorted, num_players)
            obs_sorted = take_rows(ts.obs.reshape(num_slots * num_players, *ts.obs.shape[2:]), flat_sorted)
            mask_sorted = take_rows(ts.mask.reshape(num_slots * num_players, -1), flat_sorted)
            acts = np.empty(len(order), dtype=np.int64)
            lps = np.empty(len(order), dtype=np.float32)
            vals = np.empty(len(order), dtype=np.float32)
            group_starts = np.flatnonzero(np.r_[True, codes_sorted[1:] != codes_sorted[:-1]]) if len(order) else order
            group_codes = codes_sorted[group_starts]
            group_ends = np.append(group_starts[1:], len(order))
            critic_now = None  # only in steps where a centralised-critic side acts (its builder records nothing else)
            if not critic_codes.isdisjoint(group_codes.tolist()):
                critic_now = side_critic_inputs(ts.obs, vec.global_states() if spec.state_shape is not None else None,
                                                spec.team_of_seat)
            groups = list(zip(group_codes.tolist(), group_starts.tolist(), group_ends.tolist()))
            requests = []
            for code, lo, hi in groups:
                policy = policies[code]
                histories = ([vec.history(int(b)) for b in slots_sorted[lo:hi]] if policy.needs_history else None)
                critic_rows = (critic_now[slots_sorted[lo:hi], seats_sorted[lo:hi]] if code in critic_codes else None)
                requests.append((policy, ActBatch(obs_sorted[lo:hi], mask_sorted[lo:hi], seats_sorted[lo:hi],
                                                  histories, critic_rows), code in greedy_codes))
            for (code, lo, hi), out in zip(groups, act_in_order(requests, rng)):
                acts[lo:hi], lps[lo:hi], vals[lo:hi] = out.actions, out.log_probs, out.values
                if out.texts is not None and text_moves:
                    for row, text in zip(range(lo, hi), out.texts):
                        texts_now[slots_sorted[row], seats_sorted[row]] = text
                if out.said is not None:
                    any_said = True
                    for row, text in zip(range(lo, hi), out.said):
                        slot = int(slots_sorted[row])
                        slot_said[slot].append((int(move_count[slot]), int(seats_sorted[row]), str(text)))
                if out.invalid_answers is not None or out.texts is not None:
                    counting = True
                    slot_turns[slots_sorted[lo:hi], seats_sorted[lo:hi]] += 1
                    if out.invalid_answers is not None:
                        slot_invalid[slots_sorted[lo:hi], seats_sorted[lo:hi]] += out.invalid_answers
                if out.forfeits is not None and out.forfeits.any():
                    quit_rows = np.flatnonzero(out.forfeits) + lo
                    gave_up[slots_sorted[quit_rows], seats_sorted[quit_rows]] = True
                if code in learner_codes:
                    learner_steps[learner_codes[code][0]] += hi - lo
                    if out.responses is not None:
                        width = out.responses.shape[1]
                        if code not in responses or responses[code][0].shape[2] != width:
                            responses[code] = (np.full((num_slots, num_players, width), -1, dtype=np.int64),
                                               np.zeros((num_slots, num_players, width), dtype=np.float32))
                        rows = slots_sorted[lo:hi], seats_sorted[lo:hi]
                        responses[code][0][rows], responses[code][1][rows] = out.responses, out.response_log_probs
            actions[slots_sorted, seats_sorted] = acts
            log_probs[slots_sorted, seats_sorted] = lps
            values[slots_sorted, seats_sorted] = vals
            inference += time.perf_counter() - t0
            if builders:
                versions = code_version[seat_codes]
                for code, builder in builders.items():
                    tokens, token_log_probs = responses.get(code, (None, None))
                    builder.record_actions(ts, actions, log_probs, values, seat_codes == code, versions,
                                           tokens, token_log_probs, critic_now if code in critic_codes else None)
            if gave_up.any():
                # The match ends here by forfeit. Its game still runs out in the vector (the slot
                # idles, as slots past the end of the queue do) and the slot then takes the next match.
                quit_slots = np.flatnonzero(gave_up.any(axis=1)).tolist()
                quit_returns = [forfeit_returns(spec, gave_up[slot].tolist()) for slot in quit_slots]
                finish(np.array(quit_slots), np.array(quit_returns), move_count[quit_slots], False, gave_up[quit_slots],
                       [vec.record(slot) for slot in quit_slots] if text_moves else None)
                for slot, returns in zip(quit_slots, quit_returns):
                    for builder in builders.values():
                        builder.end_game(slot, np.asarray(returns) - rewarded[slot])
                slot_match[quit_slots] = -1
                seat_codes[quit_slots] = -1
                live_slots_count -= len(quit_slots)
                gave_up[:] = False
            # Log the moves (simultaneous games log every acting seat of the step). Idle slots log
            # too, cheaper than picking the live ones: nothing reads an idle slot's log, and its
            # count restarts at 0 with its next match.
            log_rows[slot_log_start + np.minimum(move_count, max_len)] = np.where(acting, actions, -1)
            move_count += 1
            env_steps += len(seats_flat)

            started.clear()
            if text_moves:
                given = texts_now if any(t is not None for t in texts_now.flat) else None
                ts = vec.step(actions, given)
                texts_now[:] = None
            else:
                ts = vec.step(actions)
            for builder in builders.values():
                builder.record_outcome(ts)
            rewarded += ts.rewards
            if not ts.done.any():
                continue
            # seed_source ran inside step for exactly these slots, in this order.
            ended = np.flatnonzero(ts.done)
            rewarded[ended] = 0.0
            was_live = slot_match[ended] >= 0
            over = ended[was_live]
            if len(over):
                finish(over, ts.final_returns[over], ts.final_lengths[over], ts.truncated[over], None,
                       [ts.final_records[b] for b in over.tolist()] if text_moves else None)
            new = np.array(started, dtype=np.int64)
            slot_match[ended] = new
            seat_codes[ended] = np.where((new >= 0)[:, None], match_codes[np.maximum(new, 0)], -1)
            move_count[ended] = 0
            live_slots_count += int((new >= 0).sum()) - int(was_live.sum())

        rollouts = {}
        for code, builder in builders.items():
            # Every recorded game has ended, so every transition is closed.
            rollouts[learner_codes[code][0]] = builder.build(ts, None, task.gamma, task.gae_lambda)
        if not finished.all():
            raise RuntimeError(f"task {task.task_id}: {int((~finished).sum())} matches never finished")
        # The columns in match-id order; each match's moves gathered from its chunk.
        by_id = np.argsort(np.fromiter((a.match_id for a in queue), dtype=np.int64, count=num_matches), kind="stable")
        places, moves, counts = (np.concatenate(column) for column in zip(*move_chunks)) if move_chunks else (
            np.zeros(0, dtype=np.int64),) * 3
        first_move = np.zeros(num_matches, dtype=np.int64)  # by queue place: where its moves start in `moves`
        first_move[places] = np.cumsum(counts) - counts
        move_counts = np.zeros(num_matches, dtype=np.int64)
        move_counts[places] = counts
        move_starts = np.zeros(num_matches + 1, dtype=np.int64)
        np.cumsum(move_counts[by_id], out=move_starts[1:])
        gather = np.repeat(first_move[by_id] - move_starts[:-1], move_counts[by_id]) + np.arange(move_starts[-1])
        matches = PlayedMatches(
            assignments=tuple(queue[i] for i in by_id.tolist()), returns=match_returns[by_id],
            lengths=match_lengths[by_id], move_starts=move_starts, moves=moves[gather],
            player_versions=match_versions[by_id], truncated=match_truncated[by_id],
            forfeited=match_forfeited[by_id],
            texts=tuple(match_records[i] for i in by_id.tolist()) if text_moves else None,
            turns=match_turns[by_id] if counting or text_moves else None,
            invalid_answers=match_invalid[by_id] if counting or text_moves else None,
            said=tuple(match_said[i] for i in by_id.tolist()) if any_said else None)
        return PlayResult(task.task_id, matches, rollouts, env_steps, learner_steps, time.perf_counter() - start,
                          inference)
