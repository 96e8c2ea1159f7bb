"""srun job steps on this node: launch their tasks, report them, kill them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

from phalanx.api.models import Assignment, StepLaunch, StepStatus, StepTaskStatus

from . import adopt, leftovers, logfiles
from .cgroups import JobCgroup
from .env import step_env
from .identity import Refused
from .processes import EXIT_CANNOT_START, ProcessManager
from .reconcile import JobKey, LaunchContext, launch_failed, run_as

log = logging.getLogger(__name__)


class StepExists(ValueError):
    """A step with this id was already launched for the job on this node."""


def task_key(job_id: int, step_id: int, task_id: int) -> Hashable:
    """The process manager's key of one step task."""
    return ("step", job_id, step_id, task_id)


@dataclass(frozen=True)
class _Step:
    job_id: int
    epoch: int
    step_id: int
    task_ids: tuple[int, ...]


class StepManager:
    """The steps `srun` started on this node, each task in its own process group."""

    def __init__(self, ctx: LaunchContext, procs: ProcessManager) -> None:
        self.ctx = ctx
        self.procs = procs
        self._lock = threading.Lock()
        self._steps: dict[tuple[int, int], _Step] = {}
        # The job epoch's cgroup (set by the agent when it confines jobs).
        self.cgroup_of: Callable[[int, int], JobCgroup | None] = lambda job_id, epoch: None

    def launch(self, a: Assignment, req: StepLaunch) -> StepStatus:
        """Start the step's tasks for assignment `a` (the job as desired on this node).
        Raises StepExists when the step id is taken."""
        with self._lock:
            if (req.job_id, req.step_id) in self._steps:
                raise StepExists(f"step {req.job_id}.{req.step_id} already exists on this node")
            step = _Step(a.job_id, a.epoch, req.step_id, tuple(t.task_id for t in req.tasks))
            self._steps[(req.job_id, req.step_id)] = step
        try:
            user = run_as(a)
        except Refused as e:
            user, refused = None, launch_failed(e)
        job_dir = self.ctx.job_dir(a.job_id, a.epoch)
        for task in req.tasks:
            out, err = logfiles.task_paths(
                self.ctx.state_dir, a.job_id, a.epoch, req.step_id, task.task_id
            )
            key = task_key(a.job_id, req.step_id, task.task_id)
            if user is None:
                self.procs.fail(key, refused, code=EXIT_CANNOT_START, stdout=out, stderr=err)
                continue
            env = step_env(
                a,
                task,
                step_id=req.step_id,
                base={**self.ctx.base_env, **user.env()},
                head_url=self.ctx.head_url,
                bin_dir=self.ctx.bin_dir,
                job_dir=job_dir,
                secrets=self.ctx.secrets,
                head_ca_pem=self.ctx.head_ca_pem,
            )
            state = self.procs.start(
                key,
                task.argv,
                env=env,
                cwd=req.workdir,
                stdout=out,
                stderr=err,
                owner=(a.job_id, a.epoch),  # notices reach step tasks with the job's ranks
                run_as=user,
                cgroup=self.cgroup_of(a.job_id, a.epoch),  # confined with the job's ranks
                status=adopt.status_path(job_dir, adopt.task_name(req.step_id, task.task_id)),
            )
            if state.pid is not None:
                leftovers.record(job_dir, state.pid)
                adopt.remember(
                    job_dir,
                    state,
                    kind="task",
                    job_id=a.job_id,
                    epoch=a.epoch,
                    rank=task.task_id,
                    step_id=req.step_id,
                    uid=user.uid,
                )
        log.info("job %d: step %d started %d task(s)", a.job_id, req.step_id, len(req.tasks))
        status = self.status(req.job_id, req.step_id)
        assert status is not None
        return status

    def adopt(self, a: Assignment, records: list[adopt.ProcRecord]) -> None:
        """Take over the step tasks an earlier run of the agent started for launch `a` (its
        ranks are adopted): srun inside the job goes on polling and stopping them here."""
        steps: dict[int, list[int]] = {}
        for r in records:
            if r.kind == "task" and r.step_id is not None:
                key = task_key(a.job_id, r.step_id, r.rank)
                adopt.take_over(self.procs, key, r, self.ctx.state_dir)
                steps.setdefault(r.step_id, []).append(r.rank)
        with self._lock:
            for step_id, tasks in steps.items():
                step = _Step(a.job_id, a.epoch, step_id, tuple(sorted(tasks)))
                self._steps[(a.job_id, step_id)] = step

    def status(self, job_id: int, step_id: int) -> StepStatus | None:
        """The tasks of a step and how they ended, or None if unknown here."""
        with self._lock:
            step = self._steps.get((job_id, step_id))
        if step is None:
            return None
        tasks = []
        for t in step.task_ids:
            s = self.procs.get(task_key(job_id, step_id, t))
            tasks.append(
                StepTaskStatus(
                    task_id=t,
                    pid=s.pid if s else None,
                    running=s.running if s else False,
                    exit_code=s.exit_code if s else None,
                    signal=s.signal if s else None,
                )
            )
        return StepStatus(job_id=job_id, step_id=step_id, tasks=tasks)

    def kill(self, job_id: int, step_id: int, grace_s: float) -> bool:
        """SIGTERM (then SIGKILL) every task of the step; False if the step is unknown."""
        with self._lock:
            step = self._steps.get((job_id, step_id))
        if step is None:
            return False
        for t in step.task_ids:
            self.procs.stop(task_key(job_id, step_id, t), grace_s)
        return True

    def stop_undesired(self, wanted: set[JobKey], grace_s: float) -> None:
        """Kill the steps of every (job, epoch) not in `wanted`; forget them once dead."""
        with self._lock:
            steps = [s for s in self._steps.values() if (s.job_id, s.epoch) not in wanted]
        for step in steps:
            keys = [task_key(step.job_id, step.step_id, t) for t in step.task_ids]
            alive = False
            for key in keys:
                s = self.procs.get(key)
                alive = alive or (s is not None and s.running)
                self.procs.stop(key, grace_s)
            if not alive:
                for key in keys:
                    self.procs.forget(key)
                with self._lock:
                    self._steps.pop((step.job_id, step.step_id), None)

    def task_log(self, job_id: int, step_id: int, task_id: int) -> tuple[Path, Path, bool] | None:
        """(stdout, stderr, ended) of a step task on this node, or None if unknown."""
        with self._lock:
            step = self._steps.get((job_id, step_id))
        if step is None or task_id not in step.task_ids:
            return None
        s = self.procs.get(task_key(job_id, step_id, task_id))
        if s is None:
            return None
        return s.stdout, s.stderr, not s.running
