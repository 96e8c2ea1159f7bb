"""The lease guard: a process beside the agent that fences its jobs if the agent cannot."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from . import cgroups, leftovers

log = logging.getLogger(__name__)

LEASE_NAME = "lease"
_POLL_S = 0.1
_PASS_MAX_S = 10.0  # while the lease stays lost, look for stragglers at most this rarely


class LeaseFile:
    """The agent's side: publish the lease deadline for the guard (atomically replaced)."""

    def __init__(self, state_dir: Path, pid: int | None = None) -> None:
        self.path = state_dir / LEASE_NAME
        self.pid = os.getpid() if pid is None else pid

    def renew(self, deadline: float) -> None:
        """The lease now runs until `deadline` (time.monotonic() seconds)."""
        tmp = self.path.with_suffix(".tmp")
        with contextlib.suppress(OSError):  # the agent fences itself anyway
            tmp.write_text(f"{self.pid} {deadline!r}\n")
            tmp.replace(self.path)


def start_guard(state_dir: Path) -> subprocess.Popen[bytes]:
    """Start the guard of this process (the agent) on `state_dir`."""
    pid = os.getpid()
    argv = [sys.executable, "-m", "phalanx.agent.guard", str(state_dir), str(pid)]
    argv.append(str(leftovers.start_time(pid)))
    # Its own session: a SIGSTOP/SIGKILL of the agent (or of its process group) spares it.
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)


def stop_guard(guard: subprocess.Popen[bytes]) -> None:
    """The agent stopped its jobs and exits: the guard has nothing left to do."""
    guard.terminate()
    try:
        guard.wait(timeout=5)
    except subprocess.TimeoutExpired:
        guard.kill()
        guard.wait()


def read_lease(path: Path) -> tuple[int, float] | None:
    """(agent pid, deadline) of a lease file; None when there is none (or it is torn)."""
    try:
        pid, deadline = path.read_text().split()
        return int(pid), float(deadline)
    except (OSError, ValueError):
        return None


def watch(state_dir: Path, agent_pid: int, agent_start: int) -> None:
    """The guard's loop. The agent fences on its own (headlink), but a stopped (SIGSTOP),
    hung or killed agent cannot. The guard runs in its own session, so what stops or kills
    the agent does not reach it, and watches the lease the agent publishes in
    `<state-dir>/lease` ("AGENT_PID DEADLINE", the deadline in CLOCK_MONOTONIC seconds,
    which every process on the machine shares). Past the deadline it SIGKILLs every job
    process group the agent recorded (leftovers). It returns once the agent is gone and its
    lease was enforced, or a new agent has taken the state dir over; the agent stops it
    (SIGTERM) when it exits normally."""
    path = state_dir / LEASE_NAME
    next_pass, interval = 0.0, 1.0
    while True:
        agent_alive = leftovers.start_time(agent_pid) == agent_start
        lease = read_lease(path)
        if lease is None or lease[0] != agent_pid:
            if not agent_alive:
                return  # never renewed, or a new agent owns the state dir
            time.sleep(_POLL_S)
            continue
        now = time.monotonic()
        if now <= lease[1]:
            interval = 1.0
        elif now >= next_pass:
            killed = _fence(state_dir, path, agent_pid)
            interval = 1.0 if killed else min(interval * 2, _PASS_MAX_S)
            next_pass = now + interval
            if not agent_alive:
                # Nobody else deletes the dead agent's job cgroups (emptied above) now.
                cgroups.kill_leftovers(state_dir, remove=True, prune=True)
                return
        time.sleep(_POLL_S)


def _fence(state_dir: Path, path: Path, agent_pid: int) -> int:
    lease = read_lease(path)
    if lease is None or lease[0] != agent_pid or time.monotonic() <= lease[1]:
        return 0
    # Job cgroups first: they hold every process of a job, escaped process groups too.
    killed = cgroups.kill_leftovers(state_dir, remove=False)
    for group in leftovers.live_recorded(state_dir):
        lease = read_lease(path)  # the agent may have renewed it meanwhile: then stop at once
        if lease is None or lease[0] != agent_pid or time.monotonic() <= lease[1]:
            break
        leftovers.kill(group)
        killed += 1
    if killed:
        log.error(
            "lease guard: the agent (pid %d) let its lease run out; killed %d job process "
            "group(s) with SIGKILL",
            agent_pid,
            killed,
        )
    return killed


def main(argv: list[str]) -> int:
    """`python -m phalanx.agent.guard STATE_DIR AGENT_PID AGENT_START_TIME`."""
    if len(argv) != 3 or not argv[1].isdigit() or not argv[2].isdigit():
        print(
            "usage: python -m phalanx.agent.guard STATE_DIR AGENT_PID AGENT_START", file=sys.stderr
        )
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        watch(Path(argv[0]), int(argv[1]), int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
