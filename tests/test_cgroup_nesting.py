"""Agent control groups nest under the arena's own (arena/sandbox/cgroups.py), so an operator's limit on
the arena covers its agents: the decision on fake v2 hierarchies, and containment on this host."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ludus.arena.sandbox import cgroups

REPO = Path(__file__).resolve().parent.parent


def test_own_groups_reads_both_versions():
    text = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/user.slice/arena.scope\n"
    assert cgroups.own_groups(text) == {"name=systemd": "/", "memory": "/process_api/abc", "cpu": "/",
                                        "cpuacct": "/", "unified": "/user.slice/arena.scope"}


def _fake_v2(root: Path, group: str, pids: list[int]) -> Path:
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    directory = root / group.lstrip("/")
    directory.mkdir(parents=True)
    (directory / "cgroup.controllers").write_text("cpu memory pids\n")
    (directory / "cgroup.subtree_control").write_text("")
    (directory / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return directory


def test_v2_group_holding_only_the_arena_is_delegated(tmp_path):
    """The arena moves into a leaf of its own and hands memory and cpu to its group's children."""
    group = _fake_v2(tmp_path, "/system.slice/arena.service", [os.getpid()])
    base, why = cgroups._v2_base(tmp_path, "/system.slice/arena.service")
    assert (base, why) == (group, None)
    assert (group / "ludus-arena" / "cgroup.procs").read_text() == str(os.getpid())
    assert (group / "cgroup.subtree_control").read_text() == "+memory +cpu"
    (group / "cgroup.subtree_control").write_text("cpu memory\n")  # what the kernel then shows
    # a second arena started from inside that leaf nests beside it, under the same group
    assert cgroups._v2_base(tmp_path, "/system.slice/arena.service/ludus-arena") == (group, None)


def test_v2_group_shared_with_other_processes_is_not_touched(tmp_path):
    """cgroup v2's no-internal-process rule: a group with other processes cannot delegate; the
    arena says so and leaves it as it is (groups go under the root, as before)."""
    group = _fake_v2(tmp_path, "/user.slice/session-1.scope", [os.getpid(), 1])
    base, why = cgroups._v2_base(tmp_path, "/user.slice/session-1.scope")
    assert base == tmp_path and "holds 1 other process" in why and "Delegate=yes" in why
    assert (group / "cgroup.subtree_control").read_text() == "" and not (group / "ludus-arena").exists()


def test_v2_root_and_already_delegated_groups(tmp_path):
    group = _fake_v2(tmp_path, "/arena", [])
    assert cgroups._v2_base(tmp_path, "/") == (tmp_path, None)
    (group / "cgroup.subtree_control").write_text("cpu memory\n")
    assert cgroups._v2_base(tmp_path, "/arena") == (group, None)


def _memory_support() -> cgroups.CgroupSupport:
    have = cgroups.support()
    if not (have.memory_ok and have.nested):
        message = f"agent memory groups cannot nest here: {have.memory or have.nesting}"
        if os.environ.get("LUDUS_CI") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return have


def test_agent_groups_are_made_under_the_arenas_own_group():
    _memory_support()
    layout = cgroups._layout()
    group = cgroups.AgentCgroup("nesting-test", 64 << 20, 0.5)
    try:
        assert group.memory_dir is not None and group.memory_dir.parent.parent == layout.memory_base
        own = cgroups.own_groups().get("memory" if layout.version == "v1" else "unified", "/")
        assert str(group.memory_dir).startswith(str(layout.memory_dir / own.lstrip("/")))
    finally:
        group.remove()
    assert not group.memory_dir.exists()


_ARENA_IN_A_LIMITED_GROUP = textwrap.dedent("""
    import sys
    from pathlib import Path
    Path(sys.argv[1], "cgroup.procs").write_text(str(__import__("os").getpid()))  # the operator's limit
    sys.path.insert(0, sys.argv[2])
    from ludus.arena.match import MatchLimits, SandboxedAgent, play_match
    from ludus.arena.sandbox.limits import SandboxLimits
    from ludus.arena.submission import Submission, SubmissionKind, validate_submission
    zoo = Path(sys.argv[2], "tests", "hostile_agents", "shm_hog")
    hog = Submission(SubmissionKind.PYTHON_FOLDER, "shm_hog", "1", None, zoo, "unchecked", entry_point="agent:act")
    honest = validate_submission(Path(sys.argv[2], "examples", "agents", "random_python"), "tic_tac_toe")
    # the agent's own cap (2 GiB) and the /proc poll would let it reach 2 GiB: only the arena's limit stops it
    box = SandboxLimits(startup_timeout_s=30, rss_mb=2048, data_mb=1024, rss_poll_interval_s=1e6)
    with SandboxedAgent(hog, "tic_tac_toe", box) as a, SandboxedAgent(honest, "tic_tac_toe", box) as b:
        record = play_match("tic_tac_toe", [a, b], seed=0, limits=MatchLimits(time_per_move_s=60, overage_s=1))
    print("STATUS", record.statuses[0].name)
    print("TAIL", record.stderr_tails[0].replace(chr(10), " | "))
""")


def test_a_limit_on_the_arena_covers_its_agents():
    """An operator caps the arena's group at 768 MiB; the shared-memory hog, allowed 2 GiB by its
    own group, is stopped by the arena's cap (the kernel charges the nested group to its parents)."""
    have = _memory_support()
    if cgroups._layout().version != "v1":
        pytest.skip("the operator's group is made here with v1 files; v2 hosts run the unit tests above")
    base = cgroups._layout().memory_base
    operator = base / f"operator-limit-{os.getpid()}"
    operator.mkdir()
    try:
        (operator / "memory.limit_in_bytes").write_text(str(768 << 20))
        if (operator / "memory.memsw.limit_in_bytes").exists():
            (operator / "memory.memsw.limit_in_bytes").write_text(str(768 << 20))
        done = subprocess.run([sys.executable, "-c", _ARENA_IN_A_LIMITED_GROUP, str(operator), str(REPO)],
                              capture_output=True, text=True, timeout=240)
        assert "STATUS ERROR" in done.stdout, (done.stdout, done.stderr[-2000:])
        # stopped by the arena's 768 MiB, far below the 2 GiB its own group allows
        assert "holding 512 MiB" in done.stdout and "holding 768 MiB" not in done.stdout, done.stdout
        assert int((operator / "memory.max_usage_in_bytes").read_text()) <= 768 << 20
    finally:
        for pid in (operator / "cgroup.procs").read_text().split():
            Path(base, "cgroup.procs").write_text(pid)
        for child in sorted(operator.rglob("*/"), key=lambda p: -len(p.parts)):
            if child.is_dir():
                child.rmdir()
        operator.rmdir()
    assert have.nested
