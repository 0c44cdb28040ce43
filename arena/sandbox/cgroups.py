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
then counts shared pages too: `ludus.arena.sandbox.isolation.memory_bytes`). `ludus arena doctor` prints `probe()`.

The launcher (arena/sandbox/sandbox_init.py) writes its own pid into each group's ``cgroup.procs`` before it
forks, so every process of the agent is born inside the groups.

Agent groups are nested under the arena's own group (``<arena's group>/ludus/<agent>``), so a limit
an operator puts on the arena (a systemd unit's ``MemoryMax``, a container's cap) covers its agents
too. In v1 any group may have children. In v2 a group with processes cannot hand controllers to
children (the "no internal processes" rule, cgroup-v2.rst), so the arena nests only where its group
is the root or holds nothing but the arena itself, which then moves into a leaf of its own
(``<group>/ludus-arena``), as a systemd service with ``Delegate=yes`` would. Where it cannot, groups
go under the hierarchy's root as before and `probe()` says why (`ludus arena doctor` prints it).
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
    nesting: str | None = None
    """None: agent groups nest under the arena's own groups; else why they go under the root."""
    parents: tuple[str, ...] = ()
    """Where agent groups are made (``.../ludus``), one per hierarchy used."""

    @property
    def memory_ok(self) -> bool:
        return self.memory is None

    @property
    def cpu_ok(self) -> bool:
        return self.cpu is None

    @property
    def nested(self) -> bool:
        return self.nesting is None


@dataclass(frozen=True)
class _Layout:
    version: str
    memory_dir: Path | None
    """The hierarchy holding the memory controller (v2: the one unified hierarchy)."""
    cpu_dir: Path | None
    memory_base: Path | None = None
    """Where ``ludus/`` goes in the memory hierarchy: the arena's own group, or the root."""
    cpu_base: Path | None = None
    nesting: str | None = None


def _v2_controllers(root: Path) -> set[str]:
    try:
        return set((root / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def own_groups(text: str | None = None) -> dict[str, str]:
    """This process's group per hierarchy, from /proc/self/cgroup (cgroups(7)): ``"unified"`` for
    the v2 line (``0::/path``), and each v1 controller name (``4:memory:/path``) -> its path."""
    if text is None:
        try:
            text = Path("/proc/self/cgroup").read_text()
        except OSError:
            return {}
    groups = {}
    for line in text.splitlines():
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and controllers == "":
            groups["unified"] = path
        for controller in filter(None, controllers.split(",")):
            groups[controller] = path
    return groups


def _inside(hierarchy: Path, path: str | None) -> Path:
    """The directory of group `path` ("/a/b") in `hierarchy`; the root when unknown or missing."""
    if not path or path == "/":
        return hierarchy
    directory = hierarchy / path.lstrip("/")
    return directory if directory.is_dir() else hierarchy


def _delegated(group: Path) -> bool:
    """A v2 group whose children get the memory and cpu controllers."""
    try:
        return set((group / "cgroup.subtree_control").read_text().split()) >= {"memory", "cpu"}
    except OSError:
        return False


def _v2_base(root: Path, own: str | None) -> tuple[Path, str | None]:
    """Where the arena can nest agent groups in a v2 hierarchy, and why not if it cannot."""
    group = _inside(root, own)
    if group == root:
        return root, None
    if group.name == f"{GROUP_PREFIX}-arena" and _delegated(group.parent):  # an arena moved here already
        return group.parent, None
    if _delegated(group):
        return group, None
    if not _v2_controllers(group) >= {"memory", "cpu"}:
        return root, (f"the arena's group {own} is not given the memory and cpu controllers (delegate them, e.g. "
                      f"systemd's Delegate=yes); agent groups go under {root}")
    me = {os.getpid()}
    try:
        members = {int(p) for p in (group / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        members = set()
    if members - me:
        return root, (f"the arena's group {own} holds {len(members - me)} other process(es), and a v2 group with "
                      f"processes cannot give controllers to children: run the arena in a group of its own "
                      f"(e.g. systemd-run --scope -p Delegate=yes); agent groups go under {root}")
    # The group holds only the arena: move it into a leaf, then the group may delegate.
    leaf = group / f"{GROUP_PREFIX}-arena"
    try:
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        (group / "cgroup.subtree_control").write_text("+memory +cpu")
    except OSError as exc:
        return root, f"cannot delegate the arena's group {own}: {exc.strerror}; agent groups go under {root}"
    return group, None


_LAYOUT: _Layout | None = None


def _layout() -> _Layout:
    """`_find_layout()`, once per process (in v2 it may move the arena into a leaf group)."""
    global _LAYOUT
    if _LAYOUT is None:
        _LAYOUT = _find_layout()
    return _LAYOUT


def _find_layout() -> _Layout:
    """Where memory and cpu groups go on this machine (v2 first, then v1), nested where possible."""
    own = own_groups()
    if _v2_controllers(CGROUP_ROOT) >= {"memory", "cpu"}:
        base, why = _v2_base(CGROUP_ROOT, own.get("unified"))
        return _Layout("v2", CGROUP_ROOT, CGROUP_ROOT, base, base, why)
    memory = CGROUP_ROOT / "memory"
    cpu = CGROUP_ROOT / "cpu"
    has_memory = (memory / "memory.limit_in_bytes").exists()
    has_cpu = (cpu / "cpu.cfs_quota_us").exists()
    if not (has_memory or has_cpu):
        return _Layout("none", None, None)
    # v1: any group may have children. A memory parent's limit covers them only with hierarchical
    # accounting (memory.use_hierarchy, always on since Linux 5.x); where it is off, nesting gains
    # nothing and the groups stay at the root as before.
    memory_base = _inside(memory, own.get("memory")) if has_memory else None
    cpu_base = _inside(cpu, own.get("cpu")) if has_cpu else None
    why = None
    if memory_base is not None and memory_base != memory:
        try:
            hierarchical = (memory_base / "memory.use_hierarchy").read_text().strip() != "0"
        except OSError:
            hierarchical = True  # the file is gone where hierarchy is the only mode
        if not hierarchical:
            why = f"memory.use_hierarchy is 0 in the arena's group {own.get('memory')}; agent groups go under {memory}"
            memory_base = memory
    return _Layout("v1", memory if has_memory else None, cpu if has_cpu else None, memory_base, cpu_base, why)


def _parent(base: Path, version: str) -> Path:
    parent = base / GROUP_PREFIX
    parent.mkdir(exist_ok=True)
    if version == "v2":  # children of ludus/ may use both controllers
        (base / "cgroup.subtree_control").write_text("+memory +cpu")
        (parent / "cgroup.subtree_control").write_text("+memory +cpu")
    return parent


def probe() -> CgroupSupport:
    """Try to make (and remove) one group per controller; say what works and where groups nest."""
    layout = _layout()
    if layout.version == "none":
        why = f"no cgroup memory/cpu controller under {CGROUP_ROOT}"
        return CgroupSupport(why, why, "none", why)
    if os.geteuid() != 0:
        why = "making control groups needs root"
        return CgroupSupport(why, why, layout.version, why)
    results = {}
    parents = []
    for kind, base in (("memory", layout.memory_base), ("cpu", layout.cpu_base)):
        if base is None:
            results[kind] = f"no {kind} controller"
            continue
        group = None
        try:
            parent = _parent(base, layout.version)
            group = parent / f"probe-{os.getpid()}"
            group.mkdir(exist_ok=True)
            results[kind] = None
            if str(parent) not in parents:
                parents.append(str(parent))
        except OSError as exc:
            results[kind] = f"cannot make a {kind} group under {base}: {exc.strerror}"
        finally:
            if group is not None:
                try:
                    group.rmdir()
                except OSError:
                    pass
    return CgroupSupport(results["memory"], results["cpu"], layout.version, layout.nesting, tuple(parents))


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
            if have.memory_ok and layout.memory_base is not None:
                self.memory_dir = self._make(layout.memory_base, name)
                if self.version == "v2":
                    (self.memory_dir / "memory.max").write_text(str(memory_bytes))
                    if (self.memory_dir / "memory.swap.max").exists():  # no way around the cap through swap
                        (self.memory_dir / "memory.swap.max").write_text("0")
                else:
                    (self.memory_dir / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    swap = self.memory_dir / "memory.memsw.limit_in_bytes"
                    if swap.exists():  # memory + swap: no way around the cap through swap
                        swap.write_text(str(memory_bytes))
            if have.cpu_ok and layout.cpu_base is not None and cpu_cores > 0:
                self.cpu_dir = (self.memory_dir if self.version == "v2" and self.memory_dir is not None
                                else self._make(layout.cpu_base, name))
                quota = max(1000, int(cpu_cores * CPU_PERIOD_US))
                if self.version == "v2":
                    (self.cpu_dir / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
                else:
                    (self.cpu_dir / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                    (self.cpu_dir / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError:
            self.remove()
            raise

    def _make(self, base: Path, name: str) -> Path:
        group = _parent(base, self.version) / name
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
    other arena process runs them; a group still holding processes is left alone. Looks under the
    arena's own groups and under each hierarchy's root (where groups went before they nested, and
    where they go when nesting is not possible). Returns how many."""
    removed = 0
    layout = _layout()
    for base in {layout.memory_dir, layout.cpu_dir, layout.memory_base, layout.cpu_base} - {None}:
        parent = base / GROUP_PREFIX
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


__all__ = ["AgentCgroup", "CgroupSupport", "own_groups", "probe", "remove_stale_groups", "support"]
