"""The parent of each job process (a shim, as containerd has): it outlives the agent and
leaves the process's exit status in a file, so a restarted agent still learns how it ended.

The agent runs it as `python -I -S shim.py CTRL_FD STATUS_FD` under the agent's own
identity (root on a shared cluster), in its own session, with a fixed minimal environment:
nothing of the job's environment (LD_PRELOAD, PYTHON*…) ever reaches a process with the
agent's privileges. What to start (argv, environment, directory, Unix identity, umask)
arrives as one JSON line on CTRL_FD, a socket the agent holds; that line is also the go
(with cgroup v2 the agent first moves the shim into the job's cgroup, so the job process is
born inside). The shim starts the job process as the job's user in a new session — the
process is the leader of the job's process group, as it was before shims, so the agent
signals that group and never the shim — and answers `{"pid": N}` (or the error that kept it
from starting) on CTRL_FD. It waits for the process, writes `exit N` or `signal N` to
STATUS_FD (a file the agent opened for it: the job's user can neither open it nor signal a
root shim) and exits the same way, so the agent, while it is the shim's parent, reads the
exact status from wait() as before. An agent that restarted meanwhile reads the file.

Standard library only, and nothing is imported from Phalanx: it starts in tens of ms.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
from typing import Any

MAX_REQUEST = 16 * 1024 * 1024  # bytes: an environment and argv far larger than any job's
STATUS_MAX = 64  # bytes of a status file that are ever read


def format_status(returncode: int) -> str:
    """A Popen returncode (negative: killed by that signal) as a status file line."""
    return f"signal {-returncode}\n" if returncode < 0 else f"exit {returncode}\n"


def parse_status(text: str) -> tuple[int | None, int | None] | None:
    """(exit code, signal) from a status file's text, exactly one of them set; None when
    it holds no valid status (not written yet, or the shim was killed first)."""
    parts = text.split()
    if len(parts) != 2 or not parts[1].isdigit():
        return None
    n = int(parts[1])
    if parts[0] == "exit" and 0 <= n <= 255:
        return n, None
    if parts[0] == "signal" and 1 <= n <= 64:
        return None, n
    return None


def _answer(ctrl: socket.socket, reply: dict[str, Any]) -> None:
    ctrl.sendall(json.dumps(reply).encode() + b"\n")


def _start(request: dict[str, Any]) -> subprocess.Popen[bytes]:
    """The job process, as the agent asked: its own session (it leads the job's process
    group), the shim's stdin/stdout/stderr (the job's files), no other descriptor."""
    return subprocess.Popen(
        request["argv"],
        env=request["env"],
        cwd=request["cwd"],
        start_new_session=True,
        close_fds=True,
        user=request.get("user"),
        group=request.get("group"),
        extra_groups=request.get("groups"),
        umask=request.get("umask", -1),
    )


def _exit_like(returncode: int) -> None:
    """End this process the way the job process ended, so the agent's wait() on the shim
    reads what it would have read from the job process itself."""
    if returncode >= 0:
        os._exit(returncode)
    sig = -returncode
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the job's core dump is enough
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default action does not end a process


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        print("usage: python -I -S shim.py CTRL_FD STATUS_FD", file=sys.stderr)
        return 2
    ctrl = socket.socket(fileno=int(argv[0]))
    status_fd = int(argv[1])
    with ctrl, ctrl.makefile("rb") as lines:
        line = lines.readline(MAX_REQUEST)
        if not line.endswith(b"\n"):
            return 1  # the agent gave up before the go (or sent too much): start nothing
        try:
            child = _start(json.loads(line))
        except OSError as e:
            reply = {"error": "OSError", "errno": e.errno, "strerror": e.strerror}
            _answer(ctrl, {**reply, "filename": e.filename})
            return 1
        except (ValueError, TypeError, KeyError) as e:  # a NUL in argv or env, a bad request
            _answer(ctrl, {"error": "ValueError", "message": str(e)})
            return 1
        # The agent may be gone by now: the process runs on, its status still goes to the file.
        with contextlib.suppress(OSError):
            _answer(ctrl, {"pid": child.pid})
    returncode = child.wait()
    with contextlib.suppress(OSError):  # nowhere to write: a restarted agent reports it lost
        os.write(status_fd, format_status(returncode).encode())
        os.close(status_fd)
    _exit_like(returncode)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
