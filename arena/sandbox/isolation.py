"""How an agent process is isolated: its uid, namespaces, minimal root filesystem and rlimits,
and what /proc says about its processes (memory in use, processes left behind). The overview is
in arena/sandbox/process.py."""

from __future__ import annotations

import ctypes
import enum
import errno
import fcntl
import os
import pwd
import resource
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import ludus
from ludus.arena.sandbox import cgroups
from ludus.arena.sandbox.limits import SandboxLimits
from ludus.errors import UserError

INIT_SCRIPT = Path(__file__).with_name("sandbox_init.py")
REPO_ROOT = Path(ludus.__file__).resolve().parent.parent
"""The folder holding the `ludus` package, bound into every agent's root: from a checkout (an
editable install maps `ludus.arena` and the other families to the folders beside `ludus/`), the
repository; installed, site-packages, already bound with the Python installation."""
_PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20


class SandboxError(UserError, RuntimeError):
    """The sandbox itself cannot work here (not the agent's fault); `ludus arena doctor` says why."""


class Isolation(str, enum.Enum):
    AUTO = "auto"
    """``uid`` when root, else ``userns`` when the kernel allows user namespaces, else ``none``."""
    UID = "uid"
    USERNS = "userns"
    NONE = "none"


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
    shared_paths: tuple[str, ...] = ()
    """Host directories every agent may read (bound read-only): data the host trusts and hands to
    agents, e.g. the converted base models that language-model snapshots play on."""


# -------------------------------------------------------------------------------- host helpers


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    pgid: int
    state: str
    uid: int


def read_proc(pid: int) -> _Proc | None:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'
    fields = data[data.rindex(b")") + 2:].split()
    return _Proc(pid, int(fields[1]), int(fields[2]), fields[0].decode(), uid)


def all_pids() -> list[int]:
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
                proc = read_proc(int(entry.name))
                if proc is not None and proc.uid == uid and proc.state not in ("Z", "X"):
                    found.append(proc.pid)
    return found


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def pids_in_namespace(ns: str) -> list[int]:
    pids = []
    for pid in all_pids():
        if pid_namespace(pid) == ns:
            proc = read_proc(pid)
            if proc is not None and proc.state not in ("Z", "X"):
                pids.append(pid)
    return pids


def pids_in_group(pgid: int) -> list[int]:
    pids = []
    for pid in all_pids():
        proc = read_proc(pid)
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
    enforces the cap in the kernel as well (arena/sandbox/cgroups.py); this poll is what names the fault."""
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


LIVE_NAMESPACES: set[str] = set()
"""PID namespaces of the user-namespace sandboxes this process is running."""


def _stray_namespaced_processes() -> dict[int, list[int]]:
    own = pid_namespace(os.getpid())
    launcher_namespaces: dict[str, bool] = {}
    strays = []
    for pid in pids_of_uid(os.getuid()):
        ns = pid_namespace(pid)
        if ns is None or ns == own or ns in LIVE_NAMESPACES:
            continue
        if ns not in launcher_namespaces:
            launcher_namespaces[ns] = _namespace_init_is_launcher(ns)
        if launcher_namespaces[ns]:
            strays.append(pid)
    return {os.getuid(): strays} if strays else {}


def _namespace_init_is_launcher(ns: str) -> bool:
    """Whether PID 1 of namespace `ns` is arena/sandbox/sandbox_init.py."""
    for pid in all_pids():
        if pid_namespace(pid) != ns:
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


def uid_key_count(uid: int) -> int:
    """How many kernel keys `uid` owns (the nkeys column of /proc/key-users, which lists every uid
    that owns a key; keyrings(7)). The kernel frees them lazily (its key garbage collector), so a
    count may lag a key's end by a moment."""
    try:
        text = Path("/proc/key-users").read_text()
    except FileNotFoundError:  # a kernel without CONFIG_KEYS: nobody owns keys
        return 0
    for line in text.splitlines():
        owner, _, rest = line.partition(":")
        if owner.strip() == str(uid):
            return int(rest.split()[1].split("/")[0])
    return 0


_KEYCTL_NUMBERS = {"x86_64": 250, "aarch64": 219, "riscv64": 219}


_libc = ctypes.CDLL(None, use_errno=True)


def join_session_keyring() -> None:
    """Make the calling process leave its session keyring for a fresh anonymous one (keyctl(2),
    KEYCTL_JOIN_SESSION_KEYRING with no name). For a child that is about to run an agent without
    the namespace launcher (isolation ``none``): the session keyring is inherited across fork,
    execve and setuid, and possessing it grants its possessor permissions."""
    number = _KEYCTL_NUMBERS.get(os.uname().machine)
    if number is None:
        raise SandboxError(f"no keyctl syscall number for {os.uname().machine}: add it to isolation._KEYCTL_NUMBERS")
    if _keyctl(number, 1, 0) < 0:
        err = ctypes.get_errno()
        if err != errno.ENOSYS:  # ENOSYS: a kernel without keys, so none to share
            raise OSError(err, f"keyctl(join a fresh session keyring): {os.strerror(err)}")


def _keyctl(number: int, *args: int) -> int:
    return _libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))


def _clear_own_keys(number: int) -> None:
    """In a child that became the uid: unlink and invalidate every key it owns (keyctl(2))."""
    _keyctl(number, 1, 0)  # JOIN_SESSION_KEYRING, anonymous: possess nothing of the arena's session
    keys = [_keyctl(number, 0, spec, 1) for spec in (-4, -5)]  # GET_KEYRING_ID: user, user-session keyrings
    keys.append(_keyctl(number, 22, -1, -3))  # GET_PERSISTENT: the persistent keyring, linked into our session
    with open("/proc/keys") as listing:  # and any key of ours linked elsewhere that we may view
        keys += [int(fields[0], 16) for fields in map(str.split, listing) if fields[5] == str(os.getuid())]
    for key in keys:
        if key > 0:
            _keyctl(number, 7, key)  # CLEAR: unlink what a keyring holds (those keys go once nothing links them)
            _keyctl(number, 21, key)  # INVALIDATE: gone at once, and unlinked from the registers that keep it


def clear_uid_keys(uid: int, wait_s: float = 2.0) -> int:
    """Remove every key `uid` owns (as root); returns how many remain.

    A uid's user keyring, user-session keyring and persistent keyring live as long as the kernel's
    user namespace does (user-keyring(7), persistent-keyring(7)), not as long as its processes: the
    next agent leased the uid would find what the last one left, and the leftovers count against the
    uid's key quota (/proc/sys/kernel/keys/maxkeys). Only the uid itself may clear them (root has no
    override for a key that grants it nothing), so a child running as the uid does."""
    if uid_key_count(uid) == 0:
        return 0
    number = _KEYCTL_NUMBERS.get(os.uname().machine)
    if number is None:
        raise SandboxError(f"no keyctl syscall number for {os.uname().machine}: add it to isolation._KEYCTL_NUMBERS")
    pid = os.fork()  # not a new interpreter: the uid may not reach this one's files (/root is 0700)
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            _clear_own_keys(number)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + wait_s
    while (left := uid_key_count(uid)) and time.monotonic() < deadline:
        time.sleep(0.01)  # the garbage collector runs as a work item, soon after the last link goes
    return left


class UidLease:
    """An agent uid nobody else uses, held by an flock for as long as the sandbox lives.

    A uid is leased only when no process runs under it and it owns no kernel key (those it does own
    are cleared first, `clear_uid_keys`): nothing of an earlier agent, or of an arena killed with
    -9, reaches the next one."""

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
            if pids_of_uid(uid) or clear_uid_keys(uid):  # its last holder left processes or keys behind
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
                raise SandboxError(f"submission {source} is larger than {max_bytes // MIB} MiB")
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


def chown_tree(root: Path, uid: int, gid: int) -> None:
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
               limits: SandboxLimits, hidden_paths: Sequence[str], new_root: Path,
               shared_paths: Sequence[str] = ()) -> list[dict]:
    """The filesystem view of one agent, as ordered operations for sandbox_init.py.

    A minimal root: a fresh tmpfs at `new_root` becomes the agent's ``/`` (pivot_root), holding
    only bind mounts of the runtime (/usr and its top-level links, the loader's configuration,
    the Python installation and the Ludus source), a few device nodes, its own directory with its
    submission (read-only), the host's `shared_paths` (read-only), and private size-capped tmpfs for
    /tmp, /var/tmp, /dev/shm and its home.
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
    for shared in sorted({os.path.realpath(p) for p in shared_paths if os.path.isdir(p)}, key=len):
        plan.append({"op": "bind", "source": shared, "target": shared, "readonly": True})
    plan.append({"op": "tmpfs", "target": str(home), "options": f"{tmpfs},mode=700,uid={uid},gid={gid}"})
    for hidden in hidden_paths:  # e.g. the arena's state where it lies under a bound path
        hidden = os.path.realpath(hidden)
        if os.path.isdir(hidden):
            plan.append({"op": "hide_dir", "target": hidden})
        elif os.path.exists(hidden):
            plan.append({"op": "hide_file", "target": hidden})
    plan.append({"op": "proc", "target": "/proc"})
    # the kernel keyring is not namespaced: these list other uids' keys and key counts (keyrings(7))
    plan += [{"op": "hide_file", "target": t} for t in ("/proc/keys", "/proc/key-users")]
    # a fresh sysfs shows this network namespace's devices only; some kernels refuse it in a user
    # namespace, and then the agent has no /sys at all
    plan.append({"op": "sysfs", "target": "/sys", "optional": True})
    plan.append({"op": "pivot"})
    return plan


def rlimits_for(limits: SandboxLimits, shares_our_uid: bool) -> list[tuple[int, int, int]]:
    nproc = limits.max_processes
    if shares_our_uid:  # RLIMIT_NPROC counts all processes of the uid: count our own in
        nproc += len(pids_of_uid(os.getuid()))
    return [
        (resource.RLIMIT_CPU, limits.cpu_time_s, limits.cpu_time_s + 1),
        (resource.RLIMIT_DATA, limits.data_mb * MIB, limits.data_mb * MIB),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_NOFILE, limits.max_open_files, limits.max_open_files),
        (resource.RLIMIT_FSIZE, limits.max_file_mb * MIB, limits.max_file_mb * MIB),
        (resource.RLIMIT_CORE, 0, 0),
    ]


SCRATCH_PREFIX = "ludus-agent-"
SCRATCH_LOCK = "lock"
_CLEANED_ROOTS: set[str] = set()


def clean_stale_scratch(root: Path) -> list[Path]:
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
