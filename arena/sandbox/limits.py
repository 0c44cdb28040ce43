"""The resource limits of one agent process tree: a record that the isolation (its rlimits), the
process (its resource watch) and the match loop read. The overview is in arena/sandbox/process.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one agent process tree (the time per move is in `MatchLimits`)."""

    startup_timeout_s: float = 30.0
    """Wall-clock seconds from launch to the agent's ``ready`` (importing torch takes ~2 s)."""
    cpu_time_s: int = 3600
    """RLIMIT_CPU of the agent process over its life (one tournament)."""
    data_mb: int = 4096
    """RLIMIT_DATA per process; generous so an honest agent can import torch."""
    rss_mb: int = 2048
    """Cap on the summed anonymous RSS of the agent's processes, polled from /proc while waiting."""
    rss_poll_interval_s: float = 0.05
    """How often that sum is taken while the arena waits on the agent."""
    max_processes: int = 64
    """RLIMIT_NPROC for the agent's uid (threads count); bounds fork bombs."""
    max_open_files: int = 256
    """RLIMIT_NOFILE."""
    max_file_mb: int = 64
    """RLIMIT_FSIZE: the largest file the agent may write."""
    tmpfs_mb: int = 64
    """Size of each private tmpfs (/tmp, /var/tmp, /dev/shm, the home directory)."""
    stderr_tail_bytes: int = 16 * 1024
    """The last bytes of stderr kept per match (in records and in the per-match stderr file)."""
    max_consecutive_faults: int = 3
    """Faulty matches in a row after which the agent is dead for the rest of the tournament."""
    max_faults: int = 6
    """Faulty matches in all after which the agent is dead for the rest of the tournament: a budget
    that clean matches never refill, so alternating a fault with a clean match cannot go on forever."""
    startup_budget_s: float = 60.0
    """Wall-clock seconds the agent may spend starting, summed over all its (re)starts in one
    tournament; past it the agent is dead, so slow starts cannot stretch a tournament without end."""
    cpu_cores: float = 1.0
    """CPU quota of the agent's whole process tree, in cores (a cgroup where the machine allows it,
    `ludus arena doctor`): spinning children cannot take more, so agents in parallel matches keep
    their move time. 0: no quota."""
    max_submission_mb: int = 2048
    """Largest submission copied into a sandbox."""
    shutdown_grace_s: float = 1.0
    """Seconds an agent gets to exit after ``shutdown`` before it is killed."""
    settle_s: float = 0.05
    """Seconds the arena listens after the agent's last answer of a match (a stray or second answer
    is a fault of that match) and after ``end`` (stderr written while handling it is kept with that
    match). Later output counts toward the next match. 0 checks only what has already arrived."""
