"""The launcher that puts one agent into its namespaces (run by arena/sandbox/process.py, never imported).

Run as ``python -I -S sandbox_init.py CONFIG_FD``: the JSON config waits in that pipe, not in argv,
which every process of the namespace could read from /proc/1/cmdline. Standard library only, so it
starts in a few milliseconds and does not depend on the project being importable. Three processes
result:

    warden (host PID namespace; root, or the user in user-namespace mode)
      unshare(2): new mount, network, PID, IPC and UTS namespaces (+ a user namespace when not root)
      `-- init (PID 1 of the new PID namespace; still privileged)
            makes every mount private, lays out a minimal root on a fresh tmpfs (the runtime
            and the agent's own directories bound in, private tmpfs for /tmp and friends, a
            fresh /proc), pivot_root()s into it and makes it read-only,
            `-- agent (rlimits, a fresh session keyring, own unprivileged uid, no_new_privs, no
                keyring syscalls (seccomp), then execve)

When the agent exits, init exits with its status, and the kernel kills every other process of
the PID namespace (double-forked daemons included). init dies with the warden (PR_SET_PDEATHSIG),
and the warden exits when the arena closes the lifeline pipe (or dies), so nothing outlives
the arena. The network namespace has no interface up, not even loopback.

The config comes from `ludus.arena.sandbox.process.SandboxProcess.launch`; this file trusts it (the arena wrote it).
The status pipe tells the arena how launching went: it reaches EOF empty when execve succeeded
(it is close-on-exec), or carries ``E<message>`` (the sandbox could not be set up: the arena's
problem) or ``X<message>`` (the agent's program could not be executed: the agent's problem).
"""

import ctypes
import errno
import json
import os
import resource
import select
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: load a 32-bit word of struct seccomp_data
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K
KEYCTL_JOIN_SESSION_KEYRING = 1
X32_SYSCALL_BIT = 0x40000000
# The kernel keyring syscalls (add_key, request_key, keyctl) of every ABI a process of this machine
# can call, as (AUDIT_ARCH_* of <linux/audit.h>, numbers): a filter that checked only the native
# numbers would be bypassed through the compat ABI (int 0x80 on x86_64 reaches keyctl as 288).
_KEYRING_SYSCALLS = {
    "x86_64": ((0xC000003E, (248, 249, 250) + tuple(X32_SYSCALL_BIT | n for n in (248, 249, 250))),
               (0x40000003, (286, 287, 288))),
    "aarch64": ((0xC00000B7, (217, 218, 219)), (0x40000028, (309, 310, 311))),
    "riscv64": ((0xC00000F3, (217, 218, 219)), (0x400000F3, (217, 218, 219))),
}
_NATIVE_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219}
# statvfs f_flag bits -> mount flags that a read-only remount must keep (in a user namespace the
# kernel refuses to drop "locked" flags such as nosuid or relatime of a mount it did not create).
_KEEP_FLAGS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
               (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


class SetupError(Exception):
    """The sandbox could not be laid out (reported as ``E`` on the status pipe)."""


def _check(rc, what):
    if rc != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)}")


def _encode(text):
    return None if text is None else os.fsencode(text)


def _mount(source, target, fstype, flags, data, what):
    _check(_libc.mount(_encode(source), _encode(target), _encode(fstype), flags, _encode(data)), what)


def _report(status_fd, tag, message):
    try:
        os.write(status_fd, (tag + message.replace("\n", " ")[:2000]).encode("utf-8", "replace"))
    except OSError:
        pass


def _remount_readonly(target):
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    current = os.statvfs(target).f_flag
    for st_bit, ms_bit in _KEEP_FLAGS:
        if current & st_bit:
            flags |= ms_bit
    _mount(None, target, None, flags, None, f"remount {target} read-only")


_ROOT = ""
"""The new root while it is being laid out (its path in the old root); '' after pivot_root."""


def _at(path):
    return _ROOT + path


def _pivot_root(new_root):
    """Make `new_root` the root of this mount namespace and let go of the old one."""
    number = {"x86_64": 155, "aarch64": 41, "riscv64": 41}.get(os.uname().machine)
    if number is None:
        raise SetupError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    os.chdir(new_root)
    os.mkdir(".old", 0o700)
    _check(_libc.syscall(number, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "detach the old root")
    os.rmdir("/.old")


def _lay_out_filesystem(mounts):
    """Apply the mount plan (ludus.arena.sandbox.isolation.mount_plan), in order, inside the new mount namespace."""
    global _ROOT
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None, "make mounts private")
    # Bind sources are opened before anything is mounted (the descriptors still reach them).
    sources = {}
    for op in mounts:
        if op["op"] == "bind" and op["source"] not in sources:
            try:
                sources[op["source"]] = os.open(op["source"], os.O_PATH | os.O_CLOEXEC)
            except OSError as exc:
                raise SetupError(f"cannot open {op['source']}: {exc.strerror}") from None
    for op in mounts:
        kind, target = op["op"], op.get("target")
        if kind == "new_root":
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, op["options"], "tmpfs for the new root")
            _ROOT = target
        elif kind == "symlink":
            os.symlink(op["link"], _at(target))
        elif kind == "pivot":
            _pivot_root(_ROOT)
            _ROOT = ""
            _remount_readonly("/")
        elif kind == "proc":
            os.makedirs(_at(target), mode=0o755, exist_ok=True)
            _mount("proc", _at(target), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mount /proc")
        elif kind == "sysfs":  # a fresh sysfs shows this network namespace's devices only
            os.makedirs(_at(target), mode=0o755, exist_ok=True)
            if _libc.mount(b"sysfs", os.fsencode(_at(target)), b"sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                           None) != 0:
                if not op["optional"]:
                    _check(-1, "mount /sys")
                os.rmdir(_at(target))
        elif kind in ("hide_file", "hide_dir"):
            if not os.path.lexists(_at(target)):  # not in the agent's view at all
                continue
            if kind == "hide_file":
                _mount("/dev/null", _at(target), None, MS_BIND, None, f"hide {target}")
                _remount_readonly(_at(target))
            else:
                _mount("tmpfs", _at(target), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       "size=4k,mode=000", f"hide {target}")
        elif kind == "tmpfs":
            _make_mount_point(_at(target), directory=True)
            _mount("tmpfs", _at(target), "tmpfs", MS_NOSUID | MS_NODEV, op["options"], f"tmpfs on {target}")
        elif kind == "bind":
            fd = sources[op["source"]]
            _make_mount_point(_at(target), directory=os.path.isdir(f"/proc/self/fd/{fd}"))
            _mount(f"/proc/self/fd/{fd}", _at(target), None, MS_BIND | MS_REC, None,
                   f"bind {op['source']} on {target}")
            if op.get("readonly"):
                _remount_readonly(_at(target))
        else:
            raise SetupError(f"unknown mount operation {kind!r}")
    for fd in sources.values():
        os.close(fd)


def _make_mount_point(path, directory):
    try:
        if directory:
            os.makedirs(path, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            if not os.path.lexists(path):
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    except OSError as exc:
        raise SetupError(f"cannot create mount point {path}: {exc.strerror}") from None


def _exec_agent(config, status_fd):
    """In the agent's process: drop everything, then execve (never returns)."""
    try:
        os.setsid()
        for res, soft, hard in config["rlimits"]:
            resource.setrlimit(res, (soft, hard))
        machine = os.uname().machine
        _join_fresh_session_keyring(machine)
        if config["mode"] == "uid":
            os.setgroups([])
            os.setresgid(config["gid"], config["gid"], config["gid"])
            os.setresuid(config["uid"], config["uid"], config["uid"])
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
        _deny_keyring_syscalls(machine)  # after no_new_privs, which lets an unprivileged process install it
        # set after the uid change: changing credentials clears the parent-death signal
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(pdeathsig)")
        os.umask(0o077)
        os.chdir(config["cwd"])
        for sig in (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.set_inheritable(status_fd, False)
    except (OSError, SetupError) as exc:
        _report(status_fd, "E", f"cannot drop privileges: {exc}")
        os._exit(125)
    argv = config["argv"]
    try:
        os.execve(argv[0], argv, config["env"])
    except OSError as exc:
        _report(status_fd, "X", f"cannot execute {argv[0]}: {exc.strerror}")
    os._exit(126)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def keyring_filter(machine):
    """The seccomp program (classic BPF over struct seccomp_data: nr at offset 0, arch at 4) that
    fails every keyring syscall with EPERM, allows everything else, and kills a process calling
    through an ABI it does not know."""
    abis = _KEYRING_SYSCALLS.get(machine)
    if abis is None:
        raise SetupError(f"no keyring syscall table for {machine}: cannot isolate the kernel keyring")
    prog = [(BPF_LD_W_ABS, 0, 0, 4)]
    for arch, numbers in abis:
        n = len(numbers)
        prog.append((BPF_JEQ_K, 0, n + 3, arch))  # another ABI: on to its block
        prog.append((BPF_LD_W_ABS, 0, 0, 0))
        prog += [(BPF_JEQ_K, n - i, 0, nr) for i, nr in enumerate(numbers)]  # a match jumps to EPERM
        prog.append((BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
        prog.append((BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | 1))  # EPERM
    prog.append((BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS))
    return prog


def _join_fresh_session_keyring(machine):
    """Leave the arena's session keyring for an empty anonymous one of our own (keyctl(2),
    KEYCTL_JOIN_SESSION_KEYRING with no name): the session keyring is inherited across fork, execve
    and setuid, the kernel searches it when it looks keys up on a process's behalf, and possessing
    it grants its possessor permissions. Called before the uid change, so the new keyring is not
    charged to the agent's uid and is gone with the agent's last process."""
    number = _NATIVE_KEYCTL.get(machine)
    if number is None:
        raise SetupError(f"no keyring syscall table for {machine}: cannot isolate the kernel keyring")
    if _libc.syscall(ctypes.c_long(number), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), None) < 0 \
            and ctypes.get_errno() != errno.ENOSYS:  # ENOSYS: a kernel without keys, so none to inherit
        _check(-1, "keyctl(join a fresh session keyring)")


def _deny_keyring_syscalls(machine):
    """The kernel keyring is not namespaced (keyrings(7), user-keyring(7)): the per-uid user and
    persistent keyrings, and every key its owner makes world-readable, are reachable by serial from
    any process whatever its namespaces, and outlive it. So agents do not get the keyring syscalls
    at all (Docker's default seccomp profile refuses them for the same reason)."""
    prog = keyring_filter(machine)
    filters = (_SockFilter * len(prog))(*(_SockFilter(*ins) for ins in prog))
    fprog = _SockFprog(len(prog), filters)
    _check(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0),
           "prctl(seccomp filter of the keyring syscalls)")


def _exit_like(status):
    """Exit the way a child with wait status `status` did (code, or 128+signal)."""
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _detach_stdio():
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _run_init(config, status_fd, warden_alive_fd):
    """PID 1 of the new namespaces."""
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(pdeathsig)")
        if select.select([warden_alive_fd], [], [], 0)[0]:  # the warden died before prctl took hold
            os._exit(1)
        _check(_libc.sethostname(b"ludus-agent", len(b"ludus-agent")), "sethostname")
        _lay_out_filesystem(config["mounts"])
    except (OSError, SetupError) as exc:
        _report(status_fd, "E", str(exc))
        os._exit(125)
    agent = os.fork()
    if agent == 0:
        _exec_agent(config, status_fd)
    os.close(status_fd)
    _detach_stdio()  # so the arena sees EOF on stdout as soon as the agent closes it
    while True:  # reap orphans re-parented to us; leave (killing the namespace) when the agent does
        pid, status = os.wait()
        if pid == agent:
            _exit_like(status)


def _write_id_map(path, inner, outer):
    with open(path, "w") as f:
        f.write(f"{inner} {outer} 1\n")


def main():
    config_fd = int(sys.argv[1])
    with os.fdopen(config_fd, "rb") as f:
        config = json.loads(f.read())
    status_fd, lifeline_fd = config["status_fd"], config["lifeline_fd"]
    try:
        # Join the agent's control groups (arena/sandbox/cgroups.py) first: every process forked from
        # here on is born inside them and charged to them.
        for procs in config.get("cgroup_procs", ()):
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        # IPC: SysV shared memory, semaphores and message queues (and POSIX mqueues) made by the
        # agent live in a namespace of its own, invisible to other agents, and are destroyed with
        # it when the agent's last process ends. UTS: its own hostname.
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if config["mode"] == "userns":
            flags |= CLONE_NEWUSER
        _check(_libc.unshare(flags), "unshare(mount, net, pid, ipc, uts" + (", user)" if flags & CLONE_NEWUSER
                                                                           else ")"))
        if config["mode"] == "userns":
            # Identity map of our own ids: the agent keeps a non-zero uid inside, so execve drops
            # the capabilities the namespace's creator (init) needs for mounting.
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            _write_id_map("/proc/self/uid_map", config["host_uid"], config["host_uid"])
            _write_id_map("/proc/self/gid_map", config["host_gid"], config["host_gid"])
    except (OSError, SetupError) as exc:
        _report(status_fd, "E", str(exc))
        os._exit(125)
    alive_r, alive_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(alive_w)
        os.close(lifeline_fd)
        _run_init(config, status_fd, alive_r)
    os.close(alive_r)
    os.close(status_fd)
    _detach_stdio()
    # Wait for init, or for the arena to close the lifeline (then exit: init follows by pdeathsig).
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            _exit_like(status)
        ready = select.select([lifeline_fd, wake_r], [], [])[0]
        if lifeline_fd in ready:
            os._exit(137)
        if wake_r in ready:
            os.read(wake_r, 512)


if __name__ == "__main__":
    main()
