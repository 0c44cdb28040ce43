"""Which sandbox features work on this machine (for `ludus arena doctor`).

Besides reading sysctls and rlimits, `doctor` launches a probe agent through the real sandbox
(`ludus.arena.sandbox.process.run_once`) and checks from the inside what it can do: its uid, its PID (2 in a
fresh PID namespace: init is 1), whether 127.0.0.1 is reachable, whether the root filesystem is
read-only, whether numpy imports.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ludus.errors import UserError

_PROBE = """
import json, os, socket
report = {"uid": os.getuid(), "pid": os.getpid(),
          "root_readonly": bool(os.statvfs("/").f_flag & os.ST_RDONLY),
          "interfaces": sorted(os.listdir("/sys/class/net")),
          "ipc_ns": os.readlink("/proc/self/ns/ipc"), "uts_ns": os.readlink("/proc/self/ns/uts"),
          "hostname": socket.gethostname(),
          "host_files": sorted(p for p in ("/etc/passwd", "/etc/hostname", "/etc/ssh", "/home", "/opt", "/srv",
                                           "/boot", "/var/lib", "/var/log", "/root/.bashrc", "/root/.profile")
                               if os.path.exists(p))}
try:
    socket.create_connection(("127.0.0.1", 9), timeout=0.2).close()
    report["loopback"] = "reachable"
except OSError as exc:
    report["loopback"] = exc.strerror or type(exc).__name__
# the kernel keyring is not namespaced: an agent must not reach it (add_key into its uid's keyring)
import ctypes, errno
add_key = {"x86_64": 248, "aarch64": 217, "riscv64": 217}.get(os.uname().machine)
if add_key is None:
    report["keyring"] = "unknown machine"
else:
    libc = ctypes.CDLL(None, use_errno=True)
    key = libc.syscall(ctypes.c_long(add_key), b"user", b"ludus-doctor", b"x", ctypes.c_size_t(1), ctypes.c_long(-4))
    report["keyring"] = "reachable" if key >= 0 else errno.errorcode.get(ctypes.get_errno(), "error")
try:  # hidden: /dev/null is bound over it
    report["proc_keys"] = bool(open("/proc/keys").read())
except OSError:
    report["proc_keys"] = False
try:
    import numpy
    report["numpy"] = True
except ImportError:
    report["numpy"] = False
print(json.dumps(report))
"""


@dataclass(frozen=True)
class DoctorCheck:
    """One feature and whether it works."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class DoctorReport:
    """What the sandbox can use here; `isolation` is what ``Isolation.AUTO`` resolves to."""

    is_root: bool
    kernel: str
    isolation: str
    checks: tuple[DoctorCheck, ...]

    @property
    def problems(self) -> tuple[DoctorCheck, ...]:
        return tuple(c for c in self.checks if not c.ok)

    @property
    def isolated(self) -> bool:
        """Agents run in namespaces and the probe confirmed it."""
        return self.isolation != "none" and not self.problems


def _rlimit_check() -> DoctorCheck:
    from ludus.arena.sandbox.limits import SandboxLimits

    limits = SandboxLimits()
    wanted = {"RLIMIT_CPU": (resource.RLIMIT_CPU, limits.cpu_time_s + 1),
              "RLIMIT_DATA": (resource.RLIMIT_DATA, limits.data_mb << 20),
              "RLIMIT_NPROC": (resource.RLIMIT_NPROC, limits.max_processes),
              "RLIMIT_NOFILE": (resource.RLIMIT_NOFILE, limits.max_open_files),
              "RLIMIT_FSIZE": (resource.RLIMIT_FSIZE, limits.max_file_mb << 20)}
    short = [name for name, (res, value) in wanted.items()
             if os.geteuid() != 0 and resource.getrlimit(res)[1] not in (resource.RLIM_INFINITY,)
             and resource.getrlimit(res)[1] < value]
    if short:
        return DoctorCheck("rlimits", False, f"hard limits below the defaults for {', '.join(short)}")
    return DoctorCheck("rlimits", True, ", ".join(wanted))


def _proc_check() -> DoctorCheck:
    try:
        Path("/proc/self/statm").read_bytes()
        Path("/proc/self/smaps_rollup").read_bytes()
    except OSError as exc:
        return DoctorCheck("/proc accounting", False, f"cannot read /proc/self/statm or smaps_rollup: {exc.strerror}")
    return DoctorCheck("/proc accounting", True, "statm and smaps_rollup readable (memory cap, process sweep)")


def _probe(mode: str) -> list[DoctorCheck]:
    """Run the probe agent in `mode` and judge what it saw."""
    from ludus.arena.sandbox.isolation import Isolation, SandboxConfig
    from ludus.arena.sandbox.limits import SandboxLimits
    from ludus.arena.sandbox.process import run_once

    name = f"sandbox probe ({mode})"
    with tempfile.TemporaryDirectory(prefix="ludus-doctor-") as empty:
        try:
            run = run_once(Path(empty), lambda copy: [sys.executable, "-s", "-c", _PROBE], timeout_s=30.0,
                           limits=SandboxLimits(), config=SandboxConfig(isolation=Isolation(mode)))
        except UserError as exc:
            return [DoctorCheck(name, False, str(exc))]
    if run.launch_error is not None:
        return [DoctorCheck(name, False, run.launch_error)]
    try:
        seen = json.loads(run.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = run.stderr_tail.strip().splitlines()[-1:] or [f"exit code {run.exit_code}"]
        return [DoctorCheck(name, False, f"the probe failed: {tail[0]}")]
    wrong = []
    if seen["pid"] != 2:
        wrong.append(f"pid {seen['pid']} (no PID namespace)")
    if seen["loopback"] == "reachable":
        wrong.append("127.0.0.1 reachable (no network namespace)")
    if not seen["root_readonly"]:
        wrong.append("root filesystem writable")
    if mode == "uid" and seen["uid"] in (0, os.getuid()):
        wrong.append(f"runs as uid {seen['uid']}")
    if not seen["numpy"]:
        wrong.append("numpy does not import inside")
    if seen["ipc_ns"] == os.readlink("/proc/self/ns/ipc"):
        wrong.append("shares the host's IPC namespace (SysV shared memory)")
    if seen["uts_ns"] == os.readlink("/proc/self/ns/uts"):
        wrong.append("shares the host's UTS namespace")
    detail = (f"uid {seen['uid']}, pid {seen['pid']}, loopback: {seen['loopback']}, "
              f"interfaces {seen['interfaces']}, root fs read-only: {seen['root_readonly']}, numpy: {seen['numpy']}, "
              f"own IPC and UTS namespaces (hostname {seen['hostname']!r})")
    checks = [DoctorCheck(name, not wrong, "; ".join(wrong) + (" -- " if wrong else "") + detail)]
    keyring_closed = seen["keyring"] in ("EPERM", "ENOSYS") and not seen["proc_keys"]
    checks.append(DoctorCheck("kernel keyring", keyring_closed,
                              f"add_key from an agent: {seen['keyring']}; /proc/keys "
                              f"{'visible' if seen['proc_keys'] else 'hidden'}" +
                              ("" if keyring_closed else " (the keyring is shared between agents)") +
                              "; a fresh session keyring per agent, its uid's keys removed when it ends"))
    visible = seen["host_files"]
    checks.append(DoctorCheck("minimal root", not visible,
                              f"the host's {', '.join(visible)} visible to agents (read-only)" if visible else
                              "agents see only the runtime, the Ludus source and their submission"))
    return checks


def _cgroup_checks() -> list[DoctorCheck]:
    from ludus.arena.sandbox import cgroups
    from ludus.arena.sandbox.limits import SandboxLimits

    have, limits = cgroups.support(), SandboxLimits()
    return [
        DoctorCheck(f"cgroup memory ({have.version})", have.memory_ok,
                    have.memory or f"memory cap per agent in the kernel, shared memory counted "
                                   f"({limits.rss_mb} MiB + tmpfs by default)"),
        DoctorCheck(f"cgroup cpu ({have.version})", have.cpu_ok,
                    have.cpu or f"CPU quota per agent ({limits.cpu_cores:g} core by default): parallel matches keep "
                                f"their move time"),
        DoctorCheck("cgroup nesting", have.nested,
                    have.nesting or f"agent groups under the arena's own ({', '.join(have.parents)}): a limit on the "
                                    f"arena covers its agents"),
    ]


def doctor() -> DoctorReport:
    """Check every isolation feature the sandbox uses, by probing the real sandbox."""
    from ludus.arena.sandbox.isolation import Isolation, SandboxConfig, resolve_isolation, userns_allowed

    is_root = os.geteuid() == 0
    checks = [DoctorCheck("root", is_root, "agents get their own uids" if is_root
                          else "not root: agents share your uid (mode 'userns') or run unisolated ('none')")]
    if not is_root:
        allowed = userns_allowed()
        checks.append(DoctorCheck("user namespaces", allowed, "unprivileged user namespaces allowed" if allowed
                                  else "disabled by sysctl (user.max_user_namespaces, "
                                       "kernel.unprivileged_userns_clone or AppArmor)"))
    checks += [_rlimit_check(), _proc_check(), *_cgroup_checks()]
    mode = resolve_isolation(SandboxConfig()).value
    if mode != Isolation.NONE.value:
        checks += _probe(mode)
    else:
        checks.append(DoctorCheck("isolation", False, "agents would run without namespaces: run as root or "
                                                      "enable user namespaces"))
    return DoctorReport(is_root, platform.release(), mode, tuple(checks))


def format_doctor(report: DoctorReport) -> str:
    """The report as text for people."""
    lines = [f"Ludus arena sandbox doctor (kernel {report.kernel}, "
             f"{'root' if report.is_root else 'uid ' + str(os.geteuid())})"]
    width = max(len(c.name) for c in report.checks)
    for check in report.checks:
        lines.append(f"  [{'ok' if check.ok else '!!'}] {check.name.ljust(width)}  {check.detail}")
    verdict = "agents are isolated" if report.isolated else "agents are NOT fully isolated"
    lines.append(f"isolation mode: {report.isolation} ({verdict})")
    return "\n".join(lines)
