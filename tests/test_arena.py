"""The arena: submissions, fair schedules, tournaments in the ledger, leaderboard, replays, CLI.

The acceptance test (`test_tournament_survives_the_hostile_zoo`) runs a round-robin on
tic-tac-toe between the two honest example agents (Python and POSIX shell) and the whole zoo of
tests/hostile_agents/, and checks that the tournament completes, every hostile agent's fault is
in the ledger with the right status, the honest agents' results are intact, the arena's database
changed only through the arena, and no agent process is left. Under LUDUS_CI=1 a machine
without namespace isolation fails the tests that need it instead of skipping them.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import stat
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from ludus.arena.api import Arena, ArenaConfig
from ludus.arena.sandbox.isolation import Isolation, SandboxConfig, resolve_isolation, stray_agent_processes
from ludus.arena.leaderboard import format_leaderboard
from ludus.arena.match import MatchLimits
from ludus.arena.replay import replay_match
from ludus.arena.sandbox.limits import SandboxLimits
from ludus.arena.store import ArenaError, submission_digest_of_copy
from ludus.arena.submission import Submission, SubmissionError, SubmissionKind
from ludus.arena.tournament import TournamentSettings, circle_rounds, round_robin_schedule, summarize
from ludus.league.records.ledger import Store
from ludus.league.records.ratings import load_params, rebuild_ratings
from ludus.cli import main

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "tests" / "hostile_agents"
EXAMPLES = REPO / "examples" / "agents"
GAME = "tic_tac_toe"
# Honest agents answer in about a millisecond; 1 s per move (+0.5 s bank) leaves a loaded machine
# (load ~10 on 2 cores) plenty of room while keeping each timeout of the zoo short.
LIMITS = MatchLimits(time_per_move_s=1.0, overage_s=0.5)
BOX = SandboxLimits(startup_timeout_s=30, rss_mb=256, data_mb=1024, max_processes=32, cpu_time_s=60)


def require_isolation() -> Isolation:
    mode = resolve_isolation(SandboxConfig())
    if mode == Isolation.NONE:
        message = "no namespace isolation here: run as root or enable user namespaces"
        if os.environ.get("LUDUS_CI") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return mode


def config(**changes) -> ArenaConfig:
    return ArenaConfig(**{"match_limits": LIMITS, "sandbox_limits": BOX, **changes})


def tree_state(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under `root` with its mode and (files) bytes: what "nothing changed" compares."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = os.lstat(path)
            state[str(path.relative_to(root))] = (st.st_mode, path.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return state


def unchecked(folder: Path) -> Submission:
    """A zoo submission built without `validate_submission`, as if it had slipped past it."""
    manifest = tomllib.loads((folder / "agent.toml").read_text())
    kind = SubmissionKind.EXECUTABLE if "executable" in manifest else SubmissionKind.PYTHON_FOLDER
    return Submission(kind, manifest["name"], manifest["version"], None, folder.resolve(),
                      submission_digest_of_copy(kind, folder.resolve(), 1 << 30),
                      entry_point=manifest.get("entry_point"), executable=manifest.get("executable"))


# ------------------------------------------------------------------------------------ scheduling


@pytest.mark.parametrize("n", [2, 5, 8])
def test_circle_rounds_pair_everyone_once(n):
    players = [f"p{i}" for i in range(n)]
    rounds = circle_rounds(players)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    for pairs in rounds:  # nobody plays twice in a round
        seen = [p for pair in pairs for p in pair]
        assert len(seen) == len(set(seen))
    met = sorted(tuple(sorted(pair)) for pairs in rounds for pair in pairs)
    assert met == sorted(itertools.combinations(players, 2))


def test_round_robin_uses_common_seeds_and_both_seat_orders():
    players = ["a", "b", "c", "d"]
    schedule = round_robin_schedule(players, games_per_pair=4, seed=3, first_match_id=100)
    pairings = [p for batch in schedule for p in batch]
    assert [p.match_id for p in pairings] == list(range(100, 100 + 6 * 4))
    seeds = sorted({p.seed for p in pairings})
    assert len(seeds) == 2  # games_per_pair / 2 seeds, shared by every pair
    for a, b in itertools.combinations(players, 2):
        games = [p for p in pairings if set(p.players) == {a, b}]
        assert len(games) == 4
        for s in seeds:  # each seed once in each seat order
            assert sorted(p.players for p in games if p.seed == s) == sorted([(a, b), (b, a)])
    assert round_robin_schedule(players, 4, 3, 100) == schedule  # deterministic
    assert {p.seed for p in pairings}.isdisjoint({p.seed for b in round_robin_schedule(players, 4, 4, 0) for p in b})


@pytest.mark.parametrize("changes, message", [
    ({"games_per_pair": 3}, "even number"),
    ({"games_per_pair": 0}, "even number"),
    ({"format": "swiss"}, "unknown tournament format"),
    ({"seed": -1}, "seed"),
])
def test_tournament_settings_refuse_bad_values(changes, message):
    with pytest.raises(ArenaError, match=message):
        TournamentSettings(**{"game": GAME, "format": "round-robin", **changes})


# ------------------------------------------------------------------------------------ submitting


@pytest.fixture(scope="module")
def small_arena(tmp_path_factory):
    """An arena with one honest submission and one bot, used by the refusal tests (never changed)."""
    require_isolation()
    directory = tmp_path_factory.mktemp("small") / "arena"
    arena = Arena.open(directory, GAME, config())
    arena.submit(EXAMPLES / "random_python")
    arena.submit("bot:perfect")
    return arena


def _snapshot(tmp_path: Path, corrupt: bool) -> Path:
    import torch

    from ludus.agents.nets import ActorCritic, NetConfig
    from ludus.agents.snapshot import save_snapshot
    from ludus.games import registry

    spec = registry.spec(GAME)
    torch.manual_seed(0)
    net_config = NetConfig(hidden=(8,))
    ref = save_snapshot(ActorCritic(spec, net_config), spec, net_config, tmp_path / "snap")
    if corrupt:
        weights = ref.path / "weights.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
    return ref.path


def _folder(tmp_path: Path, manifest: str, files: dict[str, str]) -> Path:
    root = tmp_path / "sub"
    root.mkdir()
    (root / "agent.toml").write_text(manifest)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def _no_manifest(tmp_path: Path) -> Path:
    root = tmp_path / "sub"
    root.mkdir()
    (root / "agent.py").write_text("def act(observation, legal_actions):\n    return legal_actions[0]\n")
    return root


FIRST_LEGAL = "def act(observation, legal_actions):\n    return legal_actions[0]\n"
REFUSALS = {
    "missing manifest": (_no_manifest, SubmissionError, "has no agent.toml"),
    "wrong game": (lambda tmp: _folder(tmp, 'name = "c4"\nversion = "1"\ngame = "connect_four"\n'
                                            'entry_point = "agent:act"\n', {"agent.py": FIRST_LEGAL}),
                   SubmissionError, "plays 'connect_four', not 'tic_tac_toe'"),
    "unknown entry point": (lambda tmp: _folder(tmp, 'name = "x"\nversion = "1"\ngame = "*"\n'
                                                     'entry_point = "nowhere:Agent"\n', {"agent.py": ""}),
                            SubmissionError, "unknown entry point"),
    "unreadable checkpoint": (lambda tmp: _snapshot(tmp, corrupt=True), SubmissionError, "unreadable snapshot"),
    "crash at import": (lambda tmp: ZOO / "crash_at_import", SubmissionError, "hostile crash at import"),
    "unknown bot": (lambda tmp: "bot:alphazero", SubmissionError, "no submission at 'alphazero'"),
    "name taken": (lambda tmp: EXAMPLES / "random_sh", ArenaError, "already in the arena"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_submission_changes_nothing(case, small_arena, tmp_path):
    make, error, message = REFUSALS[case]
    path = make(tmp_path)
    before = tree_state(small_arena.directory)
    name = "random-python" if case == "name taken" else None
    with pytest.raises(error, match=message) as info:
        small_arena.submit(path, name=name)
    assert "\n" not in str(info.value)
    assert tree_state(small_arena.directory) == before
    assert [e.player_id for e in small_arena.list()] == ["random-python", "perfect"]


def test_cli_refusal_is_one_line_and_exit_2(small_arena, capsys):
    before = tree_state(small_arena.directory)
    code = main(["arena", "submit", str(ZOO / "crash_at_import"), "--arena", str(small_arena.directory)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "hostile crash at import" in err
    assert tree_state(small_arena.directory) == before


def test_a_new_arena_needs_a_game(tmp_path):
    require_isolation()
    arena = Arena.open(tmp_path / "fresh", None, config())
    with pytest.raises(ArenaError, match="pass --game"):
        arena.submit(EXAMPLES / "random_sh")  # it plays any game
    assert not (tmp_path / "fresh").exists()
    with pytest.raises(ArenaError, match="two sides .* has 3 sides"):
        Arena.open(tmp_path / "fresh", "spiel:kuhn_poker(players=3)", config())
    # a manifest that names its game founds the arena on it
    root = _folder(tmp_path, 'name = "first"\nversion = "1"\ngame = "tic_tac_toe"\nentry_point = "agent:act"\n',
                   {"agent.py": "def act(observation, legal_actions):\n    return legal_actions[0]\n"})
    entrant = arena.submit(root)
    assert arena.game == GAME and entrant.declared_game == GAME
    with pytest.raises(ArenaError, match="plays 'tic_tac_toe', not 'connect_four'"):
        Arena.open(tmp_path / "fresh", "connect_four")


def test_submissions_are_immutable_content_addressed_copies(tmp_path):
    require_isolation()
    source = tmp_path / "mine"
    source.mkdir()
    for name in ("agent.py", "agent.toml"):
        (source / name).write_bytes((EXAMPLES / "random_python" / name).read_bytes())
    arena = Arena.open(tmp_path / "arena", GAME, config())
    entrant = arena.submit(source)
    assert arena.submit(source) == entrant  # the same content again: nothing new
    copy = arena.directory / entrant.copy_path
    assert copy.name == entrant.digest and copy.parent == arena.directory / "submissions"
    assert stat.S_IMODE(os.stat(arena.directory).st_mode) == 0o700
    assert all(not os.stat(p).st_mode & 0o222 for p in [copy, *copy.iterdir()])
    with open(source / "agent.py", "a") as f:  # the original changes; the arena's copy does not
        f.write("# version 2\n")
    assert submission_digest_of_copy(SubmissionKind.PYTHON_FOLDER, copy, 1 << 30) == entrant.digest
    with pytest.raises(ArenaError, match="already in the arena"):
        arena.submit(source)  # new content under a taken name
    second = arena.submit(source, name="mine-v2")
    assert second.digest != entrant.digest
    arena.submit("bot:random")
    # tampering with a stored copy is caught before any tournament runs it
    target = copy / "agent.py"
    os.chmod(target, 0o644)
    target.write_text(target.read_text() + "\n# tampered\n")
    with pytest.raises(ArenaError, match="was modified"):
        arena.run_tournament(seed=0)
    with Store.open(arena.directory, mode="read") as store:
        assert store.count_matches() == 0


def test_snapshot_copies_are_checked_by_their_snapshot_id(tmp_path):
    from ludus.agents.snapshot import verify_snapshot

    snapshot = _snapshot(tmp_path, corrupt=False)
    found = submission_digest_of_copy(SubmissionKind.SNAPSHOT, snapshot, 1 << 30)
    assert found == verify_snapshot(snapshot).snapshot_id
    weights = snapshot / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ArenaError, match="is damaged"):
        submission_digest_of_copy(SubmissionKind.SNAPSHOT, snapshot, 1 << 30)


def test_a_run_snapshot_is_named_after_its_run_and_a_twin_is_warned_about(tmp_path, capsys):
    require_isolation()
    run = tmp_path / "my-run"
    (run / "snapshots").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    snapshot = _snapshot(tmp_path, corrupt=False)
    snapshot.rename(run / "snapshots" / "main@3")
    arena_dir = tmp_path / "arena"
    assert main(["arena", "submit", str(run / "snapshots" / "main@3"), "--game", GAME, "--arena", str(arena_dir)]) == 0
    assert "entered my-run/main@3 (submission, snapshot" in capsys.readouterr().out
    assert main(["arena", "submit", str(run / "snapshots" / "main@3"), "--name", "twin", "--arena", str(arena_dir)]) == 0
    assert "warning: twin has the same content as my-run/main@3" in capsys.readouterr().out
    assert main(["arena", "withdraw", "twin", "--arena", str(arena_dir)]) == 0
    board = Arena.open(arena_dir).leaderboard()
    assert [r.player_id for r in board.rows] == ["my-run/main@3"]


# ------------------------------------------------------------------------------ small tournaments


def test_cli_end_to_end(tmp_path, capsys, monkeypatch):
    require_isolation()
    monkeypatch.setenv("LUDUS_ARENA", str(tmp_path / "state"))
    assert main(["arena", "submit", str(EXAMPLES / "random_python"), "--game", GAME]) == 0
    assert main(["arena", "submit", str(EXAMPLES / "random_sh"), "--name", "shell"]) == 0
    assert main(["arena", "submit", "bot:perfect"]) == 0
    out = capsys.readouterr().out
    assert "entered random-python" in out and "entered shell" in out and "entered perfect" in out
    assert main(["arena", "list"]) == 0
    assert re.search(r"3 entrants.*random-python.*shell.*perfect", capsys.readouterr().out, re.S)
    assert main(["arena", "run", "--game", GAME, "--games-per-pair", "2", "--seed", "5",
                 "--time-per-move", "1", "--overage", "1"]) == 0
    out = capsys.readouterr().out
    assert "tournament 1: round-robin on tic_tac_toe, seed 5, 6 matches (0 forfeited)" in out
    page = tmp_path / "site" / "board.html"
    assert main(["arena", "leaderboard", "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "rank  entrant" in out and "head-to-head" in out and "95% interval" in out
    assert out.index("perfect") < out.index("random-python")  # perfect play never loses: it ranks first
    assert len(list((tmp_path / "site" / "board_replays").glob("match-*.txt"))) == 6
    assert main(["arena", "replay", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("match 0 (arena, tournament 1, round-robin): tic_tac_toe, seed ")
    assert "replay check: the moves reproduce the recorded returns" in out
    assert main(["arena", "replay", "99"]) == 2
    assert "match 99 is not in the arena" in capsys.readouterr().err
    assert main(["arena", "run", "--game", "connect_four"]) == 2
    assert "plays 'tic_tac_toe', not 'connect_four'" in capsys.readouterr().err


def test_ladder_schedules_by_uncertainty_and_stops(tmp_path):
    require_isolation()
    arena = Arena.open(tmp_path / "arena", GAME, config())
    for bot in ("bot:random", "bot:perfect", "bot:mcts-20"):
        arena.submit(bot)
    arena.submit(EXAMPLES / "random_sh")
    report = arena.run_tournament(format="ladder", seed=1, max_games=24, sigma_threshold=0.5)
    assert report.stopped_because == "game budget spent" and len(report.matches) == 24
    matches = report.matches
    for first, second in zip(matches[::2], matches[1::2]):  # each pairing: one seed, both seat orders
        assert second.players == first.players[::-1]
        assert arena.match(first.match_id).seed == arena.match(second.match_id).seed
    # ratings were updated between rounds: the ledger's history has every game, and rebuilding
    # the ratings from the ledger gives the table the tournament ended with
    with Store.open(arena.directory, mode="read") as store:
        rebuilt = rebuild_ratings(store, load_params(store), kinds=("arena",))
        assert len({h.seq for h in store.ratings_history()}) == 24
    for pid, sigma in report.final_sigma.items():
        assert rebuilt.rating(pid).sigma == pytest.approx(sigma, abs=1e-12)
    assert max(report.final_sigma.values()) < 25 / 3
    # a threshold everyone already meets ends the ladder before it plays
    again = arena.run_tournament(format="ladder", seed=2, sigma_threshold=100.0)
    assert again.stopped_because == "sigma converged" and again.matches == () and again.number == 2
    board = arena.leaderboard()
    assert board.rows[0].player_id in ("perfect", "mcts-20") and board.total_matches == 24
    assert [t["number"] for t in board.tournaments] == [1, 2] and board.tournaments[0]["finished"]


# ------------------------------------------------------------------------------------ acceptance

# The first fault each hostile agent must commit (later matches may add "is dead" forfeits).
FAULTS = {
    "crash_at_import": ("error", r"at startup"),
    "crash_mid_game": ("error", r"exited with code 1"),
    "infinite_loop": ("timeout", r"did not answer in time"),
    "sleep_past_limit": ("timeout", r"did not answer in time"),
    # stopped by the RSS poll, or first by RLIMIT_DATA (MemoryError) when the machine is busy
    "memory_bomb": ("error", r"MiB limit|exited with code 1"),
    "illegal_move": ("invalid", r"illegal action"),
    "garbage_output": ("invalid", r"not valid JSON"),
    "megabytes_output": ("invalid", r"longer than 65536 bytes"),
    "closes_stdout": ("error", r"closed its stdout"),
    "answers_twice": ("invalid", r"more than one line"),
}
# Hostile agents that play legal moves while they probe the sandbox: their games are normal.
PROBES = ("write_arena_db", "read_other_submission", "open_socket", "fork_bomb", "daemon", "stderr_flood")
HONEST = ("random-python", "random-sh")


def test_tournament_survives_the_hostile_zoo(tmp_path):
    require_isolation()
    directory = tmp_path / "arena"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    db = directory / "ledger.sqlite"
    probe_env = (("LUDUS_ARENA_DB", str(db)), ("LUDUS_PROBE_PORT", str(listener.getsockname()[1])),
                 ("LUDUS_PROBE_READ", f"{db}:{directory / 'submissions'}"))
    arena = Arena.open(directory, GAME, config(extra_env=probe_env))
    started = time.monotonic()
    arena.submit(EXAMPLES / "random_python")
    arena.submit(EXAMPLES / "random_sh")
    # crash_at_import is refused at submit time (its import runs in a sandbox) ...
    before = tree_state(directory)
    with pytest.raises(SubmissionError, match="hostile crash at import"):
        arena.submit(ZOO / "crash_at_import")
    assert tree_state(directory) == before
    for name in sorted(set(FAULTS) - {"crash_at_import"}) + list(PROBES):
        arena.submit(ZOO / name)
    # ... and entered anyway, unvalidated, as if it had slipped past: the tournament must cope
    arena.enter(unchecked(ZOO / "crash_at_import"))
    submitted = time.monotonic()
    entrants = arena.list()
    assert len(entrants) == 2 + len(FAULTS) + len(PROBES)
    with Store.open(directory, mode="read") as store:
        players_before = store.players()
        meta_before = store.get_meta("arena")
    report = arena.run_tournament(GAME, "round-robin", games_per_pair=2, seed=11)
    finished = time.monotonic()
    print(f"\nzoo tournament: {len(entrants)} entrants, {len(report.matches)} matches, submit "
          f"{submitted - started:.1f} s, tournament {report.duration_s:.1f} s, total {finished - started:.1f} s")

    # it completed: every pair played both seat orders of one shared seed
    n = len(entrants)
    assert len(report.matches) == n * (n - 1) and report.stopped_because == "schedule complete"
    with Store.open(directory, mode="read") as store:
        store.check()
        ledger = [r.result for r in store.iter_matches()]
        assert store.players() == players_before and store.get_meta("arena") == meta_before
        assert {m.seed for m in ledger} == {ledger[0].seed}
        rebuilt = rebuild_ratings(store, load_params(store), kinds=("arena",))
        latest = store.latest_ratings()
    assert [summarize(m) for m in ledger] == list(report.matches)  # the ledger holds what was played
    assert all(m.kind == "arena" and len(m.moves) == m.length for m in ledger)

    def seats_of(player):
        return [(m, s) for m in ledger for s in m.seats if s.player_id == player]

    # each hostile agent's fault is in the ledger with its status; after 3 in a row it is dead
    for name, (status, reason) in FAULTS.items():
        seats = seats_of(name)
        faults = [s for _, s in seats if s.status != "ok"]
        assert faults[0].status == status and re.search(reason, faults[0].error), (name, faults[0])
        assert any("is dead after 3 faulty matches" in s.error for s in faults), name
        # none of them can finish a game: a match it did not forfeit, its opponent forfeited
        for match, seat in seats:
            if seat.status == "ok":
                assert match.seats[1 - seat.seat].status != "ok", (name, match)
    assert "hostile crash at import" in seats_of("crash_at_import")[0][1].metadata["stderr"]
    # the probing agents played normal games, and every probe failed
    for name in PROBES:
        assert all(s.status == "ok" for _, s in seats_of(name)), name
        assert report.entrant(name).process_starts == 1 and not report.entrant(name).dead
    stderr = {name: seats_of(name)[0][1].metadata.get("stderr", "") for name in PROBES}
    writes = re.findall(r"^WRITE (\S+): (\w+)", stderr["write_arena_db"], flags=re.M)
    assert {path for path, _ in writes} >= {str(db)} and {o for _, o in writes} == {"denied"}, stderr
    reads = re.findall(r"^READ (\S+): (\w+)", stderr["read_other_submission"], flags=re.M)
    assert dict(reads) == {str(db): "denied", str(directory / "submissions"): "denied"}, stderr
    sockets = re.findall(r"^SOCKET (.+?): (\w+)", stderr["open_socket"], flags=re.M)
    assert len(sockets) == 3 and {o for _, o in sockets} == {"denied"}, stderr
    forks = int(re.search(r"FORK_BOMB stopped after (\d+) forks", stderr["fork_bomb"]).group(1))
    assert 0 < forks < BOX.max_processes
    assert "DAEMON started" in stderr["daemon"]
    assert len(stderr["stderr_flood"].encode()) <= 4096
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody reached the host's loopback
    listener.close()

    # the honest agents: one process each for the whole tournament, never at fault, results intact
    for name in HONEST:
        assert report.entrant(name).process_starts == 1 and report.entrant(name).faults == {}
        assert all(s.status == "ok" for _, s in seats_of(name))
    for match in ledger:
        replay = replay_match(match)
        assert replay.consistent, replay.transcript
        if set(match.player_ids) == set(HONEST):
            assert match.metadata["forfeit"] is False and replay.replayed_returns is not None
            assert replay.replayed_returns in ((1.0, -1.0), (-1.0, 1.0), (0.0, 0.0))
    for name in HONEST:  # a forfeit by the opponent is a win for the honest agent
        for match, seat in seats_of(name):
            other = match.seats[1 - seat.seat]
            if other.status != "ok":
                assert seat.episode_return == 1.0 and seat.outcome == 1.0

    # ratings: derived from the ledger alone, recorded with every match; honest agents rank
    # above every agent that forfeited all its games
    for pid, record in latest.items():
        assert (rebuilt.rating(pid).mu, rebuilt.rating(pid).sigma) == (record.mu, record.sigma)
    board = arena.leaderboard()
    rank = {row.player_id: row.rank for row in board.rows}
    for name in FAULTS:
        if board.row(name).wins == board.row(name).draws == 0:
            assert rank[name] > max(rank[h] for h in HONEST), format_leaderboard(board)

    # the arena directory holds exactly what the arena wrote; the copies are intact
    files = set(tree_state(directory))
    expected_top = {"ledger.sqlite", "writer.lock", "submissions"}
    assert {f.split("/")[0] for f in files} == expected_top, files
    assert {f.split("/")[1] for f in files if f.startswith("submissions/")} == {e.digest for e in entrants}

    # nothing of any agent is left running
    assert all(e.leftover_pids == () for e in report.entrants)
    assert stray_agent_processes() == {}


def test_escape_codes_from_an_agent_never_reach_a_terminal_or_a_file(tmp_path, capsys):
    """tests/hostile_agents/escape_codes writes terminal control sequences to stderr and forfeits,
    so its stderr tail is shown by `ludus arena replay`, stored in replay files and stderr logs:
    every one of them shows the sequences escaped, none carries a raw control character."""
    require_isolation()
    arena = Arena.open(tmp_path / "arena", GAME, config())
    arena.submit(EXAMPLES / "random_python")
    arena.submit(ZOO / "escape_codes")
    report = arena.run_tournament(format="round-robin", games_per_pair=2, seed=3)
    forfeits = [m for m in report.matches if any(s.status != "ok" for s in arena.match(m.match_id).seats)]
    assert forfeits
    raw = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
    assert main(["arena", "replay", "--arena", str(arena.directory), str(forfeits[0].match_id)]) == 0
    out = capsys.readouterr().out
    assert "\\x1b[2J" in out and "forged line" in out and not raw.search(out)
    files = arena.write_page(tmp_path / "page.html")
    texts = list((tmp_path / files.replay_dir).glob("*.txt")) + [p for p in arena.directory.rglob("*")
                                                     if p.is_file() and p.suffix in (".txt", ".stderr")]
    assert texts
    for path in texts:
        assert not raw.search(path.read_text(errors="replace")), path


def test_parallel_matches_give_the_serial_ledger(tmp_path):
    """Two workers play matches at the same time (their recorded times overlap), and the ledger is
    the one a single worker writes: the same pairings, seeds, moves and returns in the same order."""
    require_isolation()

    def play(workers: int):
        arena = Arena.open(tmp_path / f"arena-{workers}", GAME, config())
        arena.submit(EXAMPLES / "random_python", name="py-a")
        arena.submit(EXAMPLES / "random_python", name="py-b")
        arena.submit(EXAMPLES / "random_sh")
        arena.submit("bot:mcts-10")
        report = arena.run_tournament(format="round-robin", games_per_pair=2, seed=5, workers=workers)
        return [arena.match(m.match_id) for m in report.matches]

    serial, parallel = play(1), play(2)
    assert len(serial) == len(parallel) == 12
    key = lambda m: (m.match_id, m.seed, m.player_ids, tuple(s.episode_return for s in m.seats),
                     m.moves, tuple(s.status for s in m.seats))
    assert [key(m) for m in serial] == [key(m) for m in parallel]
    spans = [(m.started_at, m.started_at + m.duration_s) for m in parallel]
    assert any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(spans) for (b0, b1) in spans[i + 1:])


def test_a_forfeit_in_a_game_without_known_bounds_records_a_finite_loss(tmp_path):
    """PettingZoo's rock-paper-scissors has no recorded bounds (+-inf): a forfeit must still give
    finite returns, a loss for the faulting seat, and the tournament completes."""
    require_isolation()
    game = "pz:pettingzoo.classic.rps_v2"
    arena = Arena.open(tmp_path / "arena", game, config())
    arena.submit(EXAMPLES / "random_python")
    arena.submit(ZOO / "escape_codes")  # answers every move with action -1
    report = arena.run_tournament(format="round-robin", games_per_pair=2, seed=1)
    assert report.stopped_because == "schedule complete" and len(report.matches) == 2
    for summary in report.matches:
        faulted = [s != "ok" for s in summary.statuses]
        assert any(faulted) and all(np.isfinite(summary.returns))
        assert all((r < 0) if f else (r > 0) for r, f in zip(summary.returns, faulted))


@pytest.mark.slow  # ~35-60 s: the sandbox loads the real 135M model
def test_an_lm_snapshot_plays_in_the_arena_on_the_hosts_base(smollm2_dir, tmp_path):
    """A language-model snapshot enters like any snapshot and plays sandboxed, on the base model
    the host converted (shared read-only: the agent names a base id the host ships, and brings
    only its adapters)."""
    require_isolation()
    from ludus.agents.lm.pretrained import PretrainedLMConfig, load_pretrained_lm
    from ludus.agents.lm.snapshots import save_adapter_snapshot
    from ludus.agents.lm.text_policy import TextPlayConfig
    from ludus.games import registry

    lm = load_pretrained_lm(PretrainedLMConfig(), seed=0)
    save_adapter_snapshot(lm, registry.spec("spiel:kuhn_poker"), tmp_path / "lm",
                          play=TextPlayConfig(max_new_tokens=4).to_json())
    del lm
    # a 135M model needs more memory and time than the zoo's limits give a tiny agent
    roomy = config(sandbox_limits=SandboxLimits(startup_timeout_s=60, rss_mb=2048, data_mb=4096, max_processes=32,
                                                cpu_time_s=300),
                   match_limits=MatchLimits(time_per_move_s=5.0, overage_s=10.0))
    arena = Arena.open(tmp_path / "arena", "spiel:kuhn_poker", roomy)
    entrant = arena.submit(tmp_path / "lm", name="lm")
    assert entrant.submission_kind == SubmissionKind.SNAPSHOT
    arena.submit("bot:random")
    report = arena.run_tournament(games_per_pair=4, seed=0, workers=1)
    lm_report = report.entrant("lm")
    assert lm_report.games == 4 and not lm_report.faults and lm_report.process_starts == 1


def test_a_team_submission_plays_every_seat_of_its_side(tmp_path, capsys):
    """2v2 tic-tac-toe: each pairing is two entrants, one per side; an entrant plays both seats of
    its side, each seat its own sandboxed process; the side is rated as one player and the
    leaderboard counts one game per match."""
    require_isolation()
    game = "teams(game=tic_tac_toe)"
    arena = Arena.open(tmp_path / "arena", game, config())
    arena.submit(EXAMPLES / "random_python")
    arena.submit(EXAMPLES / "random_sh")
    arena.submit("bot:random")
    report = arena.run_tournament(format="round-robin", games_per_pair=2, seed=3)
    assert report.stopped_because == "schedule complete" and len(report.matches) == 6
    sides = ((0, 2), (1, 3))
    for summary in report.matches:
        match = arena.match(summary.match_id)
        assert all(s == "ok" for s in summary.statuses)
        for side in sides:  # one entrant per side, the same outcome on its seats
            assert len({match.seats[s].player_id for s in side}) == 1
            assert len({match.seats[s].outcome for s in side}) == 1
            assert {match.seats[s].team for s in side} == {match.seats[side[0]].team}
        assert match.seats[0].player_id != match.seats[1].player_id
    for entrant in report.entrants:
        assert entrant.games == 4 and entrant.wins + entrant.draws + entrant.losses == 4
    sandboxed = report.entrant("random-python")
    assert sandboxed.process_starts == 2  # one process per seat of its side, started once each
    board = arena.leaderboard()
    assert {row.player_id: row.wins + row.draws + row.losses for row in board.rows} == \
        {"random-python": 4, "random-sh": 4, "random": 4}
    h2h = board.head_to_head
    assert sum(h2h.games(i, j) for i in range(3) for j in range(3)) == 12  # each match seen from both sides


def test_the_arena_refuses_games_of_more_than_two_sides(tmp_path):
    with pytest.raises(ArenaError, match="two sides"):
        Arena.open(tmp_path / "arena", "pz:mpe2.simple_spread_v3", config())  # one cooperative side


# ---------------------------------------------------------------------- text from submissions

def test_one_line_and_printable_escape_what_forges_lines_or_reorders_them():
    from ludus.text import one_line, printable, unsafe_character

    text = "a\nb\tc\x1b[2Jd\u202ee\u2028f\u2029g\u2066h\x85i\ud800j"
    assert one_line(text) == "a\\x0ab\\x09c\\x1b[2Jd\\u202ee\\u2028f\\u2029g\\u2066h\\x85i\\ud800j"
    assert printable(text) == "a\nb\tc\\x1b[2Jd\\u202ee\\u2028f\\u2029g\\u2066h\\x85i\\ud800j"  # keeps lines
    assert one_line("plain é ü 漢字 ●") == "plain é ü 漢字 ●" and unsafe_character("plain é") is None
    assert unsafe_character("x\u202ey") == "U+202E RIGHT-TO-LEFT OVERRIDE"


def test_a_stored_field_that_forges_a_row_is_listed_escaped_on_one_row(tmp_path, capsys):
    """An arena stored before submit refused such manifests (the entrant is entered here without
    `validate_submission`): `ludus arena list` still prints one row per entrant, the newline, the
    bidi override and the line separator escaped."""
    version = "1\n  FORGED-ENTRANT  submission python 9.9 \u202eevil\u2028more"
    arena = Arena.open(tmp_path / "arena", GAME, config())
    source = EXAMPLES / "random_sh"
    digest = submission_digest_of_copy(SubmissionKind.EXECUTABLE, source, 1 << 30)
    arena.enter(Submission(SubmissionKind.EXECUTABLE, "random-sh", version, None, source, digest,
                           executable="agent.sh"))
    assert arena.list()[0].version == version  # stored as it came
    assert main(["arena", "list", "--arena", str(arena.directory)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 2 and lines[1].startswith("  random-sh  "), out
    assert "1\\x0a  FORGED-ENTRANT" in lines[1] and "\\u202eevil\\u2028more" in lines[1]
    assert not re.search("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]", out.replace("\n", ""))


# ---------------------------------------------------------------------------- strict actions

LOOSE_KINDS = ("string", "float", "integral_float", "bool")


def _play_loose(tmp_path: Path, zoo_name: str, kind: str):
    """One match of a zoo agent copied with kind.txt = `kind`, in seat 0 (so its first move has
    every cell legal: a coerced answer would be a legal move), against the random bot."""
    import shutil

    from ludus.arena.match import play_match
    from ludus.arena.match import make_player
    from ludus.arena.submission import validate_submission

    folder = tmp_path / zoo_name
    shutil.copytree(ZOO / zoo_name, folder)
    (folder / "kind.txt").write_text(kind + "\n")
    bot = make_player(validate_submission("random", GAME), GAME)
    with make_player(validate_submission(folder, GAME, limits=BOX), GAME, BOX) as agent:
        return play_match(GAME, [agent, bot], seed=3, limits=LIMITS, match_id=f"loose-{kind}")


@pytest.mark.parametrize("kind", LOOSE_KINDS)
def test_a_python_agent_returning_a_non_integer_makes_no_move(tmp_path, kind):
    """agent_host used to send int(value): "4" and 4.7 became 4, True became 1. Now the value goes
    out as it is and the arena records the first move INVALID, as for any malformed action."""
    require_isolation()
    record = _play_loose(tmp_path, "loose_action", kind)
    assert record.statuses[0] == "invalid", record.faults[0]
    assert re.search(r"malformed action: .*action must be an integer", record.faults[0].reason), record.faults[0]
    assert not [m for m in record.moves if m.seat == 0]  # not a single coerced move was played
    assert "an action is an integer" in record.faults[0].stderr_tail  # the host told the author why


def test_a_python_agent_returning_a_numpy_integer_plays_normally(tmp_path):
    require_isolation()
    record = _play_loose(tmp_path, "loose_action", "numpy")
    assert record.statuses == ("ok", "ok") and [m for m in record.moves if m.seat == 0], record.faults


@pytest.mark.parametrize("kind, reason", [("duplicate", "key 'action' appears twice"),
                                          *((k, "action must be an integer") for k in LOOSE_KINDS)])
def test_an_action_line_that_is_not_one_integer_action_is_invalid(tmp_path, kind, reason):
    """The arena's decoder: {"action":99,"action":L} was read as L (json keeps the last key); a
    string, a float (4.7 or 4.0) or true are not actions either."""
    require_isolation()
    record = _play_loose(tmp_path, "loose_action_line", kind)
    assert record.statuses[0] == "invalid" and "malformed action: " in record.faults[0].reason, record.faults[0]
    assert reason in record.faults[0].reason and not [m for m in record.moves if m.seat == 0]


def test_the_host_never_coerces_what_act_returned():
    """`agent_host.action_line` on both sides of the rule, decoded by the arena's own decoder."""
    from ludus.arena import protocol
    from ludus.arena.agent_host import action_line

    class Hostile:
        def __repr__(self):
            raise RuntimeError("no repr")

    for value in (4, np.int64(4), np.uint8(4), np.int32(4)):
        assert protocol.decode_agent_line(action_line(value), 9) == protocol.Action(4)
    for value in ("4", 4.7, 4.0, True, False, np.bool_(True), np.float64(4.0), np.array(4), np.array([4]),
                  None, float("nan"), [4], {"action": 4}, Hostile(), "4" * 100_000, 10**30, -1):
        line = action_line(value)
        assert line.endswith(b"\n") and line.count(b"\n") == 1 and len(line) < 1024, (value, line)
        with pytest.raises(protocol.ProtocolError):
            protocol.decode_agent_line(line, 9)
