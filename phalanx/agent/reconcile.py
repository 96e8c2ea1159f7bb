"""Make what runs on this node match the head's desired state, like a kubelet."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from phalanx.api.models import Assignment, DesiredState, ProcessStatus
from phalanx.jobspec import expand_pattern

from . import adopt, fakeload, identity, leftovers, logfiles, notices
from .admission import (
    LAUNCH_FAILED,
    Refused,
    output_problem,
    workdir_problem,
    workdir_usable,
)
from .cgroups import JobCgroup
from .confine import JobConfiner
from .env import global_rank, job_env, local_ranks
from .identity import JOB_UMASK, RunAs
from .processes import EXIT_CANNOT_START, SHELL, ProcessManager, ProcState, open_job_file
from .survive import Survivals

log = logging.getLogger(__name__)

DEFAULT_KILL_GRACE_S = 10.0
_LAUNCH_THREADS = 8  # ranks of one launch started at once

JobKey = tuple[int, int]  # (job_id, epoch)


def _key(a: Assignment) -> JobKey:
    return (a.job_id, a.epoch)


def rank_key(job_id: int, epoch: int, rank: int) -> Hashable:
    """The process manager's key of one rank."""
    return ("rank", job_id, epoch, rank)


@dataclass
class _Launch:
    """What this node started for one (job, epoch)."""

    assignment: Assignment | None  # None: refused, unreadable (admission.Refused)
    ranks: dict[int, int] = field(default_factory=dict)  # global rank → local rank
    delivered: set[int] = field(default_factory=set)  # notice ids


@dataclass(frozen=True)
class LaunchContext:
    """Node-wide facts every launch needs (paths, environment, credentials to keep out)."""

    state_dir: Path
    base_env: Mapping[str, str]
    head_url: str | None = None
    secrets: Collection[str] = ()
    head_ca_pem: str | None = None  # the CA the head's TLS is pinned to, for jobs
    fake_gpus: bool = False  # each rank gets a file to drive its fake GPU (fakeload.py)

    @property
    def bin_dir(self) -> Path:
        """Where the srun/scontrol shims live; first on every job's PATH."""
        return self.state_dir / "bin"

    def job_dir(self, job_id: int, epoch: int) -> Path:
        """Per-launch files: the batch script, srun's step counter (the job's), the launch
        marker, process groups and notices (the agent's, unreadable to the job)."""
        return self.state_dir / "jobs" / str(job_id) / f"e{epoch}"

    def rank_env(
        self, a: Assignment, user: RunAs, local_rank: int, master_port: int | None
    ) -> dict[str, str]:
        """The environment of a process of `a` on this node as its rank `local_rank` sees
        it (a rank, or a command `phalanx exec` runs beside one): env.job_env with this
        node's facts."""
        env = job_env(
            a,
            base={**self.base_env, **user.env()},
            local_rank=local_rank,
            master_port=master_port,
            head_url=self.head_url,
            bin_dir=self.bin_dir,
            job_dir=self.job_dir(a.job_id, a.epoch),
            secrets=self.secrets,
            head_ca_pem=self.head_ca_pem,
        )
        if self.fake_gpus:
            env[fakeload.FILE_ENV] = str(fakeload.util_file(self.job_dir(*_key(a)), local_rank))
        return env

    def open_job_dir(self, job_id: int, epoch: int) -> Path:
        """The job dir, created so the job's user can pass through to its own files in it
        (mode 0711 from the state dir down: nothing in it can be listed)."""
        d = self.job_dir(job_id, epoch)
        d.mkdir(parents=True, exist_ok=True)
        for p in (d, d.parent, d.parent.parent, self.state_dir):
            p.chmod(0o711)
        return d


def run_as(a: Assignment) -> RunAs:
    """Who the job runs as here (raises identity.Refused)."""
    return identity.resolve(a.user, a.uid, a.gid)


def _user(a: Assignment) -> RunAs | None:
    """Who the job runs as here; None: nobody (refused)."""
    try:
        return run_as(a)
    except identity.Refused:
        return None


def launch_failed(e: identity.Refused) -> str:
    return f"{LAUNCH_FAILED}{e}"


# Checks that the job's user can enter its working directory (else exit 3), then creates
# the job's -o/-e files fresh and its checkpoint directory, as that user, there; prints
# each file it cannot create (a directory, no permission). Arguments: WORKDIR
# CHECKPOINT_DIR FILE…
_NO_WORKDIR = 3
_PREPARE_AS_USER = r"""
cd -- "$1" 2>/dev/null || exit 3
[ -n "$2" ] && mkdir -p -- "$2" 2>/dev/null
shift 2
for f; do { true >"$f"; } 2>/dev/null || printf '%s\n' "$f"; done
exit 0
"""


class Reconciler:
    """Starts the ranks the desired state names and stops every other one.

    Thread-safe: the heartbeat loop calls apply(), the API server reads assignments and
    log paths, watcher threads report exits through `on_change`. `fence()` kills every job
    process when the head has been silent for its lease; `resume()` once it answers.
    """

    def __init__(
        self,
        ctx: LaunchContext,
        procs: ProcessManager,
        *,
        on_change: Callable[[], None] = lambda: None,
        on_stop_job: Callable[[set[JobKey], float], None] = lambda keys, grace: None,
        on_adopt_steps: Callable[[Assignment, list[adopt.ProcRecord]], None] = lambda a, r: None,
        confine: JobConfiner | None = None,
        survivals: Survivals | None = None,
    ) -> None:
        self.ctx = ctx
        self.survivals = survivals or Survivals()
        self.procs = procs
        self.confine = confine  # each job epoch in its own cgroup (None: unconfined)
        self._on_change = on_change
        self._on_stop_job = on_stop_job  # stops srun steps of jobs no longer desired
        self._on_adopt_steps = on_adopt_steps  # takes over srun step tasks a launch had
        # What an earlier run of the agent left running, until the first desired state
        # decides on it (adopt.py); None: nothing (left).
        self.survivors: adopt.Survivors | None = None
        self._lock = threading.RLock()
        self._desired: DesiredState | None = None
        self._launches: dict[JobKey, _Launch] = {}
        self._ports: dict[JobKey, int] = {}
        self._fencing = threading.Event()  # set: start nothing (the lease ran out)
        self._fenced: frozenset[JobKey] = frozenset()  # never started here again

    # ------------------------------------------------------------------ reconcile
    def apply(self, desired: DesiredState, refused: Sequence[Refused] = ()) -> None:
        """Reconcile to `desired`: start missing ranks, stop undesired ones. Idempotent.
        `refused`: jobs of the same answer too invalid to read, reported as failed to launch.

        A job that cannot be launched (or whose launch raises) fails alone, reported with a
        `LaunchFailed: …` reason; it never stops this node's other jobs or the agent."""
        with self._lock:
            self._desired = desired
            wanted = {(a.job_id, a.epoch): a for a in desired.jobs}
            self._inherit(wanted)
            keep = set(wanted) | {(r.job_id, r.epoch) for r in refused}
            self._stop_undesired(keep, desired.kill_grace_s)
            self._on_stop_job(keep, desired.kill_grace_s)
            for r in refused:
                self._refuse(r)
            for key, a in wanted.items():
                if key not in self._launches and not self._fencing.is_set():
                    try:
                        self._maybe_launch(a)
                    except Exception as e:  # a bug, or a case no check foresaw: this job only
                        self.survivals.record("reconcile", f"launching job {a.job_id}.{a.epoch}")
                        self._fail_unstarted(a, f"{LAUNCH_FAILED}{type(e).__name__}: {e}")
            for key, a in wanted.items():
                launch = self._launches.get(key)
                if launch is not None:
                    try:
                        self._deliver_notices(a, launch)
                    except Exception:
                        self.survivals.record("reconcile", f"notices of job {a.job_id}.{a.epoch}")

    # ------------------------------------------------------------------ adoption
    def _inherit(self, wanted: Mapping[JobKey, Assignment]) -> None:
        """With the first desired state since the agent started, settle what an earlier run
        of the agent left running (adopt.py): a launch the head still wants here, as the
        same job and epoch, run by the same user, is adopted; any other is killed (its
        epoch is over here; if still wanted, _maybe_launch reports it lost)."""
        survivors = self.survivors
        if survivors is None:
            return
        try:
            for key in survivors.launches():
                a = wanted.get(key)
                job_dir = self.ctx.job_dir(*key)
                ok = a is not None and key not in self._fenced and adopt.same_launch(job_dir, a)
                user = _user(a) if a is not None and ok else None
                records = survivors.take(key) if user is not None else None
                try:
                    if a is None or user is None or records is None:
                        survivors.kill(key)
                    elif any(r.uid != user.uid for r in records):
                        survivors.kill(key, records)
                    else:
                        self._adopt(a, records)
                except Exception:  # a bug: kill rather than leave it half adopted
                    self.survivals.record("reconcile", f"adopting job {key[0]}.{key[1]}")
                    adopt.disown(job_dir)
                    survivors.kill(key, records)
        finally:
            self.survivors = None  # settled: the agent's API may serve these jobs now

    def _adopt(self, a: Assignment, records: list[adopt.ProcRecord]) -> None:
        key = (a.job_id, a.epoch)
        job_dir = self.ctx.job_dir(*key)
        launch = _Launch(a, delivered=notices.delivered(job_dir))
        self._launches[key] = launch
        if self.confine is not None:
            self.confine.adopt(a, job_dir)
        launch.ranks, port = adopt.take_ranks(
            self.procs, a, records, self.ctx.state_dir, partial(rank_key, *key)
        )
        if port is not None:
            self._ports[key] = port  # picked here, not reported to the head yet
        self._on_adopt_steps(a, [r for r in records if r.kind == "task"])
        self._on_change()

    # ------------------------------------------------------------------ fencing
    def fence(self, since: float | None = None) -> int:
        """The head has not answered for its lease and may restart this node's jobs
        elsewhere: SIGKILL every job process group at once (ranks and srun steps; no grace,
        the jobs resume from their checkpoints), report the ranks `lost`, and start nothing
        until `resume()`. No epoch desired now is ever started here again. Ranks SIGKILLed
        since `since` (unix time; the lease guard may have been first) read as lost too.
        Returns how many process groups were killed. Takes no lock a slow apply() holds."""
        self._fencing.set()
        killed = self.procs.fence(since)
        if self.confine is not None:  # what escaped its process group dies with its cgroup
            self.confine.kill_all()
        survivors = self.survivors
        if survivors is not None:  # not adopted yet: the head never confirmed them
            survivors.kill_all()
            self.survivors = None
        desired = self._desired
        if desired is not None:
            self._fenced = self._fenced | {(a.job_id, a.epoch) for a in desired.jobs}
        for key in {*list(self._launches), *self._fenced}:
            adopt.disown(self.ctx.job_dir(*key))  # lost, not failed: never adopted later
        self._on_change()
        return killed

    def settled(self) -> bool:
        """Whether nothing an earlier run of the agent left awaits the head's word."""
        return self.survivors is None

    def resume(self) -> None:
        """The head answered again: reconcile normally (fenced epochs stay dead)."""
        self.procs.unfence()
        self._fencing.clear()

    def fenced(self) -> bool:
        """Whether the agent is fenced (the head silent for longer than its lease)."""
        return self._fencing.is_set()

    def _stop_undesired(self, wanted: set[JobKey], grace_s: float) -> None:
        for key, launch in list(self._launches.items()):
            if key in wanted:
                continue
            alive = False
            for rank in launch.ranks:
                pkey = rank_key(key[0], key[1], rank)
                state = self.procs.get(pkey)
                if state is not None and state.running:
                    alive = True
                self.procs.stop(pkey, grace_s)  # also reaps a finished rank's leftovers
            if not alive and self.confine is not None and not self.confine.teardown(*key):
                continue  # processes left in its cgroup: killed again on the next apply
            if not alive:
                for rank in launch.ranks:
                    self.procs.forget(rank_key(key[0], key[1], rank))
                del self._launches[key]
                self._ports.pop(key, None)
                adopt.forget(self.ctx.job_dir(*key))  # nothing of it is left to adopt

    def _maybe_launch(self, a: Assignment) -> None:
        key = (a.job_id, a.epoch)
        if any(k[0] == a.job_id for k in self._launches):
            return  # an older epoch of this job is still being stopped: GPUs not free yet
        ranks = [(global_rank(a, lr), lr) for lr in local_ranks(a)]
        job_dir = self.ctx.job_dir(a.job_id, a.epoch)
        marker = job_dir / "launched"
        # The step token identifies the job across head restarts (job ids alone repeat when
        # a cluster is recreated on the same state dir); only its hash is written.
        fingerprint = hashlib.sha256(a.step_token.encode()).hexdigest()
        if key in self._fenced:
            # Desired when this node was fenced, not started yet: its other ranks were
            # killed, so this epoch is over here too ("never twice").
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(fingerprint)
            self._report_lost(a, ranks, "rank lost: the node was fenced before it started")
            return
        if marker.exists() and marker.read_text() == fingerprint:
            # Started by an earlier run of this agent, which stopped its processes on exit
            # (or was killed; the new agent killed the leftovers): report them lost rather
            # than run this epoch a second time ("never twice").
            self._report_lost(a, ranks, "rank lost: the agent restarted while it ran")
            return
        user: RunAs | None = None
        try:
            user = run_as(a)
            # The agent checks -o/-e paths itself only for its own user's jobs: another
            # user's files are checked and created by that user (_prepare_as_user).
            if user.switches:
                problem = None  # checked as that user (_prepare_as_user)
            elif not workdir_usable(a.workdir):
                problem = workdir_problem(a.workdir)
            else:
                problem = self._output_problem(a, user, [r for r, _ in ranks])
        except identity.Refused as e:
            problem = launch_failed(e)
        if problem is not None or user is None:
            self._fail_unstarted(a, problem or LAUNCH_FAILED)
            return
        port = a.master_port
        if port is None and a.node_rank != 0 and ranks:
            return  # wait for the rank-0 node's port to come back through the head
        if port is None and a.node_rank == 0:
            port = self._ports.get(key)
            if port is None:
                try:
                    port = pick_free_port(a.master_addr)
                except OSError as e:
                    log.warning("job %d: cannot pick a port on %s: %s", a.job_id, a.master_addr, e)
                    return
                self._ports[key] = port
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(fingerprint)
        # Records left by another job with the same id and epoch (a recreated cluster).
        notices.forget(job_dir)
        adopt.forget(job_dir)
        launch = _Launch(a)
        self._launches[key] = launch
        argv, problem = self._argv(a, user)
        cgroup = None
        if self.confine is not None and problem is None:  # confinement hook (confine.py)
            try:
                cgroup = self.confine.launch(a, len(ranks), job_dir)
            except OSError as e:
                problem = f"cannot create the job's cgroup: {e.strerror or e}"
        if user.switches:
            problem = problem or self._prepare_as_user(a, user, [r for r, _ in ranks])
        else:
            if a.checkpoint_dir:
                with contextlib.suppress(OSError):  # the job reports it if it needs it
                    (Path(a.workdir) / a.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            self._prepare_outputs(a, user, [r for r, _ in ranks])
        started = []
        for rank, local in ranks:
            launch.ranks[rank] = local
            if problem is None:
                started.append((rank, local))
                continue
            out, err = self._log_paths(a, rank, user)
            if not user.switches:
                _link_default_paths(self.ctx.state_dir, a, rank, out, err)
            refused = problem.startswith(LAUNCH_FAILED)  # fails on any node: no requeue
            pkey = rank_key(a.job_id, a.epoch, rank)
            self.procs.fail(
                pkey, problem, code=EXIT_CANNOT_START, stdout=out, stderr=err, launch_error=refused
            )
        start = partial(self._start_rank, a, user, argv, cgroup, port)
        if len(started) == 1:
            start(*started[0])
        elif started:
            # In parallel: each rank's shim is an interpreter start-up (shim.py).
            with ThreadPoolExecutor(min(len(started), _LAUNCH_THREADS), "launch") as pool:
                for done in [pool.submit(start, rank, local) for rank, local in started]:
                    done.result()  # re-raises: the launch fails as if started in turn
        self._on_change()

    def _start_rank(
        self,
        a: Assignment,
        user: RunAs,
        argv: list[str],
        cgroup: JobCgroup | None,
        port: int | None,
        rank: int,
        local: int,
    ) -> None:
        """Start one rank of a launch (thread-safe: ranks start in parallel)."""
        key = (a.job_id, a.epoch)
        job_dir = self.ctx.job_dir(*key)
        out, err = self._log_paths(a, rank, user)
        if not user.switches:
            _link_default_paths(self.ctx.state_dir, a, rank, out, err)
        env = self.ctx.rank_env(a, user, local, port)
        if self.ctx.fake_gpus:
            with contextlib.suppress(OSError):  # the job's to write; missing: not driven
                os.close(open_job_file(fakeload.util_file(job_dir, local), user))
        state = self.procs.start(
            rank_key(a.job_id, a.epoch, rank),
            argv,
            env=env,
            cwd=a.workdir,
            stdout=out,
            stderr=err,
            owner=key,
            run_as=user,
            outputs=self._output_paths(a, rank),
            cgroup=cgroup,
            status=adopt.status_path(job_dir, adopt.rank_name(rank)),
        )
        if state.outputs is not None and state.uid is not None:
            logfiles.record_outputs(out, state.uid, state.outputs)
        if state.pid is not None:
            leftovers.record(job_dir, state.pid)
            adopt.remember(
                job_dir,
                state,
                kind="rank",
                job_id=a.job_id,
                epoch=a.epoch,
                rank=rank,
                local_rank=local,
                uid=user.uid,
                master_port=port,
            )
        log.info("job %d.%d: rank %d started, pid %s", a.job_id, a.epoch, rank, state.pid)

    def _output_problem(self, a: Assignment, user: RunAs, ranks: list[int]) -> str | None:
        """Why a `-o`/`-e` file of this launch cannot be written (a directory, a path that
        cannot exist): the job fails at once rather than crash the agent on every node."""
        if (a.output is None and a.error is None) or not os.path.isdir(a.workdir):
            return None  # a missing workdir fails the start with its own message
        for rank in ranks:
            out, err = self._log_paths(a, rank, user)
            checks = [("-o", a.output, out), ("-e", a.error, err)]
            for flag, pattern, path in checks:
                if pattern is not None:
                    problem = output_problem(flag, pattern, path)
                    if problem is not None:
                        return problem
        return None

    def _fail_unstarted(self, a: Assignment, why: str) -> None:
        """Every local rank of this launch not started yet fails to launch, its message in
        the rank's default stderr file under the state dir: the whole launch when it cannot
        start at all, the rest when it raised part-way (the head then stops the ones that
        did start, as for any failed rank)."""
        key = (a.job_id, a.epoch)
        launch = self._launches.setdefault(key, _Launch(a))
        for local in local_ranks(a):
            rank = global_rank(a, local)
            pkey = rank_key(a.job_id, a.epoch, rank)
            if self.procs.get(pkey) is not None:
                continue
            launch.ranks[rank] = local
            out, err = logfiles.rank_paths(self.ctx.state_dir, a.job_id, a.epoch, rank)
            self.procs.fail(
                pkey, why, code=EXIT_CANNOT_START, stdout=out, stderr=err, launch_error=True
            )
        self._on_change()

    def _refuse(self, r: Refused) -> None:
        """Report a job this agent could not even read as failed to launch, once."""
        key = (r.job_id, r.epoch)
        if key in self._launches or any(k[0] == r.job_id for k in self._launches):
            return
        launch = _Launch(None)
        self._launches[key] = launch
        launch.ranks[r.rank] = 0
        out, err = logfiles.rank_paths(self.ctx.state_dir, r.job_id, r.epoch, r.rank)
        pkey = rank_key(r.job_id, r.epoch, r.rank)
        self.procs.fail(
            pkey, r.why, code=EXIT_CANNOT_START, stdout=out, stderr=err, launch_error=True
        )
        self._on_change()

    def _report_lost(self, a: Assignment, ranks: list[tuple[int, int]], why: str) -> None:
        """Record the ranks of an epoch this agent will not run as ended by the agent."""
        key = (a.job_id, a.epoch)
        launch = _Launch(a, delivered=notices.delivered(self.ctx.job_dir(*key)))
        self._launches[key] = launch
        user = _user(a)
        for rank, local in ranks:
            launch.ranks[rank] = local
            out, err = self._log_paths(a, rank, user)
            pkey = rank_key(a.job_id, a.epoch, rank)
            self.procs.fail(pkey, why, code=None, signal=9, stdout=out, stderr=err, lost=True)

    def _deliver_notices(self, a: Assignment, launch: _Launch) -> None:
        """Send each notice not yet delivered for this launch: to every rank's process
        group, and unless `batch_only` to the job's running srun step tasks too."""
        for n in a.notices:
            if n.id not in launch.delivered:
                launch.delivered.add(n.id)
                notices.remember(self.ctx.job_dir(a.job_id, a.epoch), n.id)
                ranks = [rank_key(a.job_id, a.epoch, r) for r in launch.ranks]
                notices.send(self.procs, a, ranks, n)

    def _argv(self, a: Assignment, user: RunAs) -> tuple[list[str], str | None]:
        """The command to run, or (…, why it cannot run). Files the job uses in its job
        dir (the batch script, srun's step counter) belong to its user."""
        d = self.ctx.open_job_dir(a.job_id, a.epoch)
        if user.switches:
            os.close(open_job_file(d / "step-counter", user))
        if a.launcher == "batch":
            if a.script is None:
                return [], "batch job has no script"
            path = d / "script"
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            fd = open_job_file(path, user)
            with os.fdopen(fd, "w") as f:
                f.write(a.script)
            path.chmod(0o700)
            return script_argv(a.script, path), None
        if not a.command:
            return [], f"{a.launcher} job has no command"
        return list(a.command), None

    def _log_paths(self, a: Assignment, rank: int, user: RunAs | None) -> tuple[Path, Path]:
        """The rank's (stdout, stderr) files: `-o`/`-e` patterns (relative to workdir), else
        the per-rank files under the state dir. stderr joins stdout when only `-o` is given.
        `user`: who the job runs as (None: refused, it does not start; the agent's files tell
        why); another user's process opens its -o/-e itself, so the agent's files are kept."""
        out, err = logfiles.rank_paths(self.ctx.state_dir, a.job_id, a.epoch, rank)
        if user is None or user.switches:
            return out, err
        if not os.path.isdir(a.workdir):
            return out, err  # the start fails; its message must land somewhere readable
        if a.output is not None:
            out = self._expand(a, a.output, rank)
            if a.error is None:
                err = out
        if a.error is not None:
            err = self._expand(a, a.error, rank)
        return out, err

    def _output_paths(self, a: Assignment, rank: int) -> tuple[Path | None, Path | None]:
        """The rank's `-o`/`-e` files (None: not given), for a process that opens them."""
        out = self._expand(a, a.output, rank) if a.output is not None else None
        err = self._expand(a, a.error, rank) if a.error is not None else None
        return out, err

    def _prepare_as_user(self, a: Assignment, user: RunAs, ranks: list[int]) -> str | None:
        """As the job's user: check it may enter its working directory, create its
        checkpoint directory, and its `-o`/`-e` files afresh once per launch (kept on
        restarts, as Slurm). A working directory the user cannot enter or a file it cannot
        create (a directory, no permission) fails the launch ("LaunchFailed: …"); other
        failures here fail again, with a message, when the ranks start."""
        files = set()
        if a.restart_count == 0:
            files = {str(p) for r in ranks for p in self._output_paths(a, r) if p is not None}
        try:
            done = subprocess.run(
                [
                    SHELL,
                    "-c",
                    _PREPARE_AS_USER,
                    "-",
                    a.workdir,
                    a.checkpoint_dir or "",
                    *sorted(files),
                ],
                env={**identity.sane_env(), **user.env()},
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                user=user.uid,
                group=user.gid,
                extra_groups=list(user.groups),
                umask=JOB_UMASK,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("job %d: cannot prepare its files as uid %d: %s", a.job_id, user.uid, e)
            return None
        if done.returncode == _NO_WORKDIR:
            return workdir_problem(a.workdir, a.user)
        unwritable = done.stdout.decode(errors="replace").splitlines()
        if not unwritable:
            return None
        return (
            f"{LAUNCH_FAILED}cannot write {unwritable[0]} as user {a.user} (uid {user.uid}): "
            "a directory, a missing folder, or no permission"
        )

    def _expand(self, a: Assignment, pattern: str, rank: int) -> Path:
        name = expand_pattern(
            pattern,
            job_id=a.job_id,
            name=a.name,
            task=rank,
            node=a.nodes[a.node_rank],
            user=a.user,
            array_job_id=a.array_job_id,
            array_task_id=a.array_task_id,
            node_id=a.node_rank,
        )
        return Path(a.workdir) / name

    def _prepare_outputs(self, a: Assignment, user: RunAs, ranks: list[int]) -> None:
        """Truncate `-o`/`-e` files once per launch (as Slurm); keep them on restarts."""
        if a.restart_count > 0 or (a.output is None and a.error is None):
            return
        for path in {p for r in ranks for p in self._log_paths(a, r, user)}:
            if path.parent.is_dir():
                path.write_bytes(b"")

    # ------------------------------------------------------------------ views
    def desired(self) -> DesiredState | None:
        """The desired state last applied."""
        with self._lock:
            return self._desired

    def assignment(self, job_id: int) -> Assignment | None:
        """The desired assignment of `job_id` on this node, if any."""
        with self._lock:
            if self._desired is None:
                return None
            return next((a for a in self._desired.jobs if a.job_id == job_id), None)

    def running_rank(
        self, job_id: int, epoch: int, rank: int
    ) -> tuple[Assignment, int, int | None] | str:
        """(assignment, local rank, master port) of rank `rank` of job `job_id`, epoch
        `epoch`, while it runs on this node (`phalanx exec` starts beside it); else why not."""
        with self._lock:
            launch = self._launches.get((job_id, epoch))
            desired = self.assignment(job_id)
            if launch is None or desired is None or desired.epoch != epoch:
                return f"job {job_id} (epoch {epoch}) does not run on this node"
            if rank not in launch.ranks:
                return f"rank {rank} of job {job_id} does not run on this node"
            state = self.procs.get(rank_key(job_id, epoch, rank))
            if state is None or not state.running:
                return f"rank {rank} of job {job_id} has ended"
            port = desired.master_port or self._ports.get((job_id, epoch))
            return desired, launch.ranks[rank], port

    def notices_delivered(self, job_id: int, epoch: int) -> set[int]:
        """The notice ids delivered (or skipped) for a launch this node tracks."""
        with self._lock:
            launch = self._launches.get((job_id, epoch))
            return set(launch.delivered) if launch is not None else set()

    def kill_grace_s(self) -> float:
        """Grace between SIGTERM and SIGKILL, from the head."""
        with self._lock:
            return self._desired.kill_grace_s if self._desired else DEFAULT_KILL_GRACE_S

    def process_statuses(self) -> list[ProcessStatus]:
        """Every rank this node started that is desired or still alive (for the heartbeat)."""
        with self._lock:
            out = []
            for (job_id, epoch), launch in sorted(self._launches.items()):
                for rank, local in sorted(launch.ranks.items()):
                    s = self.procs.get(rank_key(job_id, epoch, rank))
                    if s is not None:
                        oom = self._oom(job_id, epoch, s)
                        out.append(_status(job_id, epoch, rank, local, s, oom))
            return out

    def _oom(self, job_id: int, epoch: int, s: ProcState) -> bool:
        """A rank that ended badly after the OOM killer struck in its job's cgroup."""
        failed = not s.running and not s.lost and (s.signal is not None or s.exit_code != 0)
        return failed and self.confine is not None and self.confine.oom(job_id, epoch)

    def master_ports(self) -> dict[str, int]:
        """Ports this node picked as rank 0, by str(job id)."""
        with self._lock:
            return {str(job): port for (job, _), port in self._ports.items()}

    def busy_gpus(self) -> set[int]:
        """GPU indices held by a running rank (fake telemetry uses it)."""
        with self._lock:
            busy: set[int] = set()
            for (job_id, epoch), launch in self._launches.items():
                states = (self.procs.get(rank_key(job_id, epoch, r)) for r in launch.ranks)
                if launch.assignment and any(s is not None and s.running for s in states):
                    busy.update(launch.assignment.gpus)
            return busy

    def holdings(self) -> list[fakeload.Holding]:
        """Each job with a running rank here: its GPUs, environment, cgroup, rank pids
        (the telemetry sampler attributes GPUs and reads CPU use by it)."""
        out = []
        with self._lock:
            for (job_id, epoch), launch in self._launches.items():
                a = launch.assignment
                states = [self.procs.get(rank_key(job_id, epoch, r)) for r in launch.ranks]
                pids = tuple(s.pid for s in states if s is not None and s.running and s.pid)
                if a is None or not pids:
                    continue
                cg = self.confine.get(job_id, epoch) if self.confine is not None else None
                cpus = len(cg.cpus()) if cg is not None else 0
                out.append(
                    fakeload.Holding(
                        job_id, epoch, tuple(a.gpus), a.env, self.ctx.job_dir(job_id, epoch),
                        cg, pids, cpus,
                    )
                )  # fmt: skip
        return out

    def gpu_holders(self) -> dict[int, list[Assignment]]:
        """GPU index → the assignments with a running rank on it (job-mapping files,
        per-GPU metrics); a GPU no running rank holds is absent."""
        with self._lock:
            held: dict[int, list[Assignment]] = {}
            for (job_id, epoch), launch in sorted(self._launches.items()):
                states = (self.procs.get(rank_key(job_id, epoch, r)) for r in launch.ranks)
                a = launch.assignment
                if a and any(s is not None and s.running for s in states):
                    for gpu in a.gpus:
                        held.setdefault(gpu, []).append(a)
            return held

    def rank_log(self, job_id: int, rank: int) -> tuple[Path, Path, bool] | None:
        """(stdout, stderr, ended) of a rank of `job_id` on this node, newest epoch first;
        falls back to files on disk for jobs this agent no longer tracks."""
        found = self.rank_log_files(job_id, rank)
        return None if found is None else found[:3]

    def rank_log_files(
        self, job_id: int, rank: int
    ) -> tuple[Path, Path, bool, tuple[int | None, int | None]] | None:
        """`rank_log` and, per stream, the uid that must own the file when it is one the
        job opened itself as another user (read it with `logfiles.read_chunk(owner=)`:
        never through a symlink); None: one of the agent's files."""
        agent_files = (None, None)
        with self._lock:
            for (jid, epoch), launch in sorted(self._launches.items(), reverse=True):
                if jid == job_id and rank in launch.ranks:
                    s = self.procs.get(rank_key(jid, epoch, rank))
                    if s is not None:
                        out, err, owners = _readable(s.stdout, s.stderr, s.outputs, s.uid)
                        return out, err, not s.running, owners
            desired = self.assignment(job_id)
            if desired is not None:
                wanted = {global_rank(desired, lr) for lr in local_ranks(desired)}
                if rank in wanted:  # not started yet (waiting for the master port)
                    out, err = self._log_paths(desired, rank, _user(desired))
                    return out, err, False, agent_files
        paths = logfiles.latest_rank_paths(self.ctx.state_dir, job_id, rank)
        if paths is None:
            return None
        recorded = logfiles.recorded_outputs(paths[0])
        if recorded is None:
            return (*paths, True, agent_files)
        uid, outputs = recorded
        out, err, owners = _readable(paths[0], paths[1], outputs, uid)
        return out, err, True, owners

    def shutdown(self) -> None:
        """Stop every job process and wait for them (agent exit), then empty and delete
        every job cgroup."""
        survivors = self.survivors
        if survivors is not None:
            survivors.kill_all()
        with self._lock:
            for key in self._launches:
                adopt.disown(self.ctx.job_dir(*key))  # lost, not failed: never adopted later
        self.procs.stop_all(self.kill_grace_s())
        if self.confine is not None:
            self.confine.shutdown()


def _status(
    job_id: int, epoch: int, rank: int, local: int, s: ProcState, oom: bool = False
) -> ProcessStatus:
    return ProcessStatus(
        job_id=job_id,
        epoch=epoch,
        rank=rank,
        local_rank=local,
        pid=s.pid,
        running=s.running,
        exit_code=s.exit_code,
        signal=s.signal,
        started_at=s.started_at,
        ended_at=s.ended_at,
        lost=s.lost,
        oom=oom,
        launch_error=s.launch_error,
    )


def _readable(
    stdout: Path, stderr: Path, outputs: tuple[Path, Path] | None, uid: int | None
) -> tuple[Path, Path, tuple[int | None, int | None]]:
    """Which files show a process's output, and the owner each must have: the -o/-e files
    it opened itself as its user while they are still its own regular files, else the
    agent's files (which hold why it could not open them)."""
    if outputs is None or uid is None:
        return stdout, stderr, (None, None)
    out, err = outputs
    out_ok = out != stdout and logfiles.readable_by_owner(out, uid)
    err_ok = err != stderr and logfiles.readable_by_owner(err, uid)
    return (
        out if out_ok else stdout,
        err if err_ok else stderr,
        (uid if out_ok else None, uid if err_ok else None),
    )


def _link_default_paths(state_dir: Path, a: Assignment, rank: int, out: Path, err: Path) -> None:
    """Point a rank's default log paths at its `-o`/`-e` files: once the job ends and this
    node forgets the launch, logs are found on disk by their default paths (API, restarts)."""
    defaults = logfiles.rank_paths(state_dir, a.job_id, a.epoch, rank)
    for default, actual in zip(defaults, (out, err), strict=True):
        if default != actual:
            default.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                default.symlink_to(actual)


def script_argv(script: str, path: Path) -> list[str]:
    """How to run a batch script: its `#!` interpreter (plus its one optional argument, as
    the kernel does), else bash. The interpreter is called explicitly so a noexec state
    dir still works."""
    first = script.split("\n", 1)[0]
    if first.startswith("#!"):
        parts = first[2:].strip().split(None, 1)
        if parts:
            return [*parts, str(path)]
    return ["bash", str(path)]


def pick_free_port(address: str) -> int:
    """A TCP port free on `address` now (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port
