"""Starting a job process, directly or under its shim (shim.py), and reading the exit status
the shim leaves."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from . import shim
from .identity import JOB_UMASK, RunAs

if TYPE_CHECKING:
    from .cgroups import JobCgroup

SHIM = Path(shim.__file__).resolve()
# The shim runs with the agent's privileges: it gets a fixed environment, never the job's.
_SHIM_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
_REPLY_TIMEOUT_S = 60.0  # a Python start-up on a loaded machine, with a wide margin
_MAX_REPLY = 64 * 1024

Output = IO[bytes] | int


@dataclass
class Pending:
    """A shim that runs and waits for the go (`release`)."""

    popen: subprocess.Popen[bytes]
    ctrl: socket.socket


def start(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    out: IO[bytes] | int,
    err: IO[bytes] | int,
    run_as: RunAs | None,
    cgroup: JobCgroup | None,
    status: Path | None,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the job process in its own session (the leader of its process group) and in
    `cgroup`, as `run_as` when it switches user; (the agent's child, the job process's pid).
    With `status`, the child is a shim and the job process the shim's child. Raises what
    Popen raises for a process that cannot start."""
    switch = run_as is not None and run_as.switches
    adopt, leave = _enter(cgroup)  # confinement hook: born in the job's cgroup (cgroups.py)
    try:
        if status is None:
            popen = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own session and process group
                close_fds=True,
                user=run_as.uid if switch and run_as else None,
                group=run_as.gid if switch and run_as else None,
                extra_groups=list(run_as.groups) if switch and run_as else None,
                umask=JOB_UMASK if switch else -1,
            )
            adopt(popen.pid)
            return popen, popen.pid
        pending = begin(status, out, err)
        adopt(pending.popen.pid)  # cgroup v2: the shim moves in before the job process starts
    finally:
        leave()
    return pending.popen, release(pending, argv, env, cwd, run_as)


def _enter(cgroup: JobCgroup | None) -> tuple[Callable[[int], None], Callable[[], None]]:
    """(adopt(pid), leave()) around starting a process in `cgroup`; no-ops without one."""
    if cgroup is None:
        return (lambda pid: None), (lambda: None)
    stack = contextlib.ExitStack()
    return stack.enter_context(cgroup.entered()), stack.close


def begin(status: Path, stdout: Output, stderr: Output) -> Pending:
    """Start a shim whose job process will write to `stdout`/`stderr` (the shim's own, which
    it passes on) and whose exit status goes to `status` (created afresh, the agent's,
    0600). The shim is in its own session: nothing that signals the job reaches it. Raises
    OSError when it cannot be started."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    status.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    status_fd = os.open(status, flags, 0o600)
    agent_end, shim_end = socket.socketpair()
    try:
        fds = (shim_end.fileno(), status_fd)
        popen = subprocess.Popen(
            [sys.executable, "-I", "-S", str(SHIM), *map(str, fds)],
            env=_SHIM_ENV,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
            pass_fds=fds,
        )
    except BaseException:
        agent_end.close()
        raise
    finally:
        os.close(status_fd)
        shim_end.close()
    return Pending(popen, agent_end)


def release(
    pending: Pending,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    run_as: RunAs | None,
) -> int:
    """Have the shim start the job process (as `run_as` when it switches user); its pid.
    Raises what Popen would have raised for it (OSError: FileNotFoundError,
    PermissionError…; ValueError: a NUL in argv or env), the shim then having exited."""
    request: dict[str, Any] = {"argv": list(argv), "env": dict(env), "cwd": cwd}
    if run_as is not None and run_as.switches:
        request.update(
            user=run_as.uid, group=run_as.gid, groups=list(run_as.groups), umask=JOB_UMASK
        )
    ctrl = pending.ctrl
    try:
        ctrl.settimeout(_REPLY_TIMEOUT_S)
        ctrl.sendall(shim.encode(request))
        reply = shim.decode(lambda n: _recv_exactly(ctrl, n))
    except (OSError, EOFError, ValueError) as e:  # the shim died, hung or answered garbage
        reply = ("OSError", None, f"the job's shim failed: {e!r}", None)
    finally:
        ctrl.close()
    if not isinstance(reply, tuple) or not reply:
        reply = ("OSError", None, f"the job's shim answered {reply!r}", None)
    if reply[0] == "pid" and len(reply) == 2 and isinstance(reply[1], int) and reply[1] > 0:
        return reply[1]
    _reap(pending.popen)
    if reply[0] == "ValueError":
        raise ValueError(str(reply[1]) if len(reply) > 1 else "invalid")
    errno_, strerror, filename = [*reply[1:], None, None, None][:3]
    if isinstance(errno_, int):
        raise OSError(errno_, str(strerror), filename)  # its errno's subclass, as from Popen
    raise OSError(f"the job's shim did not start it: {strerror}")


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _reap(popen: subprocess.Popen[bytes]) -> None:
    try:
        popen.wait(timeout=_REPLY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def read_status(path: Path) -> tuple[int | None, int | None] | None:
    """(exit code, signal) a shim left in `path`; None when there is none."""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        return shim.parse_status(f.read(shim.STATUS_MAX).decode(errors="replace"))
    return None
