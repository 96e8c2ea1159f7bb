"""Job confinement with cgroups: one cgroup per job epoch limits memory, CPUs, pids and GPUs.

Layout: `<base>/<parent>/<node>-<hash of the state dir>/job-<id>-<epoch>`, where `<base>` is
the agent's own cgroup in each cgroup-v1 controller (so a containerised or systemd-run
agent nests its jobs in what it was given), or the root of the unified hierarchy with
cgroup v2. The state-dir hash keeps agents that share a machine (tests, `phalanx up`) and
even a node name apart, and stays the same across restarts of one agent. Every job cgroup's
directories are recorded in its launch dir (`cgroup`) before a process enters it, so a
restarted agent and the lease guard find and kill what a SIGKILLed agent left behind.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_FS = Path("/sys/fs/cgroup")
RECORD_NAME = "cgroup"  # in each launch dir: the job cgroup's directories, one per line
DEFAULT_PARENT = "phalanx"
DEFAULT_PIDS_MAX = 8192  # per job and node: generous for dataloader workers and threads
V1_REQUIRED = ("memory", "cpuset", "pids", "devices")
V1_OPTIONAL = ("freezer",)  # freezes a job while it is killed, so nothing forks meanwhile
V2_CONTROLLERS = ("memory", "cpuset", "pids")
KILL_TIMEOUT_S = 5.0

Adopt = Callable[[int], None]  # moves a just-started process into the cgroup (v2)


@dataclass(frozen=True)
class Limits:
    """What one job epoch may use on this node."""

    mem_mb: int | None = None  # memory (RAM; no swap on top), MiB; None: unlimited
    cpus: tuple[int, ...] | None = None  # CPUs it may run on; None: the agent's
    pids_max: int | None = None  # processes and threads; None: unlimited
    deny_devices: tuple[tuple[int, int], ...] = ()  # (major, minor) of GPUs not given


class JobCgroup:
    """One job epoch's cgroup: a directory per v1 controller, or one v2 directory."""

    def __init__(self, dirs: Sequence[Path], version: int) -> None:
        self.dirs = tuple(dirs)
        self.version = version

    def __repr__(self) -> str:
        return f"JobCgroup({self.dirs[0].name}, v{self.version})"

    def _dir(self, controller: str) -> Path | None:
        if self.version == 2:
            return self.dirs[0]
        return next((d for d in self.dirs if _controller_of(d) == controller), None)

    @contextlib.contextmanager
    def entered(self) -> Iterator[Adopt]:
        """Start processes into this cgroup: `with cg.entered() as adopt: p = Popen(…);
        adopt(p.pid)`. With v1, the calling thread itself moves in for the fork (a child
        is born in its parent thread's cgroups; v1 moves single threads), so not even the
        first instruction of the job runs outside; it moves back afterwards. v2 moves only
        whole processes: the child is moved right after it started (`adopt`)."""
        if self.version == 2:
            yield self._adopt_v2
            return
        tid = threading.get_native_id()
        home = _thread_cgroups(tid)
        try:
            for d in self.dirs:
                (d / "tasks").write_text(str(tid))
            yield lambda pid: None
        finally:
            for d in self.dirs:
                back = home.get(_controller_of(d))
                if back is not None:
                    with contextlib.suppress(OSError):
                        (back / "tasks").write_text(str(tid))

    def _adopt_v2(self, pid: int) -> None:
        with contextlib.suppress(OSError):  # already gone: nothing to confine
            (self.dirs[0] / "cgroup.procs").write_text(str(pid))

    def pids(self) -> set[int]:
        """Every process in the cgroup now (never the agent itself)."""
        return members(self.dirs)

    def cpus(self) -> tuple[int, ...]:
        """The CPUs its processes may run on (its cpuset); () when unreadable."""
        d = self._dir("cpuset")
        with contextlib.suppress(OSError, ValueError):
            if d is not None:
                return _parse_cpus((d / "cpuset.cpus").read_text())
        return ()

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a process of this job for its limit."""
        d = self._dir("memory")
        if d is None:
            return False
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        counters = _counters(d / name)
        if "oom_kill" in counters:
            return counters["oom_kill"] > 0
        try:  # old v1 kernels: the limit was hit (a SIGKILLed rank then means the OOM killer)
            return int((d / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def kill(self, timeout_s: float = KILL_TIMEOUT_S) -> bool:
        """SIGKILL every process in the cgroup, again and again until it is empty (what
        forks meanwhile dies too). True once empty."""
        return kill_all(self.dirs, timeout_s)

    def remove(self, timeout_s: float = KILL_TIMEOUT_S) -> bool:
        """Kill everything in it, then delete it. True once it is gone."""
        if not self.kill(timeout_s):
            return False
        return remove_dirs(self.dirs)


@dataclass
class Confinement:
    """This node's job cgroups: where they go, what they get. `describe` is what the agent
    logs at start and reports to the head (`phalanx nodes`): `cgroup-v1`, `cgroup-v2 (…)`,
    or `none: <reason>` — then `create()` returns None and jobs run unconfined."""

    describe: str
    version: int = 0  # 0: no confinement
    node_dirs: tuple[Path, ...] = ()  # the agent's parent cgroup(s), one per controller
    pids_max: int | None = DEFAULT_PIDS_MAX
    devices: bool = False  # whether device access can be limited
    cpus: tuple[int, ...] = ()  # the CPUs jobs are placed on
    _cpus_used: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def enabled(self) -> bool:
        return self.version != 0

    def create(self, name: str, limits: Limits) -> JobCgroup | None:
        """Create (or recreate, emptied) the job cgroup `name` with `limits`."""
        if not self.enabled:
            return None
        dirs = [d / name for d in self.node_dirs]
        leftover = JobCgroup([d for d in dirs if d.exists()], self.version)
        if leftover.dirs and not leftover.remove():
            raise OSError(errno.EBUSY, f"cgroup {name} still has processes after SIGKILL")
        for d in dirs:
            _ensure(d.parent)  # a dead agent's guard may have pruned it meanwhile
            d.mkdir()
            if self.version == 1 and _controller_of(d) == "cpuset":
                _inherit_cpuset(d)
        cg = JobCgroup(dirs, self.version)
        try:
            _apply(cg, limits)
        except OSError:
            remove_dirs(dirs)
            raise
        return cg

    def choose_cpus(self, key: str, wanted: int | None) -> tuple[tuple[int, ...] | None, str]:
        """CPUs for a job asking for `wanted` (cpus-per-task × its tasks here): free ones
        first, shared ones when too few are free, all when the node has fewer. Returns
        (cpus or None for "no limit", a note when it got other than it asked)."""
        if not self.enabled or wanted is None or not self.cpus:
            return None, ""
        with self._lock:
            used = {c for cpus in self._cpus_used.values() for c in cpus}
            free = [c for c in self.cpus if c not in used]
            note = ""
            if wanted >= len(self.cpus):
                chosen = self.cpus
                if wanted > len(self.cpus):
                    note = f"asks for {wanted} CPUs, this node has {len(self.cpus)}: gets all"
            elif len(free) >= wanted:
                chosen = tuple(free[:wanted])
            else:
                shared = [c for c in self.cpus if c in used][: wanted - len(free)]
                chosen = tuple(sorted(free + shared))
                note = f"only {len(free)} of its {wanted} CPUs are free: shares the others"
            self._cpus_used[key] = chosen
            return chosen, note

    def reserve_cpus(self, key: str, cpus: tuple[int, ...]) -> None:
        """Count `cpus` as taken by `key` (an adopted job's cgroup has them already)."""
        if cpus:
            with self._lock:
                self._cpus_used[key] = cpus

    def release_cpus(self, key: str) -> None:
        with self._lock:
            self._cpus_used.pop(key, None)

    def close(self) -> None:
        """Delete the agent's own parent cgroups if no job cgroup is left in them (and the
        shared parent too once no other agent uses it)."""
        if self.enabled and remove_dirs(self.node_dirs, quiet=True):
            remove_dirs([d.parent for d in self.node_dirs], quiet=True)


def setup(
    node_name: str,
    state_dir: Path,
    *,
    parent: str = DEFAULT_PARENT,
    pids_max: int | None = DEFAULT_PIDS_MAX,
    enabled: bool = True,
) -> Confinement:
    """Find the cgroup hierarchy and create this agent's parent cgroup in it; what cannot
    be used is said in `describe`, never silently ignored."""
    if not enabled:
        return Confinement("none: disabled (--no-cgroups)")
    if os.geteuid() != 0:
        return Confinement("none: the agent does not run as root")
    parent = _safe(parent)  # one path component, whatever --cgroup-parent says
    tag = f"{_safe(node_name)}-{hashlib.sha256(str(state_dir).encode()).hexdigest()[:8]}"
    root = CGROUP_FS
    try:
        if _fstype(root) == "cgroup2":
            return _setup_v2(root, parent, tag, pids_max)
        return _setup_v1(root, parent, tag, pids_max)
    except OSError as e:
        return Confinement(f"none: cannot create cgroups under {root}: {e.strerror or e}")


def _setup_v1(root: Path, parent: str, tag: str, pids_max: int | None) -> Confinement:
    own = _thread_cgroups(threading.get_native_id(), root)
    missing = [c for c in V1_REQUIRED if c not in own or not (root / c).is_dir()]
    if missing:
        return Confinement(f"none: cgroup v1 controller(s) not mounted: {', '.join(missing)}")
    dirs = []
    for c in (*V1_REQUIRED, *(c for c in V1_OPTIONAL if c in own)):
        d = own[c] / parent / tag
        _ensure(d)
        dirs.append(d)
    cpuset = next(d for d in dirs if _controller_of(d) == "cpuset")
    cpus = _parse_cpus((cpuset / "cpuset.cpus").read_text())
    return Confinement("cgroup-v1", 1, tuple(dirs), pids_max, True, cpus)


def _setup_v2(root: Path, parent: str, tag: str, pids_max: int | None) -> Confinement:
    available = (root / "cgroup.controllers").read_text().split()
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        return Confinement(f"none: cgroup v2 controller(s) not available: {', '.join(missing)}")
    enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
    d = root
    for part in (parent, tag):
        (d / "cgroup.subtree_control").write_text(enable)
        d = d / part
        d.mkdir(exist_ok=True)
    (d / "cgroup.subtree_control").write_text(enable)
    cpus = _parse_cpus((d / "cpuset.cpus.effective").read_text())
    describe = "cgroup-v2 (memory, cpuset, pids; no device control: cgroup v2 needs BPF for it)"
    return Confinement(describe, 2, (d,), pids_max, False, cpus)


def _apply(cg: JobCgroup, limits: Limits) -> None:
    if cg.version == 2:
        d = cg.dirs[0]
        if limits.mem_mb is not None:
            (d / "memory.max").write_text(str(limits.mem_mb * 2**20))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to limit
                (d / "memory.swap.max").write_text("0")
        if limits.cpus is not None:
            (d / "cpuset.cpus").write_text(_format_cpus(limits.cpus))
        (d / "pids.max").write_text("max" if limits.pids_max is None else str(limits.pids_max))
        return
    by = {_controller_of(d): d for d in cg.dirs}
    if limits.mem_mb is not None:
        mem = by["memory"]
        (mem / "memory.limit_in_bytes").write_text(str(limits.mem_mb * 2**20))
        memsw = mem / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # RAM + swap: the job may not swap its way past the limit
            memsw.write_text(str(limits.mem_mb * 2**20))
        else:
            with contextlib.suppress(OSError):
                (mem / "memory.swappiness").write_text("0")
    if limits.cpus is not None:
        (by["cpuset"] / "cpuset.cpus").write_text(_format_cpus(limits.cpus))
    if limits.pids_max is not None:
        (by["pids"] / "pids.max").write_text(str(limits.pids_max))
    for major, minor in limits.deny_devices:
        (by["devices"] / "devices.deny").write_text(f"c {major}:{minor} rwm")


# ----------------------------------------------------------------------------- records
def record(job_dir: Path, cg: JobCgroup) -> None:
    """Remember a job cgroup in its launch dir (before any process enters it)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / RECORD_NAME).write_text("".join(f"{d}\n" for d in cg.dirs))


def recorded(state_dir: Path) -> list[tuple[Path, list[Path]]]:
    """(launch dir, cgroup directories that still exist) of every recorded job cgroup."""
    out = []
    for path in sorted((state_dir / "jobs").glob(f"*/e*/{RECORD_NAME}")):
        dirs = recorded_in(path.parent)
        if dirs:
            out.append((path.parent, dirs))
    return out


def _is_cgroup(line: str) -> bool:
    """A recorded line names a job cgroup under the cgroup fs (never anything else)."""
    p = Path(line)
    return p.is_absolute() and ".." not in p.parts and p.name.startswith("job-")


# ----------------------------------------------------------------------------- killing
def kill_leftovers(
    state_dir: Path,
    *,
    remove: bool,
    prune: bool = False,
    keep: Collection[Path] = (),
    only: Collection[Path] | None = None,
) -> int:
    """SIGKILL everything in the job cgroups recorded under `state_dir` (an agent that was
    killed left them). With `remove` (the agent starting again, or the guard of a dead
    agent) the cgroups are deleted and forgotten too, and with `prune` their parents once
    empty (no agent uses them any more). The cgroups of the launch dirs in `keep` are
    spared (jobs a restarted agent may adopt); with `only`, just those launch dirs' are
    killed. Returns how many had processes."""
    killed = 0
    for job_dir, dirs in recorded(state_dir):
        if job_dir in keep or (only is not None and job_dir not in only):
            continue
        if members(dirs):
            killed += 1
            kill_all(dirs)
            log.warning(
                "killed the processes left in cgroup %s of job %s epoch %s",
                dirs[0].name,
                job_dir.parent.name,
                job_dir.name.removeprefix("e"),
            )
        if remove and remove_dirs(dirs):
            (job_dir / RECORD_NAME).unlink(missing_ok=True)
            if prune:
                node_dirs = [d.parent for d in dirs]
                if remove_dirs(node_dirs, quiet=True):
                    remove_dirs([d.parent for d in node_dirs], quiet=True)
    return killed


def recorded_in(job_dir: Path) -> list[Path]:
    """The directories of the job cgroup recorded in one launch dir that still exist."""
    with contextlib.suppress(OSError):
        lines = (job_dir / RECORD_NAME).read_text().splitlines()
        return [d for d in (Path(line) for line in lines if _is_cgroup(line)) if d.is_dir()]
    return []


def members(dirs: Sequence[Path]) -> set[int]:
    """The processes in any of `dirs` now, never the calling process (whose thread may be
    inside while it starts a job)."""
    out: set[int] = set()
    for d in dirs:
        with contextlib.suppress(OSError):
            out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    out.discard(os.getpid())
    return out


def kill_all(dirs: Sequence[Path], timeout_s: float = KILL_TIMEOUT_S) -> bool:
    """SIGKILL everything in the cgroup until it is empty (True), or `timeout_s` passed.
    v1 with the freezer: frozen first, so nothing forks between reading and killing.
    v2: `cgroup.kill` where the kernel has it."""
    deadline = time.monotonic() + timeout_s
    freezer = next((d for d in dirs if _controller_of(d) == "freezer"), None)
    cgkill = next((d / "cgroup.kill" for d in dirs if (d / "cgroup.kill").exists()), None)
    while True:
        pids = members(dirs)
        if not pids:
            return True
        if cgkill is not None:
            with contextlib.suppress(OSError):
                cgkill.write_text("1")
        _freeze(freezer, True)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _freeze(freezer, False)  # a frozen process dies of SIGKILL only once thawed
        if time.monotonic() > deadline:
            log.warning("cgroup %s: %d process(es) left after SIGKILL", dirs[0], len(pids))
            return False
        time.sleep(0.02)


def remove_dirs(dirs: Sequence[Path], *, quiet: bool = False) -> bool:
    """rmdir each cgroup directory (the kernel refuses while processes are in it)."""
    ok = True
    for d in dirs:
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            ok = False
            if not quiet:
                log.warning("cannot remove cgroup %s: %s", d, e.strerror or e)
    return ok


def _freeze(freezer: Path | None, frozen: bool) -> None:
    if freezer is None:
        return
    with contextlib.suppress(OSError):
        (freezer / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
        if frozen:  # FREEZING until every task stopped; bounded, killing works regardless
            deadline = time.monotonic() + 0.5
            while (freezer / "freezer.state").read_text().strip() != "FROZEN":
                if time.monotonic() > deadline:
                    break
                time.sleep(0.005)


# ----------------------------------------------------------------------------- helpers
def _thread_cgroups(tid: int, root: Path = CGROUP_FS) -> dict[str, Path]:
    """Controller → the directory of thread `tid`'s cgroup in each mounted v1 controller."""
    out = {}
    try:
        lines = Path(f"/proc/self/task/{tid}/cgroup").read_text().splitlines()
    except OSError:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(","):
            if c and not c.startswith("name=") and (root / c).is_dir():
                out[c] = root / c / path.lstrip("/")
    return out


def _controller_of(d: Path) -> str:
    """The v1 controller a cgroup directory belongs to (the mount under /sys/fs/cgroup)."""
    parts = d.parts
    root = CGROUP_FS.parts
    return parts[len(root)] if parts[: len(root)] == root and len(parts) > len(root) else ""


def _ensure(d: Path) -> None:
    """Create a v1 cgroup directory and its missing parents (cpusets inherit CPUs, mems)."""
    if d.is_dir():
        return
    _ensure(d.parent)
    d.mkdir(exist_ok=True)
    if _controller_of(d) == "cpuset":
        _inherit_cpuset(d)


def _inherit_cpuset(d: Path) -> None:
    """A new v1 cpuset cgroup starts with no CPUs and no memory nodes: copy the parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        if not (d / name).read_text().strip():
            (d / name).write_text((d.parent / name).read_text().strip())


def _fstype(path: Path) -> str | None:
    """The filesystem type mounted exactly at `path`, from /proc/self/mounts."""
    fstype = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[1] == str(path):
                fstype = parts[2]  # the last mount at a path is the visible one
    return fstype


def _counters(path: Path) -> dict[str, int]:
    out = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                out[k] = int(v)
    return out


def _parse_cpus(text: str) -> tuple[int, ...]:
    """ "0-3,8,10-11" → (0, 1, 2, 3, 8, 10, 11)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return tuple(out)


def _format_cpus(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)


def _safe(name: str) -> str:
    """A node name as one path component (names are [A-Za-z0-9_.@+-]; never . or ..)."""
    cleaned = "".join(c if c.isalnum() or c in "_.@+-" else "_" for c in name)
    return cleaned if cleaned.strip(".") else f"node{cleaned}"
