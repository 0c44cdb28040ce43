"""The arena sandbox against the hostile zoo (tests/hostile_agents/) and honest agents.

Every hostile agent plays tic-tac-toe against one honest sandboxed agent whose process lives for
the whole module (as in a tournament); each match must end with the right status, the honest
agent's results must stay intact, what the hostile agents tried (files, sockets) must have
failed (they report it on stderr, which the match record keeps), and no process of any agent
may remain. Under LUDUS_CI=1 a machine without namespace isolation fails these tests.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import time
import re
import socket
import stat
import tomllib
from pathlib import Path

import numpy as np
import pytest

from ludus.arena import protocol
from ludus.arena.sandbox.isolation import (Isolation, SandboxConfig, SandboxError, pids_of_uid, resolve_isolation,
                             stray_agent_processes)
from ludus.arena.match import AgentFault, MatchLimits, MatchStatus, SandboxedAgent, play_match
from ludus.games.core import forfeit_returns
from ludus.arena.sandbox.limits import SandboxLimits
from ludus.arena.match import make_player
from ludus.arena.submission import Submission, SubmissionKind, validate_submission
from ludus.games import registry

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "tests" / "hostile_agents"
EXAMPLES = REPO / "examples" / "agents"
GAME = "tic_tac_toe"
LIMITS = MatchLimits(time_per_move_s=0.5, overage_s=0.3)
BOX = SandboxLimits(startup_timeout_s=20, rss_mb=256, data_mb=1024, max_processes=32, cpu_time_s=60)


def require_isolation() -> Isolation:
    mode = resolve_isolation(SandboxConfig())
    if mode == Isolation.NONE:
        message = "no namespace isolation here: run as root or enable user namespaces"
        if os.environ.get("LUDUS_CI") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return mode


def unchecked(name: str) -> Submission:
    """A zoo submission built without `validate_submission` (which would refuse some of them):
    the sandbox must hold even against submissions that slipped past validation."""
    folder = ZOO / name
    manifest = tomllib.loads((folder / "agent.toml").read_text())
    kind = SubmissionKind.EXECUTABLE if "executable" in manifest else SubmissionKind.PYTHON_FOLDER
    return Submission(kind, name, "1", None, folder, "unchecked", entry_point=manifest.get("entry_point"),
                      executable=manifest.get("executable"))


@pytest.fixture(scope="module")
def honest():
    """The honest opponent: one process for the whole module, like an agent in a tournament."""
    require_isolation()
    agent = SandboxedAgent(validate_submission(EXAMPLES / "random_python", GAME), GAME, BOX)
    yield agent
    agent.close()
    assert agent.leftover_pids == ()


@pytest.fixture(scope="module")
def arena_state(tmp_path_factory):
    """A stand-in for the arena's state: a 0700 directory holding its 'database'."""
    state = tmp_path_factory.mktemp("arena-state")
    os.chmod(state, 0o700)
    (state / "ledger.sqlite").write_bytes(b"SQLite format 3\x00 the real ledger")
    return state


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    """Where the arena keeps uploaded submissions (private to the arena)."""
    root = tmp_path_factory.mktemp("uploads")
    os.chmod(root, 0o700)
    (root / "secret_agent.py").write_text("WEIGHTS = 'the secret strategy'\n")
    return root


@pytest.fixture(scope="module")
def listener():
    """A TCP server on 127.0.0.1 in the host's network namespace: no agent may reach it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    yield server
    with pytest.raises(BlockingIOError):
        server.accept()
    server.close()


def play_hostile(name: str, honest: SandboxedAgent, hostile_seat: int, config: SandboxConfig = SandboxConfig(),
                 box: SandboxLimits = BOX):
    """One match of a zoo agent against the honest one; returns (record, pids while alive, agent)."""
    agent = SandboxedAgent(unchecked(name), GAME, box, config)
    try:
        seats = [agent, honest] if hostile_seat == 0 else [honest, agent]
        record = play_match(GAME, seats, seed=hostile_seat + 11, limits=LIMITS, match_id=f"zoo-{name}")
        alive = agent.pids()
    finally:
        agent.close()
    assert agent.leftover_pids == (), f"{name}: processes remain after close"  # verified before the uid is released
    return record, alive, agent


FORFEITS = [
    ("crash_at_import", MatchStatus.ERROR, "at startup", "hostile crash at import"),
    ("crash_mid_game", MatchStatus.ERROR, "exited with code 1", "hostile crash mid-game"),
    ("infinite_loop", MatchStatus.TIMEOUT, "did not answer in time", ""),
    ("sleep_past_limit", MatchStatus.TIMEOUT, "did not answer in time", ""),
    # stopped by the RSS poll, or by RLIMIT_DATA first (MemoryError) when the machine is busy
    ("memory_bomb", MatchStatus.ERROR, "MiB limit|memory limit|exited with code 1", "MEMORY_BOMB|MemoryError"),
    ("illegal_move", MatchStatus.INVALID, "illegal action", ""),
    ("garbage_output", MatchStatus.INVALID, "not valid JSON", ""),
    ("megabytes_output", MatchStatus.INVALID, "longer than 65536 bytes", ""),
    ("closes_stdout", MatchStatus.ERROR, "closed its stdout", "CLOSED stdout"),
    ("answers_twice", MatchStatus.INVALID, "more than one line", ""),
]


@pytest.mark.parametrize("index", range(len(FORFEITS)), ids=[case[0] for case in FORFEITS])
def test_hostile_agent_forfeits(index, honest):
    name, status, reason, stderr = FORFEITS[index]
    hostile_seat = index % 2
    record, _, _ = play_hostile(name, honest, hostile_seat)
    honest_seat = 1 - hostile_seat
    assert record.statuses[hostile_seat] == status, record.faults[hostile_seat]
    assert record.statuses[honest_seat] == MatchStatus.OK
    fault = record.faults[hostile_seat]
    assert isinstance(fault, AgentFault) and re.search(reason, fault.reason), fault.reason
    assert re.search(stderr, record.stderr_tails[hostile_seat]), record.stderr_tails[hostile_seat]
    # forfeit: the faulting seat loses, the honest opponent wins (two-player zero-sum)
    assert record.returns[hostile_seat] == -1.0 and record.returns[honest_seat] == 1.0
    assert record.faults[honest_seat] is None and honest.running


def play_clean(name, honest, config=SandboxConfig(), hostile_seat=0):
    """A zoo agent that plays legal moves while probing: the match itself must be normal."""
    record, alive, agent = play_hostile(name, honest, hostile_seat, config)
    assert record.statuses == (MatchStatus.OK, MatchStatus.OK), record.faults
    assert not record.forfeit and sum(record.returns) == 0.0 and len(record.moves) >= 5
    # the moves replay to the recorded result
    game = registry.make(GAME)
    game.reset(record.seed)
    for move in record.moves:
        game.step({move.seat: move.action})
    assert tuple(game.returns()) == record.returns
    return record, alive, agent


def test_cannot_write_the_arena_database(honest, arena_state):
    db = arena_state / "ledger.sqlite"
    before = db.read_bytes()
    config = SandboxConfig(extra_env=(("LUDUS_ARENA_DB", str(db)),))
    record, _, _ = play_clean("write_arena_db", honest, config)
    tail = record.stderr_tails[0]
    attempts = re.findall(r"^WRITE (\S+): (\w+)", tail, flags=re.M)
    assert len(attempts) == 4 and {outcome for _, outcome in attempts} == {"denied"}, tail
    assert db.read_bytes() == before and sorted(p.name for p in arena_state.iterdir()) == ["ledger.sqlite"]
    assert not (REPO / "hostile-was-here").exists()


def test_cannot_read_other_submissions(honest, uploads, arena_state):
    # the honest agent's private copy, its directory, the arena's uploads and state, plus two
    # world-readable paths of the repo hidden with SandboxConfig.hidden_paths
    targets = [honest.agent_dir / "submission" / "agent.py", honest.agent_dir, uploads / "secret_agent.py",
               arena_state / "ledger.sqlite", REPO / "README.md", REPO / "docs"]
    config = SandboxConfig(extra_env=(("LUDUS_PROBE_READ", ":".join(map(str, targets))),),
                           # the ledger lies under /tmp, out of sight already: hiding it must still work
                           hidden_paths=(str(REPO / "README.md"), str(REPO / "docs"),
                                         str(arena_state / "ledger.sqlite")))
    record, _, _ = play_clean("read_other_submission", honest, config, hostile_seat=1)
    tail = record.stderr_tails[1]
    for target in targets[:4]:
        assert f"READ {target}: denied" in tail, tail
    assert f"READ {REPO / 'README.md'}: read 0 bytes" in tail, tail  # an empty file mounted over it
    assert f"READ {REPO / 'docs'}: denied" in tail, tail
    assert "secret strategy" not in tail


def test_cannot_open_sockets(honest, listener):
    port = listener.getsockname()[1]
    record, _, _ = play_clean("open_socket", honest, SandboxConfig(extra_env=(("LUDUS_PROBE_PORT", str(port)),)))
    tail = record.stderr_tails[0]
    attempts = re.findall(r"^SOCKET (.+?): (\w+)", tail, flags=re.M)
    assert len(attempts) == 3 and {outcome for _, outcome in attempts} == {"denied"}, tail
    assert "INTERFACES ['lo']" in tail


def test_fork_bomb_is_capped(honest):
    record, alive, _ = play_clean("fork_bomb", honest)
    forks = int(re.search(r"FORK_BOMB stopped after (\d+) forks", record.stderr_tails[0]).group(1))
    assert 0 < forks < BOX.max_processes
    assert len(alive) > forks // 2  # the children were alive until the agent was closed (and now are not)


def test_double_forked_daemon_is_killed(honest):
    record, alive, _ = play_clean("daemon", honest, hostile_seat=1)
    assert "DAEMON started" in record.stderr_tails[1]
    assert len(alive) >= 2  # the agent and its daemon, which close() must have killed


def test_stderr_is_kept_as_a_capped_tail(honest, tmp_path):
    record, _, _ = play_clean("stderr_flood", honest, SandboxConfig(stderr_dir=tmp_path))
    tail = record.stderr_tails[0]
    assert tail.endswith("FLOOD done\n") and len(tail.encode()) <= BOX.stderr_tail_bytes
    assert (tmp_path / "zoo-stderr_flood.seat0.stderr").read_text() == tail


def test_cpu_time_rlimit_kills_a_spinning_agent(honest):
    box = SandboxLimits(startup_timeout_s=20, cpu_time_s=1)
    agent = SandboxedAgent(unchecked("infinite_loop"), GAME, box)
    try:
        record = play_match(GAME, [agent, honest], seed=3, limits=MatchLimits(time_per_move_s=10, overage_s=0))
    finally:
        agent.close()
    assert record.statuses[0] == MatchStatus.ERROR
    assert "SIGXCPU" in record.faults[0].reason or "SIGKILL" in record.faults[0].reason
    assert record.think_s[0] < 8


def test_faulty_agent_is_restarted_then_dead(honest):
    box = SandboxLimits(startup_timeout_s=20, max_consecutive_faults=2)
    with SandboxedAgent(unchecked("crash_mid_game"), GAME, box) as agent:
        reasons = []
        for seed in range(3):
            record = play_match(GAME, [agent, honest], seed=seed, limits=LIMITS)
            assert record.statuses == (MatchStatus.ERROR, MatchStatus.OK)
            reasons.append(record.faults[0].reason)
        assert agent.starts == 2 and agent.dead  # the third match never started it
        assert "dead after 2 faulty matches" in reasons[2]


def test_a_match_the_opponent_forfeits_first_does_not_clear_the_fault_count(honest):
    box = SandboxLimits(startup_timeout_s=20, max_consecutive_faults=2)
    with SandboxedAgent(unchecked("crash_mid_game"), GAME, box) as agent, \
            SandboxedAgent(unchecked("crash_at_import"), GAME, box) as broken:
        record = play_match(GAME, [agent, honest], seed=0, limits=LIMITS)
        assert record.statuses[0] == MatchStatus.ERROR and agent.consecutive_faults == 1
        record = play_match(GAME, [broken, agent], seed=1, limits=LIMITS)  # agent never gets to move
        assert record.statuses == (MatchStatus.ERROR, MatchStatus.OK) and agent.consecutive_faults == 1
        record = play_match(GAME, [agent, honest], seed=2, limits=LIMITS)
        assert record.statuses[0] == MatchStatus.ERROR and agent.dead


def test_honest_opponent_lived_through_the_zoo(honest):
    """All the matches above used one honest process: never restarted, never faulted."""
    assert honest.starts == 1 and honest.total_faults == 0 and honest.running


def test_honest_agents_in_two_languages():
    require_isolation()
    python = validate_submission(EXAMPLES / "random_python", GAME)
    shell = validate_submission(EXAMPLES / "random_sh", GAME)
    assert shell.kind == SubmissionKind.EXECUTABLE
    with SandboxedAgent(python, GAME, BOX) as a, SandboxedAgent(shell, GAME, BOX) as b:
        records = [play_match(GAME, [a, b] if s % 2 == 0 else [b, a], seed=s, limits=LIMITS) for s in range(6)]
        again = play_match(GAME, [a, b], seed=0, limits=LIMITS)
        assert a.starts == 1 and b.starts == 1
    for record in records:
        assert record.statuses == (MatchStatus.OK, MatchStatus.OK) and not record.forfeit
        assert record.returns in ((1.0, -1.0), (-1.0, 1.0), (0.0, 0.0))
    assert len({tuple(m.action for m in r.moves) for r in records}) > 1  # seeds matter
    # a match replays exactly from its seed
    assert [m.action for m in again.moves] == [m.action for m in records[0].moves]


def test_builtin_bot_plays_in_process_against_a_sandbox():
    require_isolation()
    perfect = make_player(validate_submission("perfect", GAME), GAME)
    assert not isinstance(perfect, SandboxedAgent)
    with make_player(validate_submission(EXAMPLES / "random_sh", GAME), GAME, BOX) as shell:
        for seed in range(4):
            seats = [perfect, shell] if seed % 2 == 0 else [shell, perfect]
            record = play_match(GAME, seats, seed=seed, limits=LIMITS)
            assert record.statuses == (MatchStatus.OK, MatchStatus.OK)
            assert record.returns[seats.index(perfect)] >= 0.0  # perfect play never loses


def test_snapshot_submission_plays_with_torch_inside_the_sandbox(tmp_path):
    require_isolation()
    import torch

    from ludus.agents.nets import ActorCritic, NetConfig
    from ludus.agents.snapshot import save_snapshot

    spec = registry.spec(GAME)
    torch.manual_seed(0)
    config = NetConfig(hidden=(16,))
    ref = save_snapshot(ActorCritic(spec, config), spec, config, tmp_path / "snap")
    # built directly: validation (which loads it once more in a sandbox) is tested in test_submission.py
    submission = Submission(SubmissionKind.SNAPSHOT, "snap", "1", GAME, ref.path, ref.snapshot_id)
    with SandboxedAgent(submission, GAME, SandboxLimits(startup_timeout_s=60, rss_mb=1024)) as snap, \
            SandboxedAgent(validate_submission(EXAMPLES / "random_sh", GAME), GAME, BOX) as shell:
        for seed in range(2):
            record = play_match(GAME, [snap, shell] if seed == 0 else [shell, snap], seed=seed, limits=LIMITS)
            assert record.statuses == (MatchStatus.OK, MatchStatus.OK), record.faults


def test_unisolated_mode_is_refused_when_isolation_is_required():
    with pytest.raises(SandboxError, match="require_isolation"):
        resolve_isolation(SandboxConfig(isolation=Isolation.NONE, require_isolation=True))


def test_unisolated_mode_plays_and_cleans_up():
    """Mode 'none' (no namespaces): still rlimits, a process group, and as root a uid of its own."""
    config = SandboxConfig(isolation=Isolation.NONE)
    shell = validate_submission(EXAMPLES / "random_sh", GAME)
    with SandboxedAgent(shell, GAME, BOX, config) as a, SandboxedAgent(shell, GAME, BOX, config) as b:
        record = play_match(GAME, [a, b], seed=4, limits=LIMITS)
        assert record.statuses == (MatchStatus.OK, MatchStatus.OK)
        (pid,) = a.pids()
        if os.geteuid() == 0:
            assert os.stat(f"/proc/{pid}").st_uid == a.uid != 0
    assert a.leftover_pids == () and b.leftover_pids == ()


def test_agent_directory_is_private():
    mode = require_isolation()
    with SandboxedAgent(validate_submission(EXAMPLES / "random_python", GAME), GAME, BOX) as agent:
        outer = os.stat(agent.agent_dir.parent)
        inner = os.stat(agent.agent_dir)
        assert stat.S_IMODE(outer.st_mode) == 0o711  # passable, not listable
        assert stat.S_IMODE(inner.st_mode) == 0o700
        if mode == Isolation.UID:
            assert inner.st_uid == agent.uid != 0
        directory = agent.agent_dir
    assert not directory.exists()


def test_no_agent_process_remains_anywhere(honest):
    """After everything above: no process runs under an agent uid that no live sandbox holds
    (the honest agent, still open, holds its own; agents of concurrent test runs hold theirs)."""
    assert stray_agent_processes() == {}  # the detector itself is shown to find strays below
    if honest.isolation == Isolation.UID:
        assert pids_of_uid(honest.uid) == honest.pids() and len(honest.pids()) == 1


def test_stray_detector_finds_a_planted_stray():
    """A process left under an agent uid that no sandbox holds is reported (so the checks above that
    expect none can fail): planted as root under the last agent uid, or, without root, as a process
    in a PID namespace of the sandbox launcher that no live sandbox holds."""
    require_isolation()
    config = SandboxConfig()
    if os.geteuid() == 0:
        uid = config.uid_base + config.uid_count - 1
        planted = subprocess.Popen(["sleep", "60"], user=uid, group=uid, extra_groups=[])
        try:
            deadline = time.monotonic() + 5
            while uid not in stray_agent_processes(config) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert planted.pid in stray_agent_processes(config).get(uid, []), stray_agent_processes(config)
        finally:
            planted.kill()
            planted.wait()
        assert uid not in stray_agent_processes(config)
    else:
        from ludus.arena.sandbox import isolation

        agent = SandboxedAgent(validate_submission(EXAMPLES / "random_python", GAME), GAME, BOX)
        try:
            agent.begin_match("probe", 0, 0, LIMITS)
            ns = agent._box._pid_ns
            assert ns and stray_agent_processes() == {}
            isolation.LIVE_NAMESPACES.discard(ns)  # as if its arena had died without cleaning up
            assert set(agent.pids()) <= set(stray_agent_processes().get(os.getuid(), [])) and agent.pids()
            isolation.LIVE_NAMESPACES.add(ns)
        finally:
            agent.close()


# ------------------------------------------------------------------------------ forfeit rule


def test_forfeit_returns_rule():
    two = registry.spec(GAME)
    assert forfeit_returns(two, [True, False]) == (-1.0, 1.0)
    assert forfeit_returns(two, [True, True]) == (-1.0, -1.0)
    three = registry.spec("spiel:kuhn_poker(players=3)")
    shares = forfeit_returns(three, [False, True, False])
    assert shares[1] == three.min_utility and shares[0] == shares[2] > 0
    assert abs(sum(shares) - three.utility_sum) < 1e-9 or shares[0] == three.max_utility


# ---------------------------------------------------------------------------------- protocol


def test_protocol_round_trips_and_is_compact():
    hello = protocol.Hello(GAME, 1, 7, 0.5, 2.0, 9, (3, 3, 3))
    line = protocol.encode_hello(hello)
    assert line.endswith(b"\n") and b" " not in line and line.startswith(b'{"type":"hello","protocol":1,')
    assert protocol.decode_arena_line(line) == hello
    start = protocol.Start("m1", 0, 3, 0.5, 2.0)
    assert protocol.decode_arena_line(protocol.encode_start(start)) == start
    act = protocol.decode_arena_line(protocol.encode_act("m1", [[0.0, 1.0]], [0, 4], 0.25))
    assert act == protocol.Act("m1", [[0.0, 1.0]], (0, 4), 0.25)
    end = protocol.End("m1", (1.0, -1.0), 0)
    assert protocol.decode_arena_line(protocol.encode_end(end)) == end
    assert protocol.decode_arena_line(protocol.encode_shutdown()) == protocol.Shutdown()
    assert protocol.decode_agent_line(protocol.encode_action(4), 9) == protocol.Action(4)
    assert protocol.decode_agent_line(protocol.encode_ready("me"), 9) == protocol.Ready("me")


@pytest.mark.parametrize("line, message", [
    (b'{"type":"action","action":9}', "out of range"),
    (b'{"type":"action","action":-1}', "out of range"),
    (b'{"type":"action","action":true}', "must be an integer"),
    (b'{"type":"action","action":1.0}', "must be an integer"),
    (b'{"type":"action","action":1,"extra":2}', "unknown keys"),
    (b'{"type":"action"}', "missing keys"),
    (b'{"type":"move","action":1}', "moves are actions"),  # 'move' is for text-move games only
    (b'{"type":"pass"}', "unknown agent message type"),
    (b'[1, 2]', "not a JSON object"),
    (b'{"type":"action","action":NaN}', "not valid JSON"),
    (b'\xff\xfe', "not valid UTF-8"),
    (b'{"type":"ready","name":"' + b"x" * 200 + b'"}', "at most 100 characters"),
    (b'{"type":"action","action":1' + b" " * protocol.MAX_AGENT_LINE_BYTES + b"}", "exceeds"),
])
def test_protocol_rejects_bad_agent_lines(line, message):
    with pytest.raises(protocol.ProtocolError, match=message):
        protocol.decode_agent_line(line, 9)


def test_protocol_rejects_bad_arena_lines():
    with pytest.raises(protocol.ProtocolError, match="protocol"):
        protocol.decode_arena_line(protocol.encode_hello(protocol.Hello(GAME, 0, 0, 1, 1, 9, (9,))).replace(
            b'"protocol":1', b'"protocol":2'))
    with pytest.raises(protocol.ProtocolError, match="legal_actions"):
        protocol.decode_arena_line(b'{"type":"act","match":"m","observation":[],"legal_actions":[],"time_left_s":1}')


def test_request_action_reports_think_time_and_bank(honest):
    """The low-level API the tournament runner may use directly."""
    fault = honest.begin_match("direct", 0, 5, LIMITS)
    assert fault is None
    mask = np.zeros(9, dtype=bool)
    mask[[2, 6]] = True
    outcome = honest.request_action("direct", np.zeros((3, 3, 3), np.float32), mask, 0.5)
    assert outcome.fault is None and outcome.action in (2, 6) and 0 < outcome.think_s < 0.5
    honest.end_match("direct", (0.0, 0.0), 0)


def _host_shm_keys() -> set[int]:
    with open("/proc/sysvipc/shm") as f:
        next(f)
        return {int(line.split()[0]) for line in f if line.strip()}


def test_shared_memory_segments_stay_inside_one_agent(honest):
    """tests/hostile_agents/shm_segment leaves a 0666 SysV segment under a fixed key and reads any
    other: two of them in one match must not see each other's (own IPC namespace each), the host
    must not see either, and nothing remains after the match."""
    key = 0x1D5A7E
    assert key not in _host_shm_keys()
    config = SandboxConfig(extra_env=(("LUDUS_SHM_KEY", hex(key)),))
    first = SandboxedAgent(unchecked("shm_segment"), GAME, BOX, config)
    second = SandboxedAgent(unchecked("shm_segment"), GAME, BOX, config)
    try:
        record = play_match(GAME, [first, second], seed=5, limits=LIMITS, match_id="zoo-shm")
        assert key not in _host_shm_keys()  # made, but not in the host's namespace
    finally:
        first.close()
        second.close()
    assert record.statuses == (MatchStatus.OK, MatchStatus.OK), record.faults
    for tail in record.stderr_tails:
        assert f"SHM MADE {key:#x}" in tail and "SHM FOUND" not in tail, tail
        assert "HOST ludus-agent" in tail, tail  # its own UTS namespace
    # a later agent (possibly given the same uid) finds nothing either
    record, _, _ = play_clean("shm_segment", honest, config)
    assert "SHM MADE" in record.stderr_tails[0] and "SHM FOUND" not in record.stderr_tails[0]
    assert key not in _host_shm_keys()


def test_the_kernel_keyring_is_no_channel_between_agents(honest):
    """tests/hostile_agents/keyring adds a world-readable key to its uid's keyring and reads anyone
    else's (the keyring is not namespaced): two of them in one match cannot make or find a key, a
    later agent (possibly given the same uid) finds nothing, and their uids own no key afterwards."""
    from ludus.arena.sandbox.isolation import uid_key_count

    first = SandboxedAgent(unchecked("keyring"), GAME, BOX)
    second = SandboxedAgent(unchecked("keyring"), GAME, BOX)
    uids = (first.uid, second.uid)
    try:
        record = play_match(GAME, [first, second], seed=5, limits=LIMITS, match_id="zoo-keyring")
    finally:
        first.close()
        second.close()
    assert record.statuses == (MatchStatus.OK, MatchStatus.OK), record.faults
    for tail in record.stderr_tails:
        assert "KEY DENIED EPERM" in tail and "KEY MADE" not in tail and "KEY FOUND" not in tail, tail
    record, _, agent = play_clean("keyring", honest)
    assert "KEY DENIED" in record.stderr_tails[0] and "KEY FOUND" not in record.stderr_tails[0]
    assert [uid_key_count(uid) for uid in (*uids, agent.uid)] == [0, 0, 0]


def test_keys_an_agent_uid_left_are_removed_before_it_is_leased_again():
    """Should a key get past the filter (or an agent ran unsandboxed under the uid), the uid's keys
    are cleared when its agent ends: made here by a process of that uid, then removed."""
    from ludus.arena.sandbox.isolation import clear_uid_keys, uid_key_count

    uid = 60990  # above the arena's agent uids, below nobody's
    add_key = {"x86_64": 248, "aarch64": 217, "riscv64": 217}[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.fork()  # a child of the uid (/root may be closed to it: no new interpreter)
    if pid == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        made = libc.syscall(ctypes.c_long(add_key), b"user", b"left-behind", b"x", ctypes.c_size_t(1),
                            ctypes.c_long(-4))
        os._exit(0 if made > 0 else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert uid_key_count(uid) >= 1  # the channel exists on this kernel: keys outlive their process
    assert clear_uid_keys(uid) == 0 and uid_key_count(uid) == 0


def test_shared_memory_hog_is_stopped_at_the_memory_cap(honest):
    """tests/hostile_agents/shm_hog touches a 3 GiB shared anonymous mapping page by page: the cap
    counts shared memory (and a memory cgroup enforces it in the kernel where the machine allows):
    it forfeits before holding the 3 GiB, and the honest agent is untouched."""
    record, _, _ = play_hostile("shm_hog", honest, hostile_seat=0)
    fault = record.faults[0]
    assert record.statuses[0] == MatchStatus.ERROR, record.faults
    assert re.search(r"MiB limit|memory limit", fault.reason), fault.reason
    assert "holds all 3 GiB" not in record.stderr_tails[0]
    assert record.faults[1] is None and honest.running


def test_memory_cgroup_stops_the_hog_without_the_poll(honest):
    """The kernel's cap alone (the /proc poll switched off): the memory cgroup charges the shared
    pages and kills the hog at the limit, and the fault says so."""
    from ludus.arena.sandbox import cgroups

    if not cgroups.support().memory_ok:
        message = f"no memory cgroup here: {cgroups.support().memory}"
        if os.environ.get("LUDUS_CI") == "1":
            pytest.fail(message)
        pytest.skip(message)
    box = dataclasses.replace(BOX, rss_poll_interval_s=1e6)
    agent = SandboxedAgent(unchecked("shm_hog"), GAME, box)
    try:
        record = play_match(GAME, [agent, honest], seed=3, limits=MatchLimits(time_per_move_s=30, overage_s=1),
                            match_id="zoo-shm-hog-kernel")
    finally:
        agent.close()
    assert "killed by the kernel at its memory limit" in record.faults[0].reason, record.faults[0]
    assert "holds all 3 GiB" not in record.stderr_tails[0]
    assert record.faults[1] is None and honest.running


def test_cpu_hog_does_not_steal_move_time_from_another_match():
    """tests/hostile_agents/cpu_hog leaves 16 children spinning while a different match runs between a
    CPU-bound honest agent (tests/agents/thinker: 0.15 s of CPU a move, 0.5 s allowed) and a random
    one. The hog's CPU quota (one core, a cgroup) leaves the thinker its time: it never times out."""
    from ludus.arena.sandbox import cgroups

    if not cgroups.support().cpu_ok:
        message = f"no cpu cgroup here: {cgroups.support().cpu}"
        if os.environ.get("LUDUS_CI") == "1":
            pytest.fail(message)
        pytest.skip(message)
    thinker_folder = REPO / "tests" / "agents" / "thinker"
    thinker = SandboxedAgent(validate_submission(thinker_folder, GAME), GAME, BOX)
    hog = SandboxedAgent(unchecked("cpu_hog"), GAME, BOX)
    rival = SandboxedAgent(validate_submission(EXAMPLES / "random_python", GAME), GAME, BOX)
    try:
        record = play_match(GAME, [hog, rival], seed=1, limits=LIMITS, match_id="zoo-cpu-hog")
        assert "16 children spinning" in record.stderr_tails[0] and hog.running
        time.sleep(0.5)  # let the spinners take what they can
        for seed in range(3):
            seats = [thinker, rival] if seed % 2 == 0 else [rival, thinker]
            played = play_match(GAME, seats, seed=seed, limits=LIMITS, match_id=f"thinker-{seed}")
            assert played.statuses == (MatchStatus.OK, MatchStatus.OK), played.faults
        assert hog.running  # it was contained, not killed
    finally:
        for agent in (hog, thinker, rival):
            agent.close()


def test_staller_is_declared_dead_within_its_budgets(honest):
    """tests/hostile_agents/staller starts slowly, plays one clean match, then times out, over and
    over. Clean matches do not refill its fault budget and its slow starts are charged against a
    start-up budget: it is dead long before the tournament's end, and the tournament's delay is
    bounded by the budgets, not by the number of matches."""
    box = dataclasses.replace(BOX, startup_timeout_s=3.0, startup_budget_s=4.0, max_faults=6)
    config = SandboxConfig(extra_env=(("LUDUS_STALL_S", "1.2"),))
    began = time.monotonic()
    statuses = []
    with SandboxedAgent(unchecked("staller"), GAME, box, config) as agent:
        for seed in range(12):
            record = play_match(GAME, [agent, honest], seed=seed, limits=LIMITS)
            statuses.append(record.statuses[0])
            assert record.faults[1] is None
        assert agent.dead and "spent starting" in agent.why_dead, agent.why_dead
        assert agent.consecutive_faults < box.max_consecutive_faults  # the old rule alone never fired
        assert agent.starts <= 4
    # every start waited 1.2 s (at most 4 s in all), every timeout cost one move limit plus overage
    assert time.monotonic() - began < box.startup_budget_s + 12 * (LIMITS.time_per_move_s + LIMITS.overage_s) + 5
    assert MatchStatus.OK in statuses and statuses[-1] == MatchStatus.ERROR


def test_fault_budget_is_not_refilled_by_clean_matches(honest):
    """The same pattern with fast starts: the per-tournament fault budget ends it."""
    box = dataclasses.replace(BOX, max_faults=3)
    config = SandboxConfig(extra_env=(("LUDUS_STALL_S", "0"),))
    with SandboxedAgent(unchecked("staller"), GAME, box, config) as agent:
        for seed in range(10):
            play_match(GAME, [agent, honest], seed=seed, limits=LIMITS)
        assert agent.dead and "3 faulty matches (budget 3" in agent.why_dead, agent.why_dead
        assert agent.starts == 3


def test_scratch_left_by_a_killed_arena_is_cleaned_at_the_next_start(tmp_path):
    """An arena killed with -9 leaves its agents' scratch copies behind; the next sandbox started
    in the same workspace removes them (their locks are free), and leaves a live one alone."""
    require_isolation()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from ludus.arena.sandbox.isolation import SandboxConfig
from ludus.arena.match import MatchLimits, SandboxedAgent
from ludus.arena.submission import validate_submission
agent = SandboxedAgent(validate_submission(Path({str(EXAMPLES / 'random_python')!r}), 'tic_tac_toe'), 'tic_tac_toe',
                       config=SandboxConfig(workspace_root=Path({str(workspace)!r})))
assert agent.begin_match('m', 0, 0, MatchLimits()) is None
print('started', flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL and "started" in proc.stdout, proc.stderr
    left = list(workspace.glob("ludus-agent-*"))
    assert len(left) == 1
    from ludus.arena.sandbox import isolation

    isolation._CLEANED_ROOTS.discard(os.path.realpath(workspace))
    config = SandboxConfig(workspace_root=workspace)
    with SandboxedAgent(validate_submission(EXAMPLES / "random_python", GAME), GAME, BOX, config) as live:
        assert not left[0].exists()
        mine = list(workspace.glob("ludus-agent-*"))
        assert len(mine) == 1
        isolation._CLEANED_ROOTS.discard(os.path.realpath(workspace))
        isolation.clean_stale_scratch(workspace)  # a live sandbox's directory is not stale
        assert mine[0].exists() and live.agent_dir.exists()


def test_a_late_second_answer_faults_the_match_it_follows(honest):
    """A second answer 10 ms after the last move of a match is a fault of that match (the arena
    listens `settle_s` before it sends `end`), not of the agent's next match."""
    agent = SandboxedAgent(unchecked("late_second_answer"), GAME, BOX, SandboxConfig())
    try:
        assert agent.begin_match("late", 0, 5, LIMITS) is None
        mask = np.ones(9, dtype=bool)
        outcome = agent.request_action("late", np.zeros((3, 3, 3), np.float32), mask, 0.5)
        assert outcome.fault is None and outcome.action == 0
        # as if this move were the match's last: the stray line arrives inside the window
        fault = agent.check_quiet(time.monotonic() + BOX.settle_s)
        assert fault is not None and fault.status == MatchStatus.INVALID
        assert "nobody asked for after its last move" in fault.reason
        agent.end_match("late", (-1.0, 1.0), 0)
        # a whole match against the honest agent: the fault is in this match, whatever move it follows
        record = play_match(GAME, [agent, honest], seed=3, limits=LIMITS, match_id="late-2")
        assert record.statuses == (MatchStatus.INVALID, MatchStatus.OK), record.faults
    finally:
        agent.close()


def test_stderr_written_while_handling_end_stays_with_its_match(honest, tmp_path):
    agent = SandboxedAgent(unchecked("stderr_at_end"), GAME, BOX, SandboxConfig(stderr_dir=tmp_path))
    try:
        first = play_match(GAME, [agent, honest], seed=1, limits=LIMITS, match_id="m-1")
        second = play_match(GAME, [honest, agent], seed=2, limits=LIMITS, match_id="m-2")
    finally:
        agent.close()
    assert first.statuses == second.statuses == (MatchStatus.OK, MatchStatus.OK)
    assert first.stderr_tails[0] == "END m-1\n"
    assert second.stderr_tails[1] == "END m-2\n"
    assert (tmp_path / "m-1.seat0.stderr").read_text() == "END m-1\n"
