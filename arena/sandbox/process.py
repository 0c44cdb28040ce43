"""Sandboxed agents: the process an agent runs in, and the watch on its limits.

The arena's sandbox has three parts: how a process is isolated (arena/sandbox/isolation.py: namespaces,
uids, the minimal root, rlimits, and what /proc says about an agent's processes), the process
itself with its resource watch (this module: `SandboxProcess`, `run_once`), and the conversation
with an agent in a match (arena/match.py: `SandboxedAgent`, `play_match`). The limits they all
read are one record (arena/sandbox/limits.py: `SandboxLimits`).

Each submission runs in its own process, started once per tournament and reused for many
matches (`SandboxedAgent`). It talks the JSON-lines protocol of `ludus.arena.protocol` over pipes.

Isolation (`Isolation`; `ludus.arena.doctor` tells which modes work on a machine):

* ``uid`` (the arena runs as root): the agent runs under its own unprivileged uid/gid
  (``uid_base + k``, leased with a lock file so concurrent arenas never share one) in fresh
  mount, network, PID, IPC and UTS namespaces, set up by ``arena/sandbox/sandbox_init.py``, inside its
  own memory and cpu control groups (arena/sandbox/cgroups.py) where the machine has them. The network
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

import fcntl
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ludus.arena import protocol
from ludus.arena.sandbox import cgroups
from ludus.arena.sandbox.isolation import (INIT_SCRIPT, LIVE_NAMESPACES, MIB, SCRATCH_LOCK, SCRATCH_PREFIX, Isolation, SandboxConfig,
                             SandboxError, UidLease, all_pids, chown_tree, clean_stale_scratch, copy_submission,
                             clear_uid_keys, join_session_keyring, memory_bytes, mount_plan, pid_namespace,
                             pids_in_group, pids_in_namespace, pids_of_uid, read_proc, resolve_isolation, rlimits_for)
from ludus.arena.sandbox.limits import SandboxLimits


def describe_exit(code: int | None) -> str:
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
        self._lease = UidLease(config.uid_base, config.uid_count) if os.geteuid() == 0 else None
        self.uid = self._lease.uid if self._lease else os.getuid()
        self.gid = self.uid if self._lease else os.getgid()
        root = config.workspace_root or Path(tempfile.gettempdir())
        if os.path.realpath(root) == "/":
            raise SandboxError("workspace_root cannot be '/': it is hidden from agents; pick a directory")
        clean_stale_scratch(Path(root))
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
            copy_submission(source, self.submission_dir, limits.max_submission_mb * MIB)
            self.home = self.agent_dir / "home"
            self.home.mkdir(mode=0o700)
            self._new_root = self._outer / "root"  # where the launcher lays out the agent's / (mount_plan)
            self._new_root.mkdir(mode=0o700)
            if self._lease:
                chown_tree(self.agent_dir, self.uid, self.gid)
        except BaseException:
            self.cleanup()
            raise
        self.argv = make_argv(self.submission_dir)
        self._cgroup = None
        if self._lease is not None and self.mode != Isolation.NONE and cgroups.support().memory_ok:
            # the kernel's cap: the agent's own budget plus what its private tmpfs mounts may hold
            # (tmpfs pages are charged to the group too); the /proc poll names a fault earlier
            kernel_cap = (limits.rss_mb + 4 * limits.tmpfs_mb) * MIB
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
        self.leftover_keys = 0
        """Kernel keys its uid still owned after `cleanup` (0 unless something is badly wrong;
        `UidLease` then never leases the uid again)."""
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
            "rlimits": rlimits_for(self.limits, self._lease is None),
            "mounts": mount_plan(self.mode, self.agent_dir, self.submission_dir, self.home, self.uid,
                                 self.gid, self.limits, self._hidden_paths(), self._new_root,
                                 self.config.shared_paths),
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
                LIVE_NAMESPACES.add(self._pid_ns)
        return None

    def _launch_plain(self) -> str | None:
        rlimits = rlimits_for(self.limits, self._lease is None)

        def preexec() -> None:  # runs in the child after the uid change: it only lowers limits
            for res, soft, hard in rlimits:
                resource.setrlimit(res, (soft, hard))
            os.umask(0o077)
            join_session_keyring()  # not the arena's: it would possess the arena's keys

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
            for pid in all_pids():
                proc = read_proc(pid)
                if proc is not None and proc.ppid == self.proc.pid:
                    return pid_namespace(pid)
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
            return pids_in_namespace(self._pid_ns) if self._pid_ns else []
        return pids_in_group(self.proc.pid) if self.proc else []

    def memory_killed(self) -> bool:
        """Whether the kernel killed one of its processes at the memory cgroup's limit."""
        return self._cgroup is not None and self._cgroup.oom_kills() > 0

    def memory_bytes(self) -> int:
        """Anonymous memory of all its processes (see `memory_bytes`), exact near the cap."""
        return memory_bytes(self.pids(), self.limits.rss_mb * MIB)

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
            LIVE_NAMESPACES.discard(self._pid_ns)
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
            # its keys would otherwise outlive it under the uid, for the next agent leased it to find
            self.leftover_keys = clear_uid_keys(self.uid)
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
