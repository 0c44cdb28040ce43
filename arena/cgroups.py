"""Per-agent control groups: a kernel-enforced memory cap that counts shared memory, and a CPU quota.

Polling /proc cannot see everything an agent holds: a shared anonymous mapping (``mmap(-1, n)``
with MAP_SHARED) or a tmpfs file is "shared" memory, not anonymous, and `RLIMIT_DATA` does not
cover it. A memory cgroup charges every page the agent's processes fault in, shared or not, and
the kernel kills inside the group when it is full. A CPU quota (CFS bandwidth control) bounds what
an agent's whole process tree can take, however many children spin, so an honest agent in a
parallel match keeps its move time.

Both cgroup versions are handled, because machines differ: the unified v2 hierarchy
(``memory.max``, ``cpu.max``) where its controllers are enabled, else the v1 ``memory`` and ``cpu``
hierarchies (``memory.limit_in_bytes``, ``cpu.cfs_quota_us``). Only root can make groups and move
processes into them; elsewhere `probe()` says why not and the sandbox falls back to polling (which
then counts shared pages too: `arena.isolation.memory_bytes`). `ludus arena doctor` prints `probe()`.

The launcher (arena/sandbox_init.py) writes its own pid into each group's ``cgroup.procs`` before it
forks, so every process of the agent is born inside the groups.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_PREFIX = "ludus"
"""Parent group under each hierarchy: ``<hierarchy>/ludus/<agent>``."""
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupSupport:
    """What this machine allows (`probe`): each field is None when it works, else why not."""

    memory: str | None
    cpu: str | None
    version: str
    """'v2', 'v1' or 'none'."""

    @property
    def memory_ok(self) -> bool:
        return self.memory is None

    @property
    def cpu_ok(self) -> bool:
        return self.cpu is None


@dataclass(frozen=True)
class _Layout:
    version: str
    memory_dir: Path | None
    cpu_dir: Path | None


def _v2_controllers(root: Path) -> set[str]:
    try:
        return set((root / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def _layout() -> _Layout:
    """Where memory and cpu groups go on this machine (v2 first, then v1)."""
    if _v2_controllers(CGROUP_ROOT) >= {"memory", "cpu"}:
        return _Layout("v2", CGROUP_ROOT, CGROUP_ROOT)
    memory = CGROUP_ROOT / "memory"
    cpu = CGROUP_ROOT / "cpu"
    has_memory = (memory / "memory.limit_in_bytes").exists()
    has_cpu = (cpu / "cpu.cfs_quota_us").exists()
    if has_memory or has_cpu:
        return _Layout("v1", memory if has_memory else None, cpu if has_cpu else None)
    return _Layout("none", None, None)


def _parent(hierarchy: Path, version: str) -> Path:
    parent = hierarchy / GROUP_PREFIX
    parent.mkdir(exist_ok=True)
    if version == "v2":  # children of ludus/ may use both controllers
        (hierarchy / "cgroup.subtree_control").write_text("+memory +cpu")
        (parent / "cgroup.subtree_control").write_text("+memory +cpu")
    return parent


def probe() -> CgroupSupport:
    """Try to make (and remove) one group per controller; say what works."""
    layout = _layout()
    if layout.version == "none":
        why = f"no cgroup memory/cpu controller under {CGROUP_ROOT}"
        return CgroupSupport(why, why, "none")
    if os.geteuid() != 0:
        why = "making control groups needs root"
        return CgroupSupport(why, why, layout.version)
    results = {}
    for kind, hierarchy in (("memory", layout.memory_dir), ("cpu", layout.cpu_dir)):
        if hierarchy is None:
            results[kind] = f"no {kind} controller"
            continue
        group = None
        try:
            group = _parent(hierarchy, layout.version) / f"probe-{os.getpid()}"
            group.mkdir(exist_ok=True)
            results[kind] = None
        except OSError as exc:
            results[kind] = f"cannot make a {kind} group under {hierarchy}: {exc.strerror}"
        finally:
            if group is not None:
                try:
                    group.rmdir()
                except OSError:
                    pass
    return CgroupSupport(results["memory"], results["cpu"], layout.version)


_SUPPORT: CgroupSupport | None = None


def support() -> CgroupSupport:
    """`probe()`, once per process."""
    global _SUPPORT
    if _SUPPORT is None:
        _SUPPORT = probe()
    return _SUPPORT


class AgentCgroup:
    """The memory and cpu groups of one agent (either may be absent where the machine says no)."""

    def __init__(self, name: str, memory_bytes: int, cpu_cores: float):
        layout = _layout()
        have = support()
        self.version = layout.version
        self.memory_limit = memory_bytes
        self.dirs: list[Path] = []
        self.memory_dir: Path | None = None
        self.cpu_dir: Path | None = None
        try:
            if have.memory_ok and layout.memory_dir is not None:
                self.memory_dir = self._make(layout.memory_dir, name)
                if self.version == "v2":
                    (self.memory_dir / "memory.max").write_text(str(memory_bytes))
                    if (self.memory_dir / "memory.swap.max").exists():  # no way around the cap through swap
                        (self.memory_dir / "memory.swap.max").write_text("0")
                else:
                    (self.memory_dir / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    swap = self.memory_dir / "memory.memsw.limit_in_bytes"
                    if swap.exists():  # memory + swap: no way around the cap through swap
                        swap.write_text(str(memory_bytes))
            if have.cpu_ok and layout.cpu_dir is not None and cpu_cores > 0:
                self.cpu_dir = (self.memory_dir if self.version == "v2" and self.memory_dir is not None
                                else self._make(layout.cpu_dir, name))
                quota = max(1000, int(cpu_cores * CPU_PERIOD_US))
                if self.version == "v2":
                    (self.cpu_dir / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
                else:
                    (self.cpu_dir / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                    (self.cpu_dir / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError:
            self.remove()
            raise

    def _make(self, hierarchy: Path, name: str) -> Path:
        group = _parent(hierarchy, self.version) / name
        if group.exists():  # left by an arena killed with -9: its processes are gone or get killed
            _remove_group(group)
        group.mkdir()
        self.dirs.append(group)
        return group

    @property
    def procs_files(self) -> list[str]:
        """Where the launcher writes its pid (once per distinct group)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def memory_used(self) -> int | None:
        """Bytes charged to the group now (anonymous, shared and page cache), or None."""
        if self.memory_dir is None:
            return None
        name = "memory.current" if self.version == "v2" else "memory.usage_in_bytes"
        try:
            return int((self.memory_dir / name).read_text())
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        """How many processes the kernel killed in the group for memory."""
        if self.memory_dir is None:
            return 0
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            for line in (self.memory_dir / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        """Kill whatever is left in the groups and remove them."""
        for group in self.dirs:
            _remove_group(group)
        self.dirs = []


def _remove_group(group: Path) -> None:
    deadline = time.monotonic() + 5.0
    while True:
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


def remove_stale_groups() -> int:
    """Remove the groups of agents whose arena died (kill -9): none of them can be in use when no
    other arena process runs them; a group still holding processes is left alone. Returns how many."""
    removed = 0
    layout = _layout()
    for hierarchy in {layout.memory_dir, layout.cpu_dir} - {None}:
        parent = hierarchy / GROUP_PREFIX
        if not parent.is_dir():
            continue
        for group in parent.iterdir():
            if not group.is_dir():
                continue
            try:
                busy = (group / "cgroup.procs").read_text().strip()
            except OSError:
                continue
            if not busy:
                try:
                    group.rmdir()
                    removed += 1
                except OSError:
                    pass
    return removed


__all__ = ["AgentCgroup", "CgroupSupport", "probe", "remove_stale_groups", "support"]
