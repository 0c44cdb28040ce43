"""Sandboxed agents and the match loop that plays them.

Each submission runs in its own process, started once per tournament and reused for many
matches (`SandboxedAgent`). It talks the JSON-lines protocol of `arena.protocol` over pipes.

Isolation (`Isolation`; `arena.doctor` tells which modes work on a machine):

* ``uid`` (the arena runs as root): the agent runs under its own unprivileged uid/gid
  (``uid_base + k``, leased with a lock file so concurrent arenas never share one) in fresh
  mount, network, PID, IPC and UTS namespaces, set up by ``arena/sandbox_init.py``, inside its
  own memory and cpu control groups (arena/cgroups.py) where the machine has them. The network
  namespace has no interface up, so every socket fails, loopback included. Its filesystem view
  is a minimal root (`mount_plan`): only the runtime, read-only, its own copy of the submission
  (read-only), private size-capped tmpfs on /tmp, /var/tmp, /dev/shm and a tmpfs home (its
  scratch space, mode 0700, owned by its uid).
* ``userns`` (not root, user namespaces allowed): the same namespaces inside a user namespace;
  the agent keeps the invoking user's uid, so file permissions do not separate it from other
  agents or from the arena, but the minimal root above still hides everything else; no cgroups.
* ``none``: a plain child process in its own session with rlimits only (as root, still under its
  own leased uid, but Python must then be installed where other users can read it). No
  namespaces: use it for trusted code. `SandboxConfig.require_isolation` refuses it.

Limits: per-move wall-clock time is enforced preemptively (the arena polls the agent's stdout with
a deadline; a hung agent loses by TIMEOUT and is killed), with an overage bank per match drawn on
when a move takes longer than the per-move limit; RLIMIT_CPU bounds the agent's total CPU and a
cpu cgroup its share of the machine; RLIMIT_DATA bounds each process's heap, the summed anonymous
and shared memory of the agent's processes is polled from /proc while the arena waits and capped
in the kernel by a memory cgroup; RLIMIT_NPROC bounds fork bombs; RLIMIT_FSIZE and the tmpfs
sizes bound what it can write.

Faults: a crash, an early exit, closing stdout, a timeout, a malformed or illegal action or any
line the arena did not ask for ends the match as a forfeit (`MatchStatus` ERROR / TIMEOUT /
INVALID) with an `AgentFault` record and the agent's stderr tail. The faulting process is killed
at once; the next match restarts it. After `SandboxLimits.max_consecutive_faults` faulty
matches in a row, `max_faults` faulty matches in all, or `startup_budget_s` seconds spent starting,
the agent is dead: its later matches in the tournament are forfeited without starting it.
Everything the agent started is killed when it is done (PID namespace teardown, then a sweep by
its uid or namespace that verifies nothing is left).
"""

from __future__ import annotations

import enum
import fcntl
import json
import math
import os
import pwd
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from arena import cgroups, protocol
from ludus.errors import UserError
from ludus.text import printable

if TYPE_CHECKING:
    from agents.policy import Policy
    from arena.submission import Submission
    from games.core import GameSpec

INIT_SCRIPT = Path(__file__).with_name("sandbox_init.py")
REPO_ROOT = Path(__file__).resolve().parent.parent
_PAGE = os.sysconf("SC_PAGE_SIZE")
_MIB = 1 << 20


class SandboxError(UserError, RuntimeError):
    """The sandbox itself cannot work here (not the agent's fault); `ludus arena doctor` says why."""


class Isolation(str, enum.Enum):
    AUTO = "auto"
    """``uid`` when root, else ``userns`` when the kernel allows user namespaces, else ``none``."""
    UID = "uid"
    USERNS = "userns"
    NONE = "none"


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


@dataclass(frozen=True)
class SandboxConfig:
    """Where and how agents are isolated."""

    isolation: Isolation = Isolation.AUTO
    """The isolation mode (see the module docstring)."""
    require_isolation: bool = False
    """Refuse to run an agent without namespaces (mode ``none``)."""
    uid_base: int = 60000
    """First uid (and gid) leased to agents in mode ``uid``; must not belong to any account."""
    uid_count: int = 1000
    """Number of uids in the lease range."""
    workspace_root: Path | None = None
    """Where per-agent directories are created; None: the system temp directory."""
    hidden_paths: tuple[str, ...] = ()
    """Files and directories agents must not see at all (the arena's database and state)."""
    stderr_dir: Path | None = None
    """If set, each match's stderr tail is written to ``<dir>/<match>.seat<s>.stderr``."""
    extra_env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables for the agent (the environment is otherwise clean)."""


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

    @property
    def forfeit(self) -> bool:
        return any(f is not None for f in self.faults)


FORFEIT_LOSS_UNKNOWN_BOUNDS = -1.0
"""A faulting seat's return in a game whose worst return is not known (an adapted game with no
recorded facts: infinite `min_utility`); the others then get its negation when the best return is
not known either. The ledger needs finite returns, and a forfeit must still read as a loss."""


def forfeit_returns(spec: "GameSpec", faulted: Sequence[bool]) -> tuple[float, ...]:
    """Returns of a match that ended by forfeit.

    Faulting seats get `min_utility`. In zero-sum games the other seats share what the faulting
    seats lost, each getting ``(utility_sum - k * min_utility) / (P - k)`` clipped to
    `max_utility` (for two-player zero-sum games: the opponent wins, ``max_utility``); in other
    games they get `max_utility`. If every seat faulted, all get `min_utility`. Unknown (infinite)
    bounds are replaced by `FORFEIT_LOSS_UNKNOWN_BOUNDS` and its negation.
    """
    lo = float(spec.min_utility) if math.isfinite(spec.min_utility) else FORFEIT_LOSS_UNKNOWN_BOUNDS
    hi = float(spec.max_utility) if math.isfinite(spec.max_utility) else -FORFEIT_LOSS_UNKNOWN_BOUNDS
    k = sum(bool(f) for f in faulted)
    n = len(faulted)
    if k == n:
        return tuple(lo for _ in faulted)
    if spec.zero_sum and spec.utility_sum is not None:
        share = min(hi, (spec.utility_sum - k * lo) / (n - k))
    else:
        share = hi
    return tuple(lo if f else share for f in faulted)


# -------------------------------------------------------------------------------- host helpers


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    pgid: int
    state: str
    uid: int


def _read_proc(pid: int) -> _Proc | None:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'
    fields = data[data.rindex(b")") + 2:].split()
    return _Proc(pid, int(fields[1]), int(fields[2]), fields[0].decode(), uid)


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose effective uid is `uid`."""
    found = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                try:
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                except OSError:
                    continue
                proc = _read_proc(int(entry.name))
                if proc is not None and proc.uid == uid and proc.state not in ("Z", "X"):
                    found.append(proc.pid)
    return found


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _pids_in_namespace(ns: str) -> list[int]:
    pids = []
    for pid in _all_pids():
        if _pid_namespace(pid) == ns:
            proc = _read_proc(pid)
            if proc is not None and proc.state not in ("Z", "X"):
                pids.append(pid)
    return pids


def _pids_in_group(pgid: int) -> list[int]:
    pids = []
    for pid in _all_pids():
        proc = _read_proc(pid)
        if proc is not None and proc.pgid == pgid and proc.state not in ("Z", "X"):
            pids.append(pid)
    return pids


def _resident_bytes(pids: Sequence[int]) -> int:
    """Summed anonymous plus shared-memory resident pages (/proc/PID/status RssAnon + RssShmem).

    Shared memory counts: a shared anonymous mapping or a tmpfs file is held by the agent as surely
    as its heap, and is not anonymous. An upper bound: a page shared by k processes counts k times."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                text = f.read()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith((b"RssAnon:", b"RssShmem:")):
                total += int(line.split()[1]) * 1024
    return total


def _proportional_bytes(pids: Sequence[int]) -> int:
    """Summed proportional anonymous and shared memory (smaps_rollup Pss_Anon + Pss_Shmem; ~0.1-1 ms
    a process): a page shared by k processes counts 1/k in each, so forked children are not
    counted k times."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                text = f.read()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith((b"Pss_Anon:", b"Pss_Shmem:")):
                total += int(line.split()[1]) * 1024
    return total


def memory_bytes(pids: Sequence[int], cap: int) -> int:
    """Memory of a process tree as compared against `cap`: the cheap bound, and only when that
    exceeds the cap, the exact proportional figure. Where the machine allows, a memory cgroup
    enforces the cap in the kernel as well (arena/cgroups.py); this poll is what names the fault."""
    bound = _resident_bytes(pids)
    return bound if bound <= cap else _proportional_bytes(pids)


def _private_dir(path: Path) -> Path:
    """Create (or check) a directory only we can use; refuse one someone else planted."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SandboxError(f"{path} is not a private directory of this user (mode {oct(st.st_mode)}); remove it")
    return path


def _uid_has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _uid_lock_dir() -> Path:
    return _private_dir(Path(tempfile.gettempdir()) / "ludus-arena-uids")


def stray_agent_processes(config: SandboxConfig = SandboxConfig()) -> dict[int, list[int]]:
    """Processes running under agent uids that no live sandbox holds (there should be none).

    As root, a uid is inspected only while we hold its lease lock, so agents of other arenas
    running at the same time are never mistaken for strays. Without root (user-namespace mode)
    agents run under our own uid: a stray is then a process of ours in a PID namespace whose init
    is the sandbox launcher and that no live sandbox of this process holds (agents of another
    arena run by the same user at the same time count too)."""
    if os.geteuid() != 0:
        return _stray_namespaced_processes()
    lock_dir = _uid_lock_dir()
    strays: dict[int, list[int]] = {}
    for uid in range(config.uid_base, config.uid_base + config.uid_count):
        if _uid_has_account(uid):
            continue
        fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live sandbox holds it
            pids = pids_of_uid(uid)
        finally:
            os.close(fd)
        if pids:
            strays[uid] = pids
    return strays


_LIVE_NAMESPACES: set[str] = set()
"""PID namespaces of the user-namespace sandboxes this process is running."""


def _stray_namespaced_processes() -> dict[int, list[int]]:
    own = _pid_namespace(os.getpid())
    launcher_namespaces: dict[str, bool] = {}
    strays = []
    for pid in pids_of_uid(os.getuid()):
        ns = _pid_namespace(pid)
        if ns is None or ns == own or ns in _LIVE_NAMESPACES:
            continue
        if ns not in launcher_namespaces:
            launcher_namespaces[ns] = _namespace_init_is_launcher(ns)
        if launcher_namespaces[ns]:
            strays.append(pid)
    return {os.getuid(): strays} if strays else {}


def _namespace_init_is_launcher(ns: str) -> bool:
    """Whether PID 1 of namespace `ns` is arena/sandbox_init.py."""
    for pid in _all_pids():
        if _pid_namespace(pid) != ns:
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if nspid and nspid[-1] == "1":
            return INIT_SCRIPT.name.encode() in cmdline
    return False


class _UidLease:
    """An agent uid nobody else uses, held by an flock for as long as the sandbox lives."""

    def __init__(self, base: int, count: int):
        lock_dir = _uid_lock_dir()
        for uid in range(base, base + count):
            if _uid_has_account(uid) or pids_of_uid(uid):
                continue
            fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if pids_of_uid(uid):  # its last holder released it while processes lingered
                os.close(fd)
                continue
            self.uid = uid
            self._fd: int | None = fd
            return
        raise SandboxError(f"no free agent uid in {base}..{base + count - 1}: raise SandboxConfig.uid_count "
                           f"or stop other arenas")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def userns_allowed() -> bool:
    """Whether the kernel lets unprivileged users create user namespaces (as far as sysctls say)."""
    checks = (("/proc/sys/user/max_user_namespaces", lambda v: int(v) > 0),
              ("/proc/sys/kernel/unprivileged_userns_clone", lambda v: int(v) == 1),
              ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", lambda v: int(v) == 0))
    for path, ok in checks:
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue  # the knob does not exist on this kernel: no restriction from it
        if not ok(value):
            return False
    return True


def resolve_isolation(config: SandboxConfig) -> Isolation:
    mode = config.isolation
    if mode == Isolation.AUTO:
        if os.geteuid() == 0:
            mode = Isolation.UID
        elif userns_allowed():
            mode = Isolation.USERNS
        else:
            mode = Isolation.NONE
    if mode == Isolation.UID and os.geteuid() != 0:
        raise SandboxError("isolation 'uid' needs root: use 'userns' or 'auto'")
    if mode == Isolation.USERNS and os.geteuid() == 0:
        # the agent would keep uid 0, and uid 0 owns the host's files whatever the namespace
        raise SandboxError("isolation 'userns' would run agents as root when the arena is root: use 'uid' or 'auto'")
    if mode == Isolation.NONE and config.require_isolation:
        raise SandboxError("no namespace isolation is available here and require_isolation is set: "
                           "run as root or enable user namespaces (`ludus arena doctor` says which)")
    return mode


# ----------------------------------------------------------------------------- submission copy


def copy_submission(source: Path, dest: Path, max_bytes: int) -> int:
    """Copy a submission (a directory or one file) into `dest`, regular files and directories only.

    Files are opened with O_NOFOLLOW and checked with fstat, so a symlink or a FIFO swapped in
    after validation is refused rather than followed (we may be root). Returns the bytes copied.
    """
    total = 0

    def copy_file(src: Path, dst: Path) -> None:
        nonlocal total
        try:
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise SandboxError(f"cannot read {src}: {exc.strerror} (submissions may not contain symlinks)") from None
        with os.fdopen(fd, "rb") as fin:
            st = os.fstat(fin.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise SandboxError(f"{src} is not a regular file; submissions hold only files and directories")
            total += st.st_size
            if total > max_bytes:
                raise SandboxError(f"submission {source} is larger than {max_bytes // _MIB} MiB")
            with open(dst, "xb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            os.chmod(dst, 0o755 if st.st_mode & 0o111 else 0o644)

    st = os.lstat(source)
    if stat.S_ISREG(st.st_mode):
        dest.mkdir(mode=0o755)
        copy_file(source, dest / source.name)
        return total
    if not stat.S_ISDIR(st.st_mode):
        raise SandboxError(f"{source} is neither a directory nor a regular file")
    dest.mkdir(mode=0o755)
    for dirpath, dirnames, filenames in os.walk(source, followlinks=False):
        rel = Path(dirpath).relative_to(source)
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                raise SandboxError(f"{Path(dirpath) / name} is a symlink; submissions may not contain symlinks")
            (dest / rel / name).mkdir(mode=0o755)
        for name in filenames:
            copy_file(Path(dirpath) / name, dest / rel / name)
    return total


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


# --------------------------------------------------------------------------------- the process


def _python_paths() -> list[str]:
    """Directories an agent's Python needs to see: the installation and the Ludus source."""
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))), str(REPO_ROOT)}
    paths.update(p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p))
    return sorted({os.path.realpath(p) for p in paths})


def _is_under(path: str, root: str) -> bool:
    return path != root and path.startswith(root.rstrip("/") + "/")


# What a runtime needs from the host, bound read-only into the agent's fresh root: the system's
# programs and libraries, and the dynamic loader's configuration (nothing else of /etc).
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def mount_plan(mode: Isolation, agent_dir: Path, submission_dir: Path, home: Path, uid: int, gid: int,
               limits: SandboxLimits, hidden_paths: Sequence[str], new_root: Path) -> list[dict]:
    """The filesystem view of one agent, as ordered operations for sandbox_init.py.

    A minimal root: a fresh tmpfs at `new_root` becomes the agent's ``/`` (pivot_root), holding
    only bind mounts of the runtime (/usr and its top-level links, the loader's configuration,
    the Python installation and the Ludus source), a few device nodes, its own directory with its
    submission (read-only), and private size-capped tmpfs for /tmp, /var/tmp, /dev/shm and its home.
    The rest of the host's filesystem (/etc, /home, /root, other agents' directories, the arena's
    state) does not exist for it. The root is read-only once laid out."""
    del mode  # the same view in both namespace modes
    tmpfs = f"size={limits.tmpfs_mb}m"
    plan: list[dict] = [{"op": "new_root", "target": str(new_root), "options": "size=1m,mode=755"}]
    binds: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin and friends
            plan.append({"op": "symlink", "target": path, "link": os.readlink(path)})
        elif os.path.isdir(path):
            binds.append(path)
    binds += [p for p in _SYSTEM_FILES if os.path.exists(p)]
    for path in _python_paths() + [str(agent_dir)]:
        if not any(path == b or _is_under(path, b) for b in binds):
            binds = [b for b in binds if not _is_under(b, path)] + [path]
    plan += [{"op": "tmpfs", "target": t, "options": f"{tmpfs},mode=1777"} for t in ("/tmp", "/var/tmp")]
    plan += [{"op": "bind", "source": p, "target": p, "readonly": True} for p in sorted(binds, key=len)]
    plan += [{"op": "bind", "source": d, "target": d, "readonly": False} for d in _DEVICES if os.path.exists(d)]
    plan.append({"op": "tmpfs", "target": "/dev/shm", "options": f"{tmpfs},mode=1777"})
    plan.append({"op": "bind", "source": str(submission_dir), "target": str(submission_dir), "readonly": True})
    plan.append({"op": "tmpfs", "target": str(home), "options": f"{tmpfs},mode=700,uid={uid},gid={gid}"})
    for hidden in hidden_paths:  # e.g. the arena's state where it lies under a bound path
        hidden = os.path.realpath(hidden)
        if os.path.isdir(hidden):
            plan.append({"op": "hide_dir", "target": hidden})
        elif os.path.exists(hidden):
            plan.append({"op": "hide_file", "target": hidden})
    plan.append({"op": "proc", "target": "/proc"})
    # a fresh sysfs shows this network namespace's devices only; some kernels refuse it in a user
    # namespace, and then the agent has no /sys at all
    plan.append({"op": "sysfs", "target": "/sys", "optional": True})
    plan.append({"op": "pivot"})
    return plan


def _rlimits(limits: SandboxLimits, shares_our_uid: bool) -> list[tuple[int, int, int]]:
    nproc = limits.max_processes
    if shares_our_uid:  # RLIMIT_NPROC counts all processes of the uid: count our own in
        nproc += len(pids_of_uid(os.getuid()))
    return [
        (resource.RLIMIT_CPU, limits.cpu_time_s, limits.cpu_time_s + 1),
        (resource.RLIMIT_DATA, limits.data_mb * _MIB, limits.data_mb * _MIB),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_NOFILE, limits.max_open_files, limits.max_open_files),
        (resource.RLIMIT_FSIZE, limits.max_file_mb * _MIB, limits.max_file_mb * _MIB),
        (resource.RLIMIT_CORE, 0, 0),
    ]


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        hint = {"SIGXCPU": " (CPU time limit)", "SIGKILL": "", "SIGXFSZ": " (file size limit)"}.get(name, "")
        return f"was killed by {name}{hint}"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


SCRATCH_PREFIX = "ludus-agent-"
SCRATCH_LOCK = "lock"
_CLEANED_ROOTS: set[str] = set()


def _clean_stale_scratch(root: Path) -> list[Path]:
    """Remove agents' scratch directories (and control groups) that an arena killed with -9 left
    behind: those whose lock no live sandbox holds. Once per workspace root and process."""
    key = os.path.realpath(root)
    if key in _CLEANED_ROOTS:
        return []
    _CLEANED_ROOTS.add(key)
    removed = []
    for outer in root.glob(f"{SCRATCH_PREFIX}*"):
        if outer.is_symlink() or not outer.is_dir() or outer.stat().st_uid != os.getuid():
            continue
        try:
            fd = os.open(outer / SCRATCH_LOCK, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:  # made a moment ago and not locked yet, or from before locks
            if time.time() - outer.stat().st_mtime < 60:
                continue
            fd = None
        except OSError:
            continue
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live sandbox (of this or another arena) holds it
            shutil.rmtree(outer, ignore_errors=True)
            removed.append(outer)
        finally:
            if fd is not None:
                os.close(fd)
    if removed and os.geteuid() == 0:
        cgroups.remove_stale_groups()
    return removed


class SandboxProcess:
    """One sandboxed process with pipes on stdin/stdout/stderr; the building block of agents.

    Owns the agent's directory (its copy of the submission and its home) and, in mode ``uid``,
    its uid lease. `kill()` ends every process it started and verifies it; `cleanup()` also
    removes the directory and releases the uid.
    """

    def __init__(self, source: Path, make_argv: Callable[[Path], list[str]], limits: SandboxLimits,
                 config: SandboxConfig):
        self.limits = limits
        self.config = config
        self.mode = resolve_isolation(config)
        # As root, every agent gets its own uid, even without namespaces (mode none): so rlimits
        # such as RLIMIT_NPROC bind, and the sweep can find its processes by uid.
        self._lease = _UidLease(config.uid_base, config.uid_count) if os.geteuid() == 0 else None
        self.uid = self._lease.uid if self._lease else os.getuid()
        self.gid = self.uid if self._lease else os.getgid()
        root = config.workspace_root or Path(tempfile.gettempdir())
        if os.path.realpath(root) == "/":
            raise SandboxError("workspace_root cannot be '/': it is hidden from agents; pick a directory")
        _clean_stale_scratch(Path(root))
        self._scratch_lock: int | None = None
        try:
            self._outer = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=root))
            # held for the sandbox's life: a scratch directory whose lock is free was left by a dead arena
            self._scratch_lock = os.open(self._outer / SCRATCH_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._scratch_lock, fcntl.LOCK_EX)
            os.chmod(self._outer, 0o711)  # agents may pass through, not list
            self.agent_dir = self._outer / "agent"
            self.agent_dir.mkdir(mode=0o700)
            self.submission_dir = self.agent_dir / "submission"
            copy_submission(source, self.submission_dir, limits.max_submission_mb * _MIB)
            self.home = self.agent_dir / "home"
            self.home.mkdir(mode=0o700)
            self._new_root = self._outer / "root"  # where the launcher lays out the agent's / (mount_plan)
            self._new_root.mkdir(mode=0o700)
            if self._lease:
                _chown_tree(self.agent_dir, self.uid, self.gid)
        except BaseException:
            self.cleanup()
            raise
        self.argv = make_argv(self.submission_dir)
        self._cgroup = None
        if self._lease is not None and self.mode != Isolation.NONE and cgroups.support().memory_ok:
            # the kernel's cap: the agent's own budget plus what its private tmpfs mounts may hold
            # (tmpfs pages are charged to the group too); the /proc poll names a fault earlier
            kernel_cap = (limits.rss_mb + 4 * limits.tmpfs_mb) * _MIB
            try:
                self._cgroup = cgroups.AgentCgroup(self._outer.name, kernel_cap, limits.cpu_cores)
            except OSError as exc:
                self.cleanup()
                raise SandboxError(f"cannot make the agent's control groups: {exc}; `ludus arena doctor` "
                                   f"says what works here") from None
        self._cleaned = False
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.leftover_pids: tuple[int, ...] = ()
        """Processes that survived a kill (always empty unless something is badly wrong)."""
        self._pid_ns: str | None = None
        self._lifeline: int | None = None

    # -- launching

    def _env(self) -> dict[str, str]:
        py_bin = os.path.dirname(sys.executable)
        env = {
            "PATH": f"{py_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "TMPDIR": "/tmp" if self.mode != Isolation.NONE else str(self.home),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
            "PYTHONHASHSEED": "0",
            # one thread each: agents share the machine's cores fairly
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        env.update(dict(self.config.extra_env))
        return env

    def _hidden_paths(self) -> tuple[str, ...]:
        """The configured hidden paths plus the stderr logs of all agents."""
        extra = (str(self.config.stderr_dir),) if self.config.stderr_dir is not None else ()
        return tuple(self.config.hidden_paths) + extra

    def launch(self, deadline: float) -> str | None:
        """Start the process. Returns None, or why the agent's program could not be executed.

        Raises SandboxError when the sandbox itself could not be set up."""
        if self._cleaned:
            raise SandboxError("this sandbox was cleaned up; start a new one")
        self.exit_code = None
        self.leftover_pids = ()
        if self.mode == Isolation.NONE:
            return self._launch_plain()
        status_r, status_w = os.pipe()
        life_r, self._lifeline = os.pipe()
        config = {
            "mode": self.mode.value,
            "uid": self.uid, "gid": self.gid, "host_uid": os.getuid(), "host_gid": os.getgid(),
            "argv": self.argv, "env": self._env(), "cwd": str(self.home),
            "rlimits": _rlimits(self.limits, self._lease is None),
            "mounts": mount_plan(self.mode, self.agent_dir, self.submission_dir, self.home, self.uid,
                                 self.gid, self.limits, self._hidden_paths(), self._new_root),
            "status_fd": status_w, "lifeline_fd": life_r,
            "cgroup_procs": self._cgroup.procs_files if self._cgroup is not None else [],
        }
        # The config goes through a pipe, not argv: init is PID 1 of the agent's namespace, and
        # any process can read /proc/1/cmdline.
        config_r, config_w = os.pipe()
        data = json.dumps(config).encode()
        if len(data) >= 65536:  # must fit in the pipe's buffer: nobody reads it before the launch
            raise SandboxError("sandbox config over 64 KiB: too many hidden_paths or extra_env")
        os.write(config_w, data)
        os.close(config_w)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(INIT_SCRIPT), str(config_r)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(status_w, life_r, config_r), start_new_session=True, cwd="/",
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        finally:
            for fd in (status_w, life_r, config_r):
                os.close(fd)
        status = bytearray()
        try:
            while True:  # until EOF: execve closed the close-on-exec status pipe, or an error came
                if not select.select([status_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    status[:] = b"Xthe sandbox did not start in time"
                    break
                chunk = os.read(status_r, 4096)
                if not chunk:
                    break
                status += chunk
        finally:
            os.close(status_r)
        message = status[1:].decode("utf-8", "replace")
        if status[:1] == b"E":
            self.kill()
            raise SandboxError(f"cannot set up the agent sandbox ({self.mode.value}): {message}; "
                               f"`ludus arena doctor` lists what works here")
        if status:
            self.kill()
            return message
        if self.mode == Isolation.USERNS:  # the uid does not tell our processes apart: the namespace does
            self._pid_ns = self._find_namespace()
            if self._pid_ns is not None:
                _LIVE_NAMESPACES.add(self._pid_ns)
        return None

    def _launch_plain(self) -> str | None:
        rlimits = _rlimits(self.limits, self._lease is None)

        def preexec() -> None:  # runs in the child after the uid change: it only lowers limits
            for res, soft, hard in rlimits:
                resource.setrlimit(res, (soft, hard))
            os.umask(0o077)

        ids = {"user": self.uid, "group": self.gid, "extra_groups": []} if self._lease else {}
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True, cwd=self.home,
                                         env=self._env(), preexec_fn=preexec, **ids)
        except OSError as exc:
            return f"cannot execute {self.argv[0]}: {exc.strerror}"
        return None

    def _find_namespace(self) -> str | None:
        """The PID namespace of init (the warden's child), to sweep it after a kill."""
        assert self.proc is not None
        for _ in range(200):
            for pid in _all_pids():
                proc = _read_proc(pid)
                if proc is not None and proc.ppid == self.proc.pid:
                    return _pid_namespace(pid)
            if self.proc.poll() is not None:
                return None
            time.sleep(0.001)
        return None

    # -- observing

    def pids(self) -> list[int]:
        """Live processes of this sandbox (for memory accounting and the final sweep); none
        once cleaned up (its uid may belong to another sandbox by then)."""
        if self._cleaned:
            return []
        if self._lease is not None:
            return pids_of_uid(self.uid)
        if self.mode == Isolation.USERNS:
            return _pids_in_namespace(self._pid_ns) if self._pid_ns else []
        return _pids_in_group(self.proc.pid) if self.proc else []

    def memory_killed(self) -> bool:
        """Whether the kernel killed one of its processes at the memory cgroup's limit."""
        return self._cgroup is not None and self._cgroup.oom_kills() > 0

    def memory_bytes(self) -> int:
        """Anonymous memory of all its processes (see `memory_bytes`), exact near the cap."""
        return memory_bytes(self.pids(), self.limits.rss_mb * _MIB)

    def poll_exit(self, wait_s: float = 0.0) -> int | None:
        """The exit code if the process has exited (waiting up to `wait_s`)."""
        if self.proc is None:
            return self.exit_code
        try:
            code = self.proc.wait(timeout=wait_s) if wait_s > 0 else self.proc.poll()
        except subprocess.TimeoutExpired:
            return None
        if code is not None:
            self.exit_code = code if code >= 0 else 128 - code
        return self.exit_code

    # -- ending

    def kill(self) -> None:
        """Kill everything this sandbox started and verify that nothing is left."""
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    if self.mode == Isolation.NONE:
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    else:
                        self.proc.kill()  # the warden; init follows (pdeathsig), then the namespace
                except ProcessLookupError:
                    pass
            self.poll_exit(wait_s=5.0)
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        self._sweep()
        if self._pid_ns is not None and not self.leftover_pids:
            _LIVE_NAMESPACES.discard(self._pid_ns)
        self.proc = None

    def _sweep(self) -> None:
        """Fallback that needs no namespace: SIGKILL whatever still runs as ours, until none does."""
        if self._lease is None and self.mode == Isolation.USERNS and self._pid_ns is None:
            return
        if self._lease is None and self.mode == Isolation.NONE and self.proc is None:
            return
        deadline = time.monotonic() + 5.0
        while True:
            left = self.pids()
            if not left:
                self.leftover_pids = ()
                return
            if time.monotonic() > deadline:
                self.leftover_pids = tuple(left)
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def cleanup(self) -> None:
        """Kill, remove the agent's directory, release the uid (once; later calls do nothing).

        Also called from a half-built __init__, hence the getattr defaults."""
        if getattr(self, "_cleaned", False):
            return
        if getattr(self, "proc", None) is not None or getattr(self, "_lifeline", None) is not None:
            self.kill()
        self._cleaned = True
        group = getattr(self, "_cgroup", None)
        if group is not None:
            group.remove()
        outer = getattr(self, "_outer", None)
        if outer is not None and outer.exists():
            shutil.rmtree(outer, ignore_errors=True)
        if getattr(self, "_scratch_lock", None) is not None:
            os.close(self._scratch_lock)
            self._scratch_lock = None
        lease = getattr(self, "_lease", None)
        if lease is not None:
            lease.release()


@dataclass(frozen=True)
class SandboxRun:
    """Result of a one-shot sandboxed command (`run_once`)."""

    exit_code: int | None
    """None if it was killed for running too long."""
    stdout: bytes
    stderr_tail: str
    launch_error: str | None = None
    """Why the program could not be executed, if it could not."""


def run_once(source: Path, make_argv: Callable[[Path], list[str]], timeout_s: float,
             limits: SandboxLimits = SandboxLimits(), config: SandboxConfig = SandboxConfig(),
             max_stdout: int = protocol.MAX_AGENT_LINE_BYTES) -> SandboxRun:
    """Run a command on a copy of `source` in a fresh sandbox, with no input, and collect output.

    Used at submit time to import a submission's entry point without running it in the arena."""
    box = SandboxProcess(source, make_argv, limits, config)
    try:
        deadline = time.monotonic() + timeout_s
        problem = box.launch(deadline)
        if problem is not None:
            return SandboxRun(box.exit_code, b"", "", problem)
        assert box.proc is not None
        box.proc.stdin.close()
        out, err = bytearray(), bytearray()
        streams = {box.proc.stdout.fileno(): out, box.proc.stderr.fileno(): err}
        while streams and time.monotonic() < deadline:
            ready = select.select(list(streams), [], [], max(0.0, deadline - time.monotonic()))[0]
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    del streams[fd]
                    continue
                buf = streams[fd]
                buf += chunk
                cap = max_stdout if buf is out else limits.stderr_tail_bytes
                if len(buf) > cap:
                    del buf[:len(buf) - cap]
        code = box.poll_exit(wait_s=max(0.0, min(1.0, deadline - time.monotonic())))
        return SandboxRun(code, bytes(out), err.decode("utf-8", "replace"))
    finally:
        box.cleanup()


# ------------------------------------------------------------------------------------- agents


def agent_argv(submission: "Submission") -> Callable[[Path], list[str]]:
    """How to run a submission, given where its copy lives inside the sandbox."""
    from arena.submission import SubmissionKind

    python = [sys.executable, "-B", "-s", "-m", "arena.agent_host"]
    if submission.kind == SubmissionKind.PYTHON_FOLDER:
        entry = submission.entry_point
        return lambda copy: python + ["--folder", str(copy), "--entry", entry]
    if submission.kind == SubmissionKind.SNAPSHOT:
        return lambda copy: python + ["--snapshot", str(copy)]
    if submission.kind == SubmissionKind.EXECUTABLE:
        relative = submission.executable
        return lambda copy: [str(copy / relative)]
    raise SandboxError(f"submission {submission.name!r} is a built-in bot; it plays in-process, not sandboxed")


class SandboxedAgent:
    """A submission playing in its own sandboxed process, started once and reused across matches.

    The process starts lazily with the first match (`begin_match`). Use as a context manager, or
    call `close()`, to shut it down and remove its files.
    """

    def __init__(self, submission: "Submission", game_id: str, limits: SandboxLimits = SandboxLimits(),
                 config: SandboxConfig = SandboxConfig()):
        from games import registry

        if submission.game is not None and submission.game != game_id:
            raise SandboxError(f"submission {submission.name!r} plays {submission.game!r}, not {game_id!r}")
        self.submission = submission
        self.name = submission.name
        self.game_id = game_id
        self.spec = registry.spec(game_id)
        self.limits = limits
        self.config = config
        self._box = SandboxProcess(submission.path, agent_argv(submission), limits, config)
        self.consecutive_faults = 0
        self.total_faults = 0
        self._death: str | None = None
        self.startup_seconds = 0.0
        """Wall-clock time spent in (re)starts so far (against `SandboxLimits.startup_budget_s`)."""
        self._match_moves = 0
        """Actions the agent gave in the current match."""
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
        return self._fault(MatchStatus.ERROR, f"{_describe_exit(code)} {when}", exited=True)

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
                    try:
                        chunk = os.read(fd, 1 << 17)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        return self._exited_fault(when)
                    buf += chunk
                elif fd == self._err_fd:
                    self._drain_stderr()

    def _check_memory(self) -> AgentFault | None:
        self._next_rss_check = time.monotonic() + self.limits.rss_poll_interval_s
        used = self._box.memory_bytes()
        if used > self.limits.rss_mb * _MIB:
            return self._fault(MatchStatus.ERROR, f"used {used // _MIB} MiB of memory, over its "
                                                  f"{self.limits.rss_mb} MiB limit")
        return None

    def _check_quiet(self, when: str) -> AgentFault | None:
        """Nothing may arrive unasked: check (without waiting) that the agent has been silent."""
        if self._buf:
            return self._fault(MatchStatus.INVALID, f"sent a line nobody asked for {when}")
        for fd, _ in self._poller.poll(0):
            if fd == self._err_fd:
                self._drain_stderr()
            elif fd == self._out_fd:
                try:
                    chunk = os.read(fd, 1 << 17)
                except BlockingIOError:
                    continue
                if not chunk:
                    return self._exited_fault(when)
                self._buf += chunk
                return self._fault(MatchStatus.INVALID, f"sent a line nobody asked for {when}")
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
                               self.spec.num_actions, self.spec.observation_shape)
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

    def receive_action(self, deadline: float, legal_mask: np.ndarray) -> int | AgentFault:
        line = self._read_line(deadline, "during its move")
        if isinstance(line, AgentFault):
            return line
        try:
            message = protocol.decode_agent_line(line, self.spec.num_actions)
        except protocol.ProtocolError as exc:
            return self._fault(MatchStatus.INVALID, f"malformed action: {exc}")
        if not isinstance(message, protocol.Action):
            return self._fault(MatchStatus.INVALID, "sent 'ready' when an action was asked for")
        if not legal_mask[message.action]:
            return self._fault(MatchStatus.INVALID, f"illegal action {message.action}")
        self._match_moves += 1
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

    def check_quiet(self) -> AgentFault | None:
        """At the end of a match: a fault if the agent sent anything nobody asked for."""
        return self._check_quiet("at the end of the match") if self._running else None

    def end_match(self, match_id: str, returns: Sequence[float], seat: int,
                  stderr_path: Path | None = None) -> str:
        """Send ``end`` and close the match's books; returns its stderr tail.

        An agent that cannot take ``end`` is not faulted for it (the match is decided); it is
        restarted before its next match."""
        if self._running:
            end = protocol.End(match_id, tuple(float(r) for r in returns), seat)
            self._write(protocol.encode_end(end), time.monotonic() + 1.0, "at the end of the match")
        if self._running and self._err_fd >= 0:
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
               greedy: bool = False) -> MatchRecord:
    """Play one match between sandboxed agents and/or in-process policies (bots, snapshots).

    Sandboxed seats are held to `limits`; in-process policies are trusted code and are not timed
    out (their exceptions propagate). A fault ends the match at once as a forfeit
    (`forfeit_returns`). Each seat's randomness derives from `seed`, so a match between
    deterministic-given-seed agents replays exactly.
    """
    from agents.policy import ActBatch
    from games import registry
    from games.core import is_over

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

    for seat, agent in enumerate(sandboxed):
        if agent is not None:
            faults[seat] = agent.begin_match(match_id, seat, seat_seeds[seat], limits)

    while not any(faults) and not is_over(game):
        movers = game.to_move()
        masks = {seat: game.legal_mask(seat) for seat in movers}
        actions: dict[int, int] = {}
        asked: dict[int, float] = {}
        move_think: dict[int, float] = {}
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
                    else:
                        actions[seat] = result
            else:
                t0 = time.monotonic()
                batch = ActBatch(game.observation(seat)[None], masks[seat][None], np.array([seat]),
                                 [game.history()] if agent.needs_history else None)
                action = int(agent.act(batch, rngs[seat], greedy=greedy).actions[0])
                move_think[seat] = time.monotonic() - t0
                think[seat] += move_think[seat]
                if not masks[seat][action]:
                    raise SandboxError(f"in-process policy {type(agent).__name__} chose illegal action {action}")
                actions[seat] = action
        if any(faults):
            break
        game.step(actions)
        for seat in movers:
            moves.append(MoveRecord(seat, actions[seat], move_think[seat]))

    if not any(faults):
        # output nobody asked for (a second answer to the last move) forfeits the match too
        for seat, agent in enumerate(sandboxed):
            if agent is not None:
                faults[seat] = agent.check_quiet()
    returns = forfeit_returns(spec, [f is not None for f in faults]) if any(faults) \
        else tuple(float(r) for r in game.returns())
    tails = [""] * spec.num_players
    for seat, agent in enumerate(sandboxed):
        if agent is not None:
            path = None
            if agent.config.stderr_dir is not None:
                path = Path(agent.config.stderr_dir) / f"{_safe_name(match_id)}.seat{seat}.stderr"
            tails[seat] = agent.end_match(match_id, returns, seat, path)
    statuses = tuple(MatchStatus.OK if f is None else f.status for f in faults)
    names = tuple(a.name if isinstance(a, SandboxedAgent) else type(a).__name__ for a in agents)
    return MatchRecord(match_id, game_id, seed, names, returns, statuses, tuple(faults), tuple(moves),
                       bool(game.is_truncated() and not game.is_terminal()), tuple(think),
                       time.monotonic() - started, tuple(tails))


def _safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:100]
