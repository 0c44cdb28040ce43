"""The conversation with an agent: a submission as a player of matches (`SandboxedAgent`), the
match loop that plays sandboxed agents and in-process policies together (`play_match`), and the
records of moves, faults and matches. The overview of the sandbox is in arena/sandbox/process.py."""

from __future__ import annotations

import enum
import math
import os
import select
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ludus.arena import protocol
from ludus.arena.sandbox.isolation import MIB, Isolation, SandboxConfig, SandboxError
from ludus.arena.sandbox.limits import SandboxLimits
from ludus.arena.sandbox.process import SandboxProcess, describe_exit
from ludus.arena.submission import Submission, SubmissionKind, check_submission_game
from ludus.games.core import TextGameRecord, forfeit_returns
from ludus.text import printable, safe_file_name

if TYPE_CHECKING:
    from ludus.agents.policy import Policy
    from ludus.games.core import Game


class MatchStatus(str, enum.Enum):
    """How a seat's match ended."""

    OK = "ok"
    ERROR = "error"
    """The agent crashed, exited, closed stdout, could not start, exceeded memory, or is dead."""
    TIMEOUT = "timeout"
    """The agent did not answer within its per-move time plus what was left of its bank."""
    INVALID = "invalid"
    """The agent sent a malformed line, an illegal action, or a line nobody asked for."""


@dataclass(frozen=True)
class MatchLimits:
    """Time control of a match, sent to agents in ``hello`` and ``start``."""

    time_per_move_s: float = 1.0
    """Seconds per move before the bank is drawn on."""
    overage_s: float = 5.0
    """Bank per seat per match: time beyond the per-move limit comes out of it."""

    def __post_init__(self) -> None:
        if not (self.time_per_move_s > 0 and self.overage_s >= 0):
            raise SandboxError(f"time_per_move_s must be > 0 and overage_s >= 0, got "
                               f"{self.time_per_move_s} and {self.overage_s}")


@dataclass(frozen=True)
class AgentFault:
    """Why an agent lost by forfeit."""

    status: MatchStatus
    reason: str
    """One line, e.g. 'exited with code 1 before answering' or 'illegal action 4'."""
    stderr_tail: str = ""
    """The agent's stderr tail when the fault happened (the traceback, usually)."""
    exit_code: int | None = None
    """Exit code of the agent process if it had exited (128+N: killed by signal N)."""


@dataclass(frozen=True)
class MoveOutcome:
    """One request for an action: the action, or the fault instead."""

    action: int | None
    think_s: float
    """Seconds from sending ``act`` to receiving the answer (or giving up)."""
    fault: AgentFault | None = None


@dataclass(frozen=True)
class MoveRecord:
    """One action of a match, for replays."""

    seat: int
    action: int
    think_s: float
    text: str | None = None
    """A text-move game's move as the agent said it (None: the action was played)."""


@dataclass(frozen=True)
class MatchRecord:
    """Everything a tournament, the ledger and the replay viewer need about one match."""

    match_id: str
    game_id: str
    seed: int
    names: tuple[str, ...]
    """Agent name per seat."""
    returns: tuple[float, ...]
    """Final returns per seat; for forfeits the rule of `forfeit_returns`."""
    statuses: tuple[MatchStatus, ...]
    faults: tuple[AgentFault | None, ...]
    moves: tuple[MoveRecord, ...]
    """Actions in the order they were applied (a simultaneous step lists its seats in order)."""
    truncated: bool
    """The game hit its step limit."""
    think_s: tuple[float, ...]
    """Total thinking time per seat."""
    duration_s: float
    stderr_tails: tuple[str, ...]
    """Each sandboxed seat's stderr during this match (tail); '' for in-process seats."""
    text: "TextGameRecord | None" = None
    """Text-move games: every move's text, the invalid moves the game judged, its own error."""

    @property
    def forfeit(self) -> bool:
        return any(f is not None for f in self.faults)


# ------------------------------------------------------------------------------------- agents


class SandboxedAgent:
    """A submission playing in its own sandboxed process, started once and reused across matches.

    The process starts lazily with the first match (`begin_match`). Use as a context manager, or
    call `close()`, to shut it down and remove its files.
    """

    def __init__(self, submission: "Submission", game_id: str, limits: SandboxLimits = SandboxLimits(),
                 config: SandboxConfig = SandboxConfig()):
        from ludus.games import registry

        if submission.game is not None and submission.game != game_id:
            raise SandboxError(f"submission {submission.name!r} plays {submission.game!r}, not {game_id!r}")
        self.submission = submission
        self.name = submission.name
        self.game_id = game_id
        self.spec = registry.spec(game_id)
        self.limits = limits
        self.config = config
        if submission.path is None:
            raise SandboxError(f"submission {submission.name!r} is a built-in bot; it plays in-process, not sandboxed")
        self._box = SandboxProcess(submission.path, submission.argv, limits, config)
        self.consecutive_faults = 0
        self.total_faults = 0
        self._death: str | None = None
        self.startup_seconds = 0.0
        """Wall-clock time spent in (re)starts so far (against `SandboxLimits.startup_budget_s`)."""
        self._match_moves = 0
        """Actions the agent gave in the current match."""
        self.last_answer_at = 0.0
        """Monotonic time of the agent's last answer (its stray-line window runs `settle_s` from it)."""
        self.starts = 0
        """How many times the process was (re)started."""
        self.ready_name: str | None = None
        """The name the agent announced in ``ready`` (informational)."""
        self._running = False
        self._buf = bytearray()
        self._tail = bytearray()
        self._poller: select.poll | None = None
        self._out_fd = self._in_fd = self._err_fd = -1
        self._next_rss_check = 0.0
        self._match_fault: AgentFault | None = None

    # -- public state

    @property
    def dead(self) -> bool:
        return self.why_dead is not None

    @property
    def why_dead(self) -> str | None:
        """Why the agent gets no more matches this tournament, or None while it does (the first
        budget that ran out: the forfeits of a dead agent are not counted against it again)."""
        if self._death is None:
            self._death = self._budget_exhausted()
        return self._death

    def _budget_exhausted(self) -> str | None:
        limits = self.limits
        if self.consecutive_faults >= limits.max_consecutive_faults:
            return f"is dead after {self.consecutive_faults} faulty matches in a row"
        if self.total_faults >= limits.max_faults:
            return f"is dead after {self.total_faults} faulty matches (budget {limits.max_faults} a tournament)"
        if self.startup_seconds >= limits.startup_budget_s:
            return (f"is dead after {self.startup_seconds:.0f} s spent starting (budget {limits.startup_budget_s:g} s "
                    f"a tournament)")
        return None

    @property
    def running(self) -> bool:
        return self._running

    @property
    def uid(self) -> int:
        return self._box.uid

    @property
    def isolation(self) -> Isolation:
        return self._box.mode

    @property
    def agent_dir(self) -> Path:
        return self._box.agent_dir

    @property
    def leftover_pids(self) -> tuple[int, ...]:
        return self._box.leftover_pids

    def pids(self) -> list[int]:
        return self._box.pids()

    # -- low-level I/O

    def _stderr_text(self) -> str:
        return self._tail.decode("utf-8", "replace")

    def _drain_stderr(self) -> None:
        while True:
            try:
                chunk = os.read(self._err_fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                if self._poller is not None:
                    self._poller.unregister(self._err_fd)
                    self._err_fd = -1
                return
            self._tail += chunk
            if len(self._tail) > self.limits.stderr_tail_bytes:
                del self._tail[:len(self._tail) - self.limits.stderr_tail_bytes]

    def _fault(self, status: MatchStatus, reason: str, exited: bool = False) -> AgentFault:
        """Kill the process and record why, with its stderr drained first (for the traceback).

        `exited`: the process is gone, so wait (briefly) for stderr's EOF to get all of it."""
        if self._running:
            if self._err_fd >= 0:
                self._drain_stderr()
                end = time.monotonic() + 0.2
                while exited and self._err_fd >= 0 and time.monotonic() < end:
                    if select.select([self._err_fd], [], [], max(0.0, end - time.monotonic()))[0]:
                        self._drain_stderr()
            self._stop()
        fault = AgentFault(status, reason, self._stderr_text(), self._box.exit_code)
        if self._match_fault is None:
            self._match_fault = fault
        return fault

    def _exited_fault(self, when: str, stream: str = "stdout") -> AgentFault:
        code = self._box.poll_exit(wait_s=0.5)
        if code is None:
            return self._fault(MatchStatus.ERROR, f"closed its {stream} {when}")
        if self._box.memory_killed():
            return self._fault(MatchStatus.ERROR, f"was killed by the kernel at its memory limit "
                                                  f"({self.limits.rss_mb} MiB plus its tmpfs) {when}", exited=True)
        return self._fault(MatchStatus.ERROR, f"{describe_exit(code)} {when}", exited=True)

    def _stop(self) -> None:
        self._box.kill()
        self._running = False
        self._poller = None
        self._buf.clear()
        self._out_fd = self._in_fd = self._err_fd = -1

    def _write(self, data: bytes, deadline: float, when: str) -> AgentFault | None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._in_fd, view)
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                return self._exited_fault(when, stream="stdin")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._fault(MatchStatus.TIMEOUT, f"did not read its input {when}")
            select.select([], [self._in_fd], [], remaining)
        return None

    def _read_line(self, deadline: float, when: str) -> bytes | AgentFault:
        """The next line from the agent, waiting until `deadline` (polling memory meanwhile)."""
        buf = self._buf
        while True:
            newline = buf.find(b"\n")
            if newline >= 0:
                line = bytes(buf[:newline + 1])
                del buf[:newline + 1]
                if buf:
                    return self._fault(MatchStatus.INVALID, f"sent more than one line {when}")
                return line
            if len(buf) > protocol.MAX_AGENT_LINE_BYTES:
                return self._fault(MatchStatus.INVALID, f"sent a line longer than "
                                                        f"{protocol.MAX_AGENT_LINE_BYTES} bytes {when}")
            now = time.monotonic()
            if now >= deadline:
                return self._fault(MatchStatus.TIMEOUT, f"did not answer in time {when}")
            if now >= self._next_rss_check:
                fault = self._check_memory()
                if fault is not None:
                    return fault
            wait = min(deadline, self._next_rss_check) - now
            events = self._poller.poll(max(1, math.ceil(wait * 1000)))
            for fd, _ in events:
                if fd == self._out_fd:
                    chunk = self._read_stdout(when)
                    if isinstance(chunk, AgentFault):
                        return chunk
                    buf += chunk
                elif fd == self._err_fd:
                    self._drain_stderr()

    def _read_stdout(self, when: str) -> bytes | AgentFault:
        """One read of the agent's stdout (b"" if nothing was ready); a closed stdout is a fault."""
        try:
            chunk = os.read(self._out_fd, 1 << 17)
        except BlockingIOError:
            return b""
        return chunk or self._exited_fault(when)

    def _check_memory(self) -> AgentFault | None:
        self._next_rss_check = time.monotonic() + self.limits.rss_poll_interval_s
        used = self._box.memory_bytes()
        if used > self.limits.rss_mb * MIB:
            return self._fault(MatchStatus.ERROR, f"used {used // MIB} MiB of memory, over its "
                                                  f"{self.limits.rss_mb} MiB limit")
        return None

    def _check_quiet(self, when: str, until: float = 0.0) -> AgentFault | None:
        """Nothing may arrive unasked: check that the agent stays silent on stdout until the
        monotonic time `until` (at once if it has passed), keeping what it writes to stderr."""
        if self._buf:
            return self._fault(MatchStatus.INVALID, f"sent a line nobody asked for {when}")
        while True:
            wait_ms = max(0, int((until - time.monotonic()) * 1000))
            for fd, _ in self._poller.poll(wait_ms):
                if fd == self._err_fd:
                    self._drain_stderr()
                elif fd == self._out_fd:
                    chunk = self._read_stdout(when)
                    if isinstance(chunk, AgentFault):
                        return chunk
                    if chunk:
                        self._buf += chunk
                        return self._fault(MatchStatus.INVALID, f"sent a line nobody asked for {when}")
            if wait_ms == 0:
                return None

    # -- life cycle

    def _start(self, limits: MatchLimits, seat: int, seed: int) -> AgentFault | None:
        began = time.monotonic()
        try:
            return self._launch_and_greet(limits, seat, seed)
        finally:
            self.startup_seconds += time.monotonic() - began

    def _launch_and_greet(self, limits: MatchLimits, seat: int, seed: int) -> AgentFault | None:
        # never past the tournament's startup budget: one start cannot take more than what is left
        left = self.limits.startup_budget_s - self.startup_seconds
        deadline = time.monotonic() + min(self.limits.startup_timeout_s, left)
        self.starts += 1
        problem = self._box.launch(deadline)
        if problem is not None:
            return self._fault(MatchStatus.ERROR, problem)
        proc = self._box.proc
        self._in_fd, self._out_fd, self._err_fd = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
        for fd in (self._in_fd, self._out_fd, self._err_fd):
            os.set_blocking(fd, False)
        self._poller = select.poll()
        self._poller.register(self._out_fd, select.POLLIN)
        self._poller.register(self._err_fd, select.POLLIN)
        self._running = True
        self._next_rss_check = time.monotonic() + self.limits.rss_poll_interval_s
        hello = protocol.Hello(self.game_id, seat, seed, limits.time_per_move_s, limits.overage_s,
                               self.spec.num_actions, self.spec.observation_shape, self.spec.text_moves)
        fault = self._write(protocol.encode_hello(hello), deadline, "at startup")
        if fault is not None:
            return fault
        line = self._read_line(deadline, "at startup (no 'ready' after 'hello')")
        if isinstance(line, AgentFault):
            return line
        try:
            message = protocol.decode_agent_line(line, self.spec.num_actions)
        except protocol.ProtocolError as exc:
            return self._fault(MatchStatus.INVALID, f"bad answer to 'hello': {exc}")
        if not isinstance(message, protocol.Ready):
            return self._fault(MatchStatus.INVALID, "answered 'hello' with an action instead of 'ready'")
        self.ready_name = message.name
        return None

    def begin_match(self, match_id: str, seat: int, seed: int, limits: MatchLimits) -> AgentFault | None:
        """Start the process if needed and send ``start``; a fault means the match is forfeited."""
        self._match_fault = None
        self._match_moves = 0
        if self.dead:
            return self._fault(MatchStatus.ERROR, self.why_dead)
        if not self._running:
            fault = self._start(limits, seat, seed)
            if fault is not None:
                return fault
        fault = self._check_quiet("before the match")
        if fault is not None:
            return fault
        start = protocol.Start(match_id, seat, seed, limits.time_per_move_s, limits.overage_s)
        return self._write(protocol.encode_start(start), time.monotonic() + self.limits.startup_timeout_s,
                           "at the start of the match")

    def send_act(self, match_id: str, observation: np.ndarray, legal_actions: Sequence[int],
                 time_left_s: float) -> AgentFault | None:
        """Ask for an action (answer with `receive_action`); split so simultaneous seats think in parallel."""
        if not self._running:
            return self._match_fault or self._fault(MatchStatus.ERROR, "is not running")
        fault = self._check_quiet("before its move")
        if fault is not None:
            return fault
        line = protocol.encode_act(match_id, observation.tolist(), legal_actions, time_left_s)
        return self._write(line, time.monotonic() + time_left_s, "during its move")

    def receive_action(self, deadline: float, legal_mask: np.ndarray) -> int | str | AgentFault:
        """The agent's answer: an action, or (text-move games) its move as text, or its fault."""
        line = self._read_line(deadline, "during its move")
        if isinstance(line, AgentFault):
            return line
        try:
            message = protocol.decode_agent_line(line, self.spec.num_actions, self.spec.text_moves)
        except protocol.ProtocolError as exc:
            return self._fault(MatchStatus.INVALID, f"malformed action: {exc}")
        if isinstance(message, protocol.Move):  # the game judges it (its own rule for invalid moves)
            self._match_moves += 1
            self.last_answer_at = time.monotonic()
            return message.text
        if not isinstance(message, protocol.Action):
            return self._fault(MatchStatus.INVALID, "sent 'ready' when an action was asked for")
        if not legal_mask[message.action]:
            return self._fault(MatchStatus.INVALID, f"illegal action {message.action}")
        self._match_moves += 1
        self.last_answer_at = time.monotonic()
        return message.action

    def request_action(self, match_id: str, observation: np.ndarray, legal_mask: np.ndarray,
                       time_left_s: float) -> MoveOutcome:
        """Send ``act`` and wait for the answer, at most `time_left_s` seconds."""
        start = time.monotonic()
        legal = np.flatnonzero(legal_mask).tolist()
        fault = self.send_act(match_id, observation, legal, time_left_s)
        if fault is None:
            result = self.receive_action(start + time_left_s, legal_mask)
        else:
            result = fault
        think = time.monotonic() - start
        if isinstance(result, AgentFault):
            return MoveOutcome(None, think, result)
        return MoveOutcome(result, think, None)

    def check_quiet(self, until: float = 0.0) -> AgentFault | None:
        """At the end of a match: a fault if the agent sent anything nobody asked for, listening
        until the monotonic time `until` (`SandboxLimits.settle_s` after the last move)."""
        return self._check_quiet("after its last move", until) if self._running else None

    def send_end(self, match_id: str, returns: Sequence[float], seat: int) -> None:
        """Send ``end``. An agent that cannot take it is not faulted for it (the match is
        decided); it is restarted before its next match."""
        if self._running:
            end = protocol.End(match_id, tuple(float(r) for r in returns), seat)
            self._write(protocol.encode_end(end), time.monotonic() + 1.0, "at the end of the match")

    def finish_match(self, until: float = 0.0, stderr_path: Path | None = None) -> str:
        """Close the match's books after ``end``: keep the stderr written until the monotonic time
        `until` (what the agent writes while handling ``end``) and return the match's stderr tail.
        Output on stdout stays buffered: it faults the next match."""
        if self._running and self._err_fd >= 0:
            self._drain_stderr()
            while self._err_fd >= 0 and (left := until - time.monotonic()) > 0:
                if not select.select([self._err_fd], [], [], left)[0]:
                    break
                self._drain_stderr()
        tail = self._stderr_text()
        if stderr_path is not None:
            stderr_path.write_text(printable(bytes(self._tail).decode("utf-8", "replace")))
        self._tail.clear()
        if self._match_fault is not None and self._death is None:
            self.consecutive_faults += 1
            self.total_faults += 1
        elif self._match_moves:
            self.consecutive_faults = 0
        # else the match ended before this agent moved (the opponent forfeited first): it proved
        # nothing, so a faulty agent does not earn another three restarts from it.
        return tail

    def end_match(self, match_id: str, returns: Sequence[float], seat: int,
                  stderr_path: Path | None = None) -> str:
        """`send_end`, then `finish_match` listening `SandboxLimits.settle_s` for stderr; returns
        the match's stderr tail (for runners that drive one agent; `play_match` ends all seats
        first, then listens once)."""
        self.send_end(match_id, returns, seat)
        return self.finish_match(time.monotonic() + self.limits.settle_s, stderr_path)

    def close(self) -> None:
        """Send ``shutdown``, give the agent a moment to exit, kill what remains, remove its files."""
        if self._running:
            try:
                self._write(protocol.encode_shutdown(), time.monotonic() + 0.5, "at shutdown")
            finally:
                if self._running:
                    self._box.poll_exit(wait_s=self.limits.shutdown_grace_s)
                    self._stop()
        self._box.cleanup()

    def __enter__(self) -> "SandboxedAgent":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -------------------------------------------------------------------------------- match loop


def _seat_seeds(seed: int, num_players: int) -> list[np.random.SeedSequence]:
    return np.random.SeedSequence(seed).spawn(num_players)


def play_match(game_id: str, agents: Sequence["SandboxedAgent | Policy"], seed: int,
               limits: MatchLimits = MatchLimits(), match_id: str | None = None,
               greedy: bool = False, watch: "Callable[[Game], None] | None" = None) -> MatchRecord:
    """Play one match between sandboxed agents and/or in-process policies (bots, snapshots, a
    person's web seat).

    Sandboxed seats are held to `limits`; in-process policies are trusted code and are not timed
    out (their exceptions propagate), except that one may give up the match by raising
    `ludus.agents.policy.SeatForfeit` (a person's web seat that timed out), which is recorded as
    that seat's fault. A player with a true `asks_a_person` attribute (a person's web seat) is
    asked before the sandboxed agents of a simultaneous step, so that its minutes do not run on
    their clocks. A fault ends the match at once as a forfeit (`forfeit_returns`). Each
    seat's randomness derives from `seed`, so a match between deterministic-given-seed agents
    replays exactly. `watch(game)`, if given, is called after the reset and after every step (a
    web seat shows the position to its person).
    """
    from ludus.agents.policy import ActBatch, SeatForfeit
    from ludus.games import registry
    from ludus.games.core import is_over

    game = registry.make(game_id)
    spec = game.spec
    if len(agents) != spec.num_players:
        raise SandboxError(f"{game_id} needs {spec.num_players} agents, got {len(agents)}")
    sandboxed = [a if isinstance(a, SandboxedAgent) else None for a in agents]
    if len({id(a) for a in agents if isinstance(a, SandboxedAgent)}) != sum(a is not None for a in sandboxed):
        raise SandboxError("the same SandboxedAgent cannot take two seats: start one per seat")
    for agent in sandboxed:
        if agent is not None and agent.spec.id != spec.id:
            raise SandboxError(f"agent {agent.name!r} was started for {agent.game_id}, not {game_id}")
    match_id = match_id or f"{seed}"
    started = time.monotonic()
    seat_seq = _seat_seeds(seed, spec.num_players)
    seat_seeds = [int(s.generate_state(1, np.uint64)[0] >> np.uint64(1)) for s in seat_seq]
    rngs = [np.random.default_rng(s) for s in seat_seq]
    faults: list[AgentFault | None] = [None] * spec.num_players
    banks = [limits.overage_s] * spec.num_players
    think = [0.0] * spec.num_players
    moves: list[MoveRecord] = []
    game.reset(seed)
    if watch is not None:
        watch(game)

    for seat, agent in enumerate(sandboxed):
        if agent is not None:
            faults[seat] = agent.begin_match(match_id, seat, seat_seeds[seat], limits)

    while not any(faults) and not is_over(game):
        movers = game.to_move()
        masks = {seat: game.legal_mask(seat) for seat in movers}
        actions: dict[int, int] = {}
        texts: dict[int, str] = {}  # text-move games: moves said as text
        asked: dict[int, float] = {}
        move_think: dict[int, float] = {}

        def ask_in_process(seat: int) -> None:
            agent = agents[seat]
            t0 = time.monotonic()
            try:
                out = agent.act(ActBatch.at_seat(game, seat, agent, masks[seat]), rngs[seat], greedy=greedy)
            except SeatForfeit as exc:
                think[seat] += time.monotonic() - t0
                faults[seat] = AgentFault(MatchStatus(exc.status), exc.reason)
                return
            action = int(out.actions[0])
            move_think[seat] = time.monotonic() - t0
            think[seat] += move_think[seat]
            if spec.text_moves and out.texts is not None and out.texts[0] is not None:
                actions[seat], texts[seat] = -1, str(out.texts[0])
                return
            if not masks[seat][action]:
                raise SandboxError(f"in-process policy {type(agent).__name__} chose illegal action {action}")
            actions[seat] = action

        # A person's seat moves before any agent is asked (a simultaneous step): their minutes
        # must not run on the agents' clocks.
        people = [seat for seat in movers if getattr(agents[seat], "asks_a_person", False)]
        for seat in people:
            ask_in_process(seat)
        if any(faults):
            break
        for seat in movers:  # ask every sandboxed mover first, so they think in parallel
            agent = sandboxed[seat]
            if agent is not None:
                budget = limits.time_per_move_s + banks[seat]
                asked[seat] = time.monotonic()
                faults[seat] = agent.send_act(match_id, game.observation(seat), np.flatnonzero(masks[seat]).tolist(),
                                              budget)
        for seat in movers:
            agent = agents[seat]
            if isinstance(agent, SandboxedAgent):
                if faults[seat] is None:
                    budget = limits.time_per_move_s + banks[seat]
                    result = agent.receive_action(asked[seat] + budget, masks[seat])
                    elapsed = time.monotonic() - asked[seat]
                    think[seat] += elapsed
                    move_think[seat] = elapsed
                    banks[seat] -= max(0.0, elapsed - limits.time_per_move_s)
                    if isinstance(result, AgentFault):
                        faults[seat] = result
                    elif isinstance(result, str):
                        actions[seat], texts[seat] = -1, result
                    else:
                        actions[seat] = result
            elif seat not in people:
                ask_in_process(seat)
        if any(faults):
            break
        if texts:
            game.step_text({seat: texts[seat] if seat in texts else game.move_text(seat, actions[seat])
                            for seat in movers})
        else:
            game.step(actions)
        for seat in movers:
            moves.append(MoveRecord(seat, actions[seat], move_think[seat], texts.get(seat)))
        if watch is not None:
            watch(game)

    # Each seat listens settle_s from its own last answer (in practice only the last mover
    # waits), and one shared window after `end`: a match waits about 2 x settle_s, not per seat.
    present = [agent for agent in sandboxed if agent is not None]
    settle_s = max((agent.limits.settle_s for agent in present), default=0.0)
    if not any(faults):
        # output nobody asked for (a second answer to the last move) forfeits this match
        for seat, agent in enumerate(sandboxed):
            if agent is not None:
                faults[seat] = agent.check_quiet(agent.last_answer_at + agent.limits.settle_s)
    returns = forfeit_returns(spec, [f is not None for f in faults]) if any(faults) \
        else tuple(float(r) for r in game.returns())
    for seat, agent in enumerate(sandboxed):
        if agent is not None:
            agent.send_end(match_id, returns, seat)
    until = time.monotonic() + settle_s
    tails = [""] * spec.num_players
    for seat, agent in enumerate(sandboxed):
        if agent is not None:
            path = None
            if agent.config.stderr_dir is not None:
                path = Path(agent.config.stderr_dir) / f"{safe_file_name(match_id)}.seat{seat}.stderr"
            tails[seat] = agent.finish_match(until, path)
    statuses = tuple(MatchStatus.OK if f is None else f.status for f in faults)
    names = tuple(a.name if isinstance(a, SandboxedAgent) else type(a).__name__ for a in agents)
    return MatchRecord(match_id, game_id, seed, names, returns, statuses, tuple(faults), tuple(moves),
                       bool(game.is_truncated() and not game.is_terminal()), tuple(think),
                       time.monotonic() - started, tuple(tails),
                       game.record() if spec.text_moves else None)


def make_player(submission: Submission, game_id: str, limits: SandboxLimits | None = None,
                config: SandboxConfig | None = None) -> "SandboxedAgent | Policy":
    """What plays a submission in `play_match`: a bot in-process, else a sandbox."""
    check_submission_game(submission.game, game_id, f"submission {submission.name!r}")
    if submission.kind == SubmissionKind.BUILTIN:
        from ludus.agents.bots.builtin import make_bot
        from ludus.games import registry

        return make_bot(submission.bot, registry.spec(game_id))
    return SandboxedAgent(submission, game_id, limits or SandboxLimits(), config or SandboxConfig())
