"""`phalanx exec` on this node: a command beside a running rank, as the job's user, in its
cgroup, with the rank's environment and working directory; its output streamed back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from phalanx.api.models import ExecFrame, ExecLaunch

from . import leftovers, logfiles
from .cgroups import JobCgroup
from .identity import Refused
from .processes import ProcessManager, ProcState
from .reconcile import LaunchContext, Reconciler, run_as

log = logging.getLogger(__name__)

# Concurrent execs per node: each is a process of the job's user plus a stream the agent
# serves; a user looping `phalanx exec` must not fill the node with them.
MAX_EXECS = 8
# A line is sent at least this often, output or not, so that the head, the client and any
# proxy between them never take a quiet command for a dead connection.
KEEPALIVE_S = 5.0
POLL_MIN_S, POLL_MAX_S = 0.02, 0.25
FRAME_BYTES = 64 * 1024  # output read per frame
KILL_GRACE_S = 2.0  # SIGTERM → SIGKILL of an exec stopped early
_STREAMS: tuple[Literal["stdout", "stderr"], ...] = ("stdout", "stderr")


class ExecRefused(Exception):
    """An exec this node will not start: an HTTP status and a sentence for the user."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class ExecRun:
    """One exec started here: its process key and output files, and its bounds."""

    id: int
    job_id: int
    epoch: int
    stdout: Path
    stderr: Path
    owner_uid: int | None  # its files are its user's: read as open_owned does (no symlink)
    timeout_s: int
    max_output: int
    started: float  # time.monotonic()

    @property
    def key(self) -> tuple[str, int, int]:
        return ("exec", self.job_id, self.id)


class ExecManager:
    """Starts execs through the process manager, as ranks are started (identity, cgroup,
    environment), and streams each one's output as ExecFrames until it ends. An exec is
    killed at its timeout, once its output passes its limit, when its job stops here, and
    when the client goes away. Thread-safe."""

    def __init__(
        self,
        ctx: LaunchContext,
        procs: ProcessManager,
        reconciler: Reconciler,
        max_execs: int = MAX_EXECS,
    ) -> None:
        self.ctx = ctx
        self.procs = procs
        self.reconciler = reconciler
        self.max_execs = max_execs
        # The job epoch's cgroup (set by the agent when it confines jobs).
        self.cgroup_of: Callable[[int, int], JobCgroup | None] = lambda job_id, epoch: None
        self._lock = threading.Lock()
        self._active: dict[int, ExecRun] = {}
        self._next_id = 1

    def active(self) -> int:
        """Execs started and not yet reaped."""
        with self._lock:
            return len(self._active)

    def start(self, req: ExecLaunch) -> ExecRun:
        """Start `req.argv` beside its rank; ExecRefused (409: the rank does not run here,
        429: too many execs) when it cannot. A command that cannot run (not found, a
        missing directory) still starts: its exit code and message come back as a rank's
        would."""
        found = self.reconciler.running_rank(req.job_id, req.epoch, req.rank)
        if isinstance(found, str):
            raise ExecRefused(409, found)
        a, local_rank, port = found
        try:
            user = run_as(a)
        except Refused as e:
            raise ExecRefused(409, str(e)) from None
        with self._lock:
            if len(self._active) >= self.max_execs:
                raise ExecRefused(
                    429, f"this node already runs {self.max_execs} execs; try again when one ends"
                )
            exec_id = self._next_id
            self._next_id += 1
            out, err = logfiles.exec_paths(self.ctx.state_dir, a.job_id, a.epoch, exec_id)
            run = ExecRun(
                id=exec_id,
                job_id=a.job_id,
                epoch=a.epoch,
                stdout=out,
                stderr=err,
                owner_uid=user.uid if user.switches else None,
                timeout_s=req.timeout_s,
                max_output=req.max_output_bytes,
                started=time.monotonic(),
            )
            self._active[exec_id] = run
        job_dir = self.ctx.job_dir(a.job_id, a.epoch)
        env = self.ctx.rank_env(a, user, local_rank, port)
        try:
            state = self.procs.start(
                run.key,
                req.argv,
                env=env,
                cwd=a.workdir,
                stdout=out,
                stderr=err,
                # No owner: a preemption notice (SIGUSR1 by default) is for the job's ranks
                # and steps, and would kill a debugging command it never meant to reach.
                run_as=user,
                cgroup=self.cgroup_of(a.job_id, a.epoch),
            )
        except BaseException:
            self._release(run)
            raise
        if state.pid is not None:
            leftovers.record(job_dir, state.pid)  # killed if the agent dies and restarts
        log.info(
            "job %d.%d: exec %d beside rank %d: %s (pid %s)",
            a.job_id,
            a.epoch,
            exec_id,
            req.rank,
            req.argv[0][:200],
            state.pid,
        )
        return run

    async def frames(self, run: ExecRun) -> AsyncIterator[bytes]:
        """The exec's answer, one JSON ExecFrame per line, until it ends. When the reader
        goes away (the generator is closed or cancelled) the exec is killed."""
        offsets = dict.fromkeys(_STREAMS, 0)
        sent = 0
        why: str | None = None
        timed_out = truncated = False
        last_line = time.monotonic()
        delay = POLL_MIN_S
        try:
            while True:
                state = self.procs.get(run.key)
                ended = state is None or not state.running
                got = False
                drained = True
                for stream in _STREAMS:
                    room = run.max_output - sent
                    if room <= 0:
                        break
                    chunk = logfiles.read_chunk(
                        run.stdout if stream == "stdout" else run.stderr,
                        offsets[stream],
                        ended=ended,
                        limit=min(FRAME_BYTES, room),
                        owner=run.owner_uid,
                    )
                    offsets[stream] = chunk.next_offset
                    sent += chunk.next_offset - chunk.offset
                    drained = drained and chunk.eof
                    if chunk.data:
                        got = True
                        yield _line(ExecFrame(kind=stream, data=chunk.data))
                if ended and (drained or sent >= run.max_output):
                    yield _line(_exit_frame(state, timed_out, truncated, why))
                    return
                now = time.monotonic()
                if why is None:
                    if sent >= run.max_output:
                        truncated = True
                        why = f"its output passed {run.max_output} bytes: killed"
                    elif now - run.started > run.timeout_s:
                        timed_out = True
                        why = f"it ran past its timeout of {run.timeout_s} s: killed"
                    elif not self._job_here(run):
                        why = "the job stopped on this node: killed"
                    if why is not None:
                        self.procs.stop(run.key, KILL_GRACE_S)
                if got:
                    delay, last_line = POLL_MIN_S, now
                    continue
                if now - last_line >= KEEPALIVE_S:
                    last_line = now
                    yield _line(ExecFrame(kind="keepalive"))
                await asyncio.sleep(delay)
                delay = min(delay * 2, POLL_MAX_S)
        finally:
            self.finish(run)

    def finish(self, run: ExecRun) -> None:
        """Stop the exec if it still runs; once it has ended, forget it and delete its
        files (a thread waits for a stopped one, so the caller never blocks)."""
        state = self.procs.get(run.key)
        if state is not None and state.running:
            self.procs.stop(run.key, KILL_GRACE_S)
            threading.Thread(
                target=self._reap, args=(run,), name=f"exec-{run.id}", daemon=True
            ).start()
            return
        self._release(run)

    def _reap(self, run: ExecRun) -> None:
        while True:
            state = self.procs.get(run.key)
            if state is None or not state.running:
                break
            time.sleep(0.1)
        self._release(run)

    def _release(self, run: ExecRun) -> None:
        self.procs.forget(run.key)
        for path in (run.stdout, run.stderr):
            with contextlib.suppress(OSError):
                path.unlink()
        with self._lock:
            self._active.pop(run.id, None)

    def _job_here(self, run: ExecRun) -> bool:
        """Whether the exec's job epoch is still one this node must run."""
        a = self.reconciler.assignment(run.job_id)
        return a is not None and a.epoch == run.epoch


def _exit_frame(
    state: ProcState | None, timed_out: bool, truncated: bool, why: str | None
) -> ExecFrame:
    return ExecFrame(
        kind="exit",
        exit_code=state.exit_code if state is not None else None,
        signal=state.signal if state is not None else None,
        timed_out=timed_out,
        truncated=truncated,
        message=why,
    )


def _line(frame: ExecFrame) -> bytes:
    return frame.model_dump_json(exclude_defaults=True).encode() + b"\n"
