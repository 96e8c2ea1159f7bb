"""The parent of each job process (a shim, as containerd has): it outlives the agent and
leaves the process's exit status in a file, so a restarted agent still learns how it ended.

The agent runs it as `python -I -S shim.py CTRL_FD STATUS_FD` under the agent's own
identity (root on a shared cluster), in its own session, with a fixed minimal environment:
nothing of the job's environment (LD_PRELOAD, PYTHON*…) ever reaches a process with the
agent's privileges. What to start (argv, environment, directory, Unix identity, umask)
arrives as one message on CTRL_FD, a socket the agent holds; that message is also the go
(with cgroup v2 the agent first moves the shim into the job's cgroup, so the job process is
born inside). The shim starts the job process as the job's user in a new session — the
process is the leader of the job's process group, as it was before shims, so the agent
signals that group and never the shim — and answers its pid (or the error that kept it
from starting) on CTRL_FD. It waits for the process, writes `exit N` or `signal N` to
STATUS_FD (a file the agent opened for it: the job's user can neither open it nor signal a
root shim) and exits the same way, so the agent, while it is the shim's parent, reads the
exact status from wait() as before. An agent that restarted meanwhile reads the file.

It imports only built-in modules (no json, subprocess or socket): it starts in the time of
a bare interpreter, once per job process. Messages are `marshal`led (both ends are this
same interpreter binary, and trust each other: the agent and its own child), each after
its length in 8 bytes.
"""

from __future__ import annotations

import marshal
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

MAX_MESSAGE = 64 * 1024 * 1024  # bytes: an environment and argv far larger than any job's
STATUS_MAX = 64  # bytes of a status file that are ever read
# Ignored by Python itself: the job process gets them back at their defaults (as Popen's
# restore_signals does).
_RESTORED = ("SIGPIPE", "SIGXFZ", "SIGXFSZ")


def format_status(returncode: int) -> str:
    """A returncode (negative: killed by that signal) as a status file line."""
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


def encode(message: Any) -> bytes:
    """One message as sent: its length in 8 bytes, then the message, marshalled."""
    data = marshal.dumps(message)
    return len(data).to_bytes(8, "big") + data


def decode(read_exactly: Callable[[int], bytes]) -> Any:
    """One message, read with `read_exactly(n)` (which raises EOFError when the stream ends
    first); ValueError for one over MAX_MESSAGE."""
    size = int.from_bytes(read_exactly(8), "big")
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size} bytes")
    return marshal.loads(read_exactly(size))


def send(fd: int, message: Any) -> None:
    """Write one message to `fd` (blocking)."""
    data = encode(message)
    while data:
        data = data[os.write(fd, data) :]


def receive(fd: int) -> Any:
    """Read one message from `fd` (blocking); EOFError when it ends first."""
    return decode(lambda n: _read_exactly(fd, n))


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def start(request: dict[str, Any]) -> int:
    """Fork and exec the job process as the agent asked: in a new session, as its user,
    with exactly its environment and the shim's stdin/stdout/stderr (the job's files);
    every other descriptor here is close-on-exec. Returns its pid; raises the OSError or
    ValueError that kept it from starting, as Popen would."""
    argv, env, cwd = request["argv"], request["env"], request["cwd"]
    user, group, groups = request.get("user"), request.get("group"), request.get("groups")
    umask = request.get("umask")
    errors_r, errors_w = os.pipe()  # close-on-exec: EOF on a successful exec
    pid = os.fork()
    if pid == 0:  # the child: nothing but system calls until exec (or _exit)
        try:
            os.close(errors_r)
            os.setsid()
            if groups is not None:
                os.setgroups(groups)
            if group is not None:
                os.setregid(group, group)
            if user is not None:
                os.setreuid(user, user)
            if umask is not None:
                os.umask(umask)
            os.chdir(cwd)
            for name in _RESTORED:
                if hasattr(signal, name):
                    signal.signal(getattr(signal, name), signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            send(errors_w, ("OSError", e.errno, e.strerror, e.filename))
        except BaseException as e:  # a NUL in argv or env, a bad request
            send(errors_w, ("ValueError", str(e)))
        finally:
            os._exit(255)
    os.close(errors_w)
    try:
        error = receive(errors_r)
    except EOFError:
        return pid  # exec'd
    finally:
        os.close(errors_r)
    os.waitpid(pid, 0)
    if error[0] == "OSError":
        raise OSError(error[1], error[2], error[3])
    raise ValueError(error[1])


def _exit_like(returncode: int) -> None:
    """End this process the way the job process ended, so the agent's wait() on the shim
    reads what it would have read from the job process itself."""
    if returncode >= 0:
        os._exit(returncode)
    sig = -returncode
    # try/except, not contextlib.suppress: importing contextlib costs every job's start.
    try:
        import resource  # only here: a shim whose job ended normally never needs it

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the job's core dump is enough
    except (ImportError, OSError, ValueError):
        pass
    try:  # noqa: SIM105  (see above)
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL and SIGSTOP have no handler
        pass
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default action does not end a process


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        print("usage: python -I -S shim.py CTRL_FD STATUS_FD", file=sys.stderr)
        return 2
    ctrl, status_fd = int(argv[0]), int(argv[1])
    for fd in (ctrl, status_fd):
        os.set_inheritable(fd, False)  # the agent passed them: the job must not hold them
    try:
        request = receive(ctrl)
    except (EOFError, ValueError, OSError):
        return 1  # the agent gave up before the go: start nothing
    reply: tuple[Any, ...]
    pid = 0
    try:
        pid = start(request)
        reply = ("pid", pid)
    except OSError as e:
        reply = ("OSError", e.errno, e.strerror, e.filename)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        reply = ("ValueError", str(e))
    try:
        send(ctrl, reply)
        os.close(ctrl)
    except OSError:
        pass  # the agent is gone: the process runs on, its status still goes to the file
    if not pid:
        return 1
    _, status = os.waitpid(pid, 0)
    returncode = os.waitstatus_to_exitcode(status)
    try:
        os.write(status_fd, format_status(returncode).encode())
        os.close(status_fd)
    except OSError:
        pass  # nowhere to write it: a restarted agent reports the process lost
    _exit_like(returncode)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
