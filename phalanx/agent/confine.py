"""Each job epoch in its own cgroup: made at launch from the assignment, torn down at stop."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from phalanx.api.models import Assignment

from . import cgroups
from .cgroups import Confinement, JobCgroup, Limits

log = logging.getLogger(__name__)

JobKey = tuple[int, int]  # (job_id, epoch)


class JobConfiner:
    """The agent's job cgroups. `launch()` creates one per job epoch (memory from --mem,
    a cpuset from --cpus-per-task, a pids limit, only the job's GPU device files), records
    it in the launch dir, and returns it for the process manager to start processes in;
    `teardown()` kills everything in it until it is empty, then deletes it. Thread-safe."""

    def __init__(self, confinement: Confinement, gpu_devices: Mapping[int, Path]) -> None:
        self.confinement = confinement
        self._devices = dict(gpu_devices)
        self._lock = threading.Lock()
        self._cgroups: dict[JobKey, tuple[JobCgroup, Path]] = {}  # → (cgroup, launch dir)
        self._oom: set[JobKey] = set()

    def launch(self, a: Assignment, tasks: int, job_dir: Path) -> JobCgroup | None:
        """The cgroup for job epoch `a` running `tasks` tasks here; None when the node
        cannot confine (said once at start). Raises OSError when it cannot be made."""
        c = self.confinement
        if not c.enabled:
            return None
        key = (a.job_id, a.epoch)
        name = f"job-{a.job_id}-{a.epoch}"
        wanted = None if a.cpus_per_task is None else a.cpus_per_task * max(tasks, 1)
        cpus, note = c.choose_cpus(name, wanted)
        if note:
            log.warning("job %d.%d: %s", a.job_id, a.epoch, note)
        limits = Limits(
            mem_mb=a.mem_mb,
            cpus=cpus,
            pids_max=c.pids_max,
            deny_devices=self._deny(a.gpus) if c.devices else (),
        )
        try:
            cg = c.create(name, limits)
        except OSError:
            c.release_cpus(name)
            raise
        assert cg is not None
        cgroups.record(job_dir, cg)
        with self._lock:
            self._cgroups[key] = (cg, job_dir)
        log.info("job %d.%d: cgroup %s (%s)", a.job_id, a.epoch, name, _describe(limits))
        return cg

    def adopt(self, a: Assignment, job_dir: Path) -> JobCgroup | None:
        """Take over the cgroup an earlier run of the agent made for job epoch `a` (an
        adopted launch): torn down, OOM-checked and given to srun steps as if made here,
        its CPUs counted as taken. None when there is none (or not under this node's
        parent cgroup, e.g. --cgroup-parent changed: it is then left alone)."""
        c = self.confinement
        name = f"job-{a.job_id}-{a.epoch}"
        dirs = cgroups.recorded_in(job_dir)
        if not c.enabled or sorted(dirs) != sorted(d / name for d in c.node_dirs):
            if dirs:
                log.warning(
                    "job %d.%d: cgroup %s is not this agent's; left alone", *_key(a), dirs[0]
                )
            return None
        cg = JobCgroup(dirs, c.version)
        if a.cpus_per_task is not None:
            c.reserve_cpus(name, cg.cpus())
        with self._lock:
            self._cgroups[(a.job_id, a.epoch)] = (cg, job_dir)
        return cg

    def _deny(self, given: list[int]) -> tuple[tuple[int, int], ...]:
        """(major, minor) of every GPU device file of this node not given to the job."""
        out = []
        for index, path in sorted(self._devices.items()):
            if index in given:
                continue
            try:
                rdev = os.stat(path).st_rdev
            except OSError:
                continue  # no such device file here: nothing to open anyway
            out.append((os.major(rdev), os.minor(rdev)))
        return tuple(out)

    def get(self, job_id: int, epoch: int) -> JobCgroup | None:
        """The cgroup of a job epoch running here (srun steps start in it)."""
        with self._lock:
            entry = self._cgroups.get((job_id, epoch))
            return entry[0] if entry is not None else None

    def oom(self, job_id: int, epoch: int) -> bool:
        """Whether the OOM killer killed a process of this job epoch (sticky)."""
        key = (job_id, epoch)
        with self._lock:
            if key in self._oom:
                return True
            entry = self._cgroups.get(key)
        if entry is None or not entry[0].oom_killed():
            return False
        with self._lock:
            self._oom.add(key)
        return True

    def teardown(self, job_id: int, epoch: int) -> bool:
        """Kill every process left in the job's cgroup (double-forked, setsid'ed, ignoring
        SIGTERM: all of them), delete it and forget it. False while processes remain (a
        later call tries again)."""
        key = (job_id, epoch)
        with self._lock:
            entry = self._cgroups.get(key)
        if entry is None:
            return True
        cg, job_dir = entry
        self.oom(job_id, epoch)  # read the counter while the cgroup still exists
        if not cg.remove():
            return False
        with contextlib.suppress(OSError):
            (job_dir / cgroups.RECORD_NAME).unlink()
        self.confinement.release_cpus(f"job-{job_id}-{epoch}")
        with self._lock:
            self._cgroups.pop(key, None)
        return True

    def kill_all(self) -> int:
        """SIGKILL everything in every job cgroup (fencing); they stay until teardown."""
        with self._lock:
            entries = list(self._cgroups.values())
        killed = 0
        for cg, _ in entries:
            if cg.pids():
                cg.kill()
                killed += 1
        return killed

    def shutdown(self) -> None:
        """Tear every job cgroup down and delete the agent's parent cgroup (agent exit)."""
        with self._lock:
            keys = list(self._cgroups)
        for job_id, epoch in keys:
            self.teardown(job_id, epoch)
        self.confinement.close()


def _key(a: Assignment) -> JobKey:
    return a.job_id, a.epoch


def _describe(limits: Limits) -> str:
    parts = [f"memory {limits.mem_mb} MiB" if limits.mem_mb is not None else "memory unlimited"]
    if limits.cpus is not None:
        parts.append(f"cpus {','.join(map(str, limits.cpus))}")
    parts.append(f"pids {limits.pids_max if limits.pids_max is not None else 'unlimited'}")
    if limits.deny_devices:
        parts.append("no access to " + ", ".join(f"{a}:{b}" for a, b in limits.deny_devices))
    return "; ".join(parts)
