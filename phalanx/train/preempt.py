"""Cooperative preemption: on the notice signal, stop at a step boundary, checkpoint, exit 75.

Importing this module does not import torch, so the agent and the head can read
REQUEUE_EXIT_CODE and the variable names from here.

The control plane sends a notice signal (SIGUSR1 unless PHALANX_PREEMPT_SIGNAL names
another, e.g. "SIGTERM" or "15") to the job's processes; PHALANX_PREEMPT_DEADLINE says how
many seconds they have from the notice until they are killed. The training loop
finishes its current step, saves a checkpoint, and exits with REQUEUE_EXIT_CODE, which
tells Phalanx "requeue me": the job goes back to the queue and resumes from that checkpoint.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from phalanx.train.errors import TrainConfigError

if TYPE_CHECKING:
    import torch.distributed as dist

log = logging.getLogger(__name__)

# 75 is EX_TEMPFAIL in sysexits.h ("temporary failure; the user is invited to retry"):
# the exit code of a job that checkpointed on a preemption notice and wants to be requeued.
REQUEUE_EXIT_CODE = 75
SIGNAL_ENV = "PHALANX_PREEMPT_SIGNAL"
DEADLINE_ENV = "PHALANX_PREEMPT_DEADLINE"


class Preempted(SystemExit):
    """Raised by the training loop after the preemption checkpoint: uncaught, it exits the
    process with REQUEUE_EXIT_CODE (it is a SystemExit, so `finally` blocks still run)."""

    def __init__(self, step: int) -> None:
        super().__init__(REQUEUE_EXIT_CODE)
        self.step = step


def notice_signal(environ: Mapping[str, str] | None = None) -> signal.Signals:
    """The preemption notice signal: PHALANX_PREEMPT_SIGNAL (name or number), else SIGUSR1."""
    env = os.environ if environ is None else environ
    raw = env.get(SIGNAL_ENV, "").strip()
    if not raw:
        return signal.SIGUSR1
    try:
        if raw.isdigit():
            return signal.Signals(int(raw))
        name = raw.upper()
        return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError):
        raise TrainConfigError(f"{SIGNAL_ENV}={raw!r} is not a signal name or number") from None


def grace_s(environ: Mapping[str, str] | None = None) -> float | None:
    """PHALANX_PREEMPT_DEADLINE: the seconds between a notice and the kill ("30", "30.5"),
    or None when unset."""
    env = os.environ if environ is None else environ
    raw = env.get(DEADLINE_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TrainConfigError(
            f"{DEADLINE_ENV}={raw!r} is not a number of seconds (e.g. 30 or 30.5): the time "
            "a job has from a preemption notice until it is killed"
        )
    return value


class PreemptionWatcher:
    """Catches the notice signal and makes every rank agree on the step to stop after.

    A signal may reach some ranks and not others, or at different steps. Each step the
    local flag goes into an asynchronous all-reduce (MAX) on a CPU group; the result is
    read one step later, so every rank sees the same answer at the same step and the
    reduction overlaps a whole step of compute instead of adding to it.
    """

    def __init__(
        self, group: dist.ProcessGroup | None, environ: Mapping[str, str] | None = None
    ) -> None:
        import torch
        import torch.distributed as dist

        self.signal = notice_signal(environ)
        self.group = group
        self.requested = threading.Event()
        self.received_at: float | None = None
        self._environ = environ
        self._previous: Any = None
        self._work: Any = None
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._distributed = group is not None and dist.get_world_size(group) > 1

    def install(self) -> None:
        """Install the handler (main thread only; elsewhere the loop still polls a flag
        that a caller may set with `request()`)."""
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self.signal, self._handle)

    def uninstall(self) -> None:
        """Restore the previous handler."""
        if self._previous is not None:
            signal.signal(self.signal, self._previous)
            self._previous = None

    def drain(self) -> None:
        """Wait for the in-flight flag reduction (every rank issued it at the same step);
        called when the loop ends normally, before the last collectives of the job."""
        if self._work is not None:
            self._work.wait()
            self._work = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.request()

    def request(self) -> None:
        """Ask for a stop at the next step boundary (what the signal handler does)."""
        if not self.requested.is_set():
            self.received_at = time.time()
            self.requested.set()

    def should_stop(self) -> bool:
        """Called once per step by every rank: True on all ranks at the same step."""
        if not self._distributed:
            return self.requested.is_set()
        import torch
        import torch.distributed as dist

        stop = False
        if self._work is not None:
            self._work.wait()
            stop = bool(self._flag.item())
            if stop and self.received_at is None:
                # The notice reached another rank: count the grace from when this one
                # learned of it (at most a step later than the signal).
                self.received_at = time.time()
        self._flag = torch.tensor([1 if self.requested.is_set() else 0], dtype=torch.int32)
        self._work = dist.all_reduce(
            self._flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True
        )
        return stop

    def seconds_left(self) -> float | None:
        """Seconds until the kill: when the notice came (to this rank, or word of it from
        another) + PHALANX_PREEMPT_DEADLINE - now; None when that is unset or no notice
        came yet."""
        grace = grace_s(self._environ)
        if grace is None or self.received_at is None:
            return None
        return self.received_at + grace - time.time()
