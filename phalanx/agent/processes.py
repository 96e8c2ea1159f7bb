"""Job processes: start each in its own process group, watch it, stop it (TERM, then KILL)."""

from __future__ import annotations

import errno
import logging
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .cgroups import JobCgroup

from . import spawn
from .identity import RunAs

log = logging.getLogger(__name__)

# Starts a job process that runs as another user: already that user (Popen drops the
# privileges before exec), it enters the working directory and opens its -o/-e files
# itself, so it can reach only what that user may. Arguments: WORKDIR OUT ERR -- ARGV…
# (OUT/ERR empty: keep the file the agent opened; ERR "=": join stdout).
_AS_USER = r"""
fail() { code=$1; shift; printf 'phalanx-agent: %s\n' "$*" >&2; exit "$code"; }
me() { id -un 2>/dev/null || id -u; }  # only on failure: a fork costs milliseconds
why="(no such directory, or no permission)"
cd -- "$1" 2>/dev/null ||
  fail 1 "working directory $1 does not exist on this node or user $(me) may not enter it"
if [ -n "$2" ]; then
  { true >>"$2"; } 2>/dev/null || fail 1 "cannot open output file $2 as user $(me) $why"
  exec >>"$2"
fi
if [ "$3" = "=" ]; then exec 2>&1
elif [ -n "$3" ]; then
  { true >>"$3"; } 2>/dev/null || fail 1 "cannot open error file $3 as user $(me) $why"
  exec 2>>"$3"
fi
shift 4
command -v -- "$1" >/dev/null 2>&1 || fail 127 "$1: command not found"
exec "$@"
"""
SHELL = "/bin/sh"

_FENCED = "not started: this node lost contact with the head (fenced)"

# Exit codes for a process that could not be started at all, as a shell reports them.
EXIT_CANNOT_START = 1
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
MAX_LAUNCH_ERROR = 2000  # characters of a LaunchFailed reason sent to the head


@dataclass(frozen=True)
class ProcState:
    """One process as seen now. `pid` is None when it could not be started."""

    pid: int | None
    running: bool
    exit_code: int | None  # set when it exited normally
    signal: int | None  # set when a signal killed it
    started_at: float  # unix seconds
    ended_at: float | None
    stdout: Path
    stderr: Path
    lost: bool = False  # ended by the agent (fenced, or lost in an agent restart), not the job
    # The -o/-e files the process opened itself (as its user), when it did; stdout/stderr
    # are then the agent's files, which hold what happened before (e.g. why it failed).
    outputs: tuple[Path, Path] | None = None
    uid: int | None = None  # the user it runs as; None: the agent's own
    # Why the agent could not launch it at all ("LaunchFailed: …"): the job fails, and is
    # not requeued (the same spec would fail on any node).
    launch_error: str | None = None
    shim: int | None = None  # the pid of its shim (spawn.py), when it has one

    @property
    def shell_code(self) -> int | None:
        """The status a shell would show: the exit code, or 128 + signal; None if running."""
        if self.signal is not None:
            return 128 + self.signal
        return self.exit_code


class Exit(NamedTuple):
    """How an adopted process ended, as its shim recorded it."""

    code: int | None  # exit code, when it exited
    signal: int | None  # the signal that killed it
    at: float  # unix seconds


class _Proc:
    """Mutable bookkeeping of one process; guarded by the manager's lock."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes] | None,
        stdout: Path,
        stderr: Path,
        owner: Hashable = None,
        outputs: tuple[Path, Path] | None = None,
        uid: int | None = None,
        pid: int | None = None,
    ) -> None:
        self.popen = popen  # the agent's child: the process itself, or its shim
        # The job process, leader of its own process group (what the agent signals); None:
        # it never started. With a shim, the shim's child.
        self.pid = pid if pid is not None else (popen.pid if popen is not None else None)
        self.pgid = self.pid  # None: its group may no longer be ours (adopted after it ended)
        self.outputs = outputs
        self.uid = uid
        self.owner = owner
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.stdout = stdout
        self.stderr = stderr
        self.stopping = False
        self.lost = False
        self.launch_error: str | None = None
        self.done = threading.Event()  # set once it ended and its status is known

    def state(self) -> ProcState:
        shim = self.popen.pid if self.popen is not None and self.popen.pid != self.pid else None
        return ProcState(
            pid=self.pid,
            running=self.ended_at is None,
            exit_code=self.exit_code,
            signal=self.signal,
            started_at=self.started_at,
            ended_at=self.ended_at,
            stdout=self.stdout,
            stderr=self.stderr,
            lost=self.lost,
            outputs=self.outputs,
            uid=self.uid,
            launch_error=self.launch_error,
            shim=shim,
        )


class ProcessManager:
    """Starts, watches and stops job processes, each the leader of its own process group.

    `on_change(key)` is called (from a watcher thread) when a process ends. Stopping
    signals the whole group, so a rank's children die with it. Each process may name an
    `owner` (the job's (id, epoch)) so a notice reaches all of a job's processes. Once
    fenced, nothing starts until `unfence()`.
    """

    def __init__(self, on_change: Callable[[Hashable], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._procs: dict[Hashable, _Proc] = {}
        self._on_change = on_change
        self._stoppers: list[threading.Thread] = []
        self._fenced = False

    def start(
        self,
        key: Hashable,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        stdout: Path,
        stderr: Path,
        owner: Hashable = None,
        run_as: RunAs | None = None,
        outputs: tuple[Path | None, Path | None] = (None, None),
        cgroup: JobCgroup | None = None,
        status: Path | None = None,
    ) -> ProcState:
        """Start `argv` in `cwd` with exactly `env`, appending output to the two files
        (one file when both paths are equal). A process that cannot start (missing cwd,
        command not found) is recorded as ended with a shell-like exit code and a
        message in its stderr file; this never raises for the job's own faults. While
        fenced, nothing starts: the process is recorded as lost (killed by SIGKILL).

        `run_as` other than the agent's own identity (a root agent): the process runs as
        that user (groups, umask 077); it enters `cwd` and opens `outputs` (-o/-e paths,
        stderr None: joins stdout when -o is given) itself, with that user's rights; the
        agent's `stdout`/`stderr` files (which it creates owned by the user) get the rest.
        With `cgroup` (the job's), the process is born inside it. With `status`, it runs
        under a shim (shim.py) that writes its exit status there: a restarted agent can
        adopt it (adopt.py)."""
        if key in self._procs:
            raise ValueError(f"process {key!r} already exists")
        if self._fenced:
            return self.fail(
                key, _FENCED, code=None, signal=9, stdout=stdout, stderr=stderr, lost=True
            )
        if run_as is not None and run_as.switches:
            return self._start_as(
                key, argv, env, cwd, stdout, stderr, owner, run_as, outputs, cgroup, status
            )
        if not os.path.isdir(cwd):
            msg = f"working directory {cwd} does not exist on this node"
            return self.fail(key, msg, code=EXIT_CANNOT_START, stdout=stdout, stderr=stderr)
        try:
            stdout.parent.mkdir(parents=True, exist_ok=True)
            stderr.parent.mkdir(parents=True, exist_ok=True)
            out = open(stdout, "ab")  # noqa: SIM115  # closed below
        except (OSError, ValueError) as e:  # ValueError: a NUL in the path
            msg = f"LaunchFailed: cannot open the output file {str(stdout)!r}: {_why(e)}"
            return self.fail(
                key, msg, code=EXIT_CANNOT_START, stdout=stdout, stderr=stderr, launch_error=True
            )
        failure: tuple[int, str] | None = None
        launch_error = False
        with out:
            try:
                err = out if stderr == stdout else open(stderr, "ab")  # noqa: SIM115  # closed below
            except (OSError, ValueError) as e:
                msg = f"LaunchFailed: cannot open the error file {str(stderr)!r}: {_why(e)}"
                return self.fail(
                    key,
                    msg,
                    code=EXIT_CANNOT_START,
                    stdout=stdout,
                    stderr=stderr,
                    launch_error=True,
                )
            try:
                popen, pid = spawn.start(argv, env, cwd, out, err, None, cgroup, status)
            except FileNotFoundError:
                failure = (EXIT_NOT_FOUND, f"{argv[0]}: command not found")
            except PermissionError:
                failure = (EXIT_NOT_EXECUTABLE, f"{argv[0]}: permission denied")
            except OSError as e:
                failure = (EXIT_CANNOT_START, f"cannot start {argv[0]}: {e.strerror or e}")
            except (ValueError, TypeError) as e:  # a NUL in argv, env or cwd; never the job's run
                failure = (EXIT_CANNOT_START, f"LaunchFailed: cannot start {argv[0]!r}: {e}")
                launch_error = True
            finally:
                if err is not out:
                    err.close()
        if failure is not None:
            return self.fail(
                key,
                failure[1],
                code=failure[0],
                stdout=stdout,
                stderr=stderr,
                launch_error=launch_error,
            )
        return self._track(key, _Proc(popen, stdout, stderr, owner, pid=pid))

    def _track(self, key: Hashable, proc: _Proc) -> ProcState:
        """Book a process that started and watch it; its state as started (even if it
        ends before this returns)."""
        pid = proc.pid
        assert proc.popen is not None and pid is not None
        started = proc.state()
        with self._lock:
            self._procs[key] = proc
            if self._fenced:  # fenced while it started: fence() did not see it
                proc.lost = True
                _signal_group(pid, signal.SIGKILL)
        threading.Thread(
            target=self._watch, args=(key, proc), name=f"watch-{pid}", daemon=True
        ).start()
        return started

    def _start_as(
        self,
        key: Hashable,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        stdout: Path,
        stderr: Path,
        owner: Hashable,
        run_as: RunAs,
        outputs: tuple[Path | None, Path | None],
        cgroup: JobCgroup | None,
        status: Path | None,
    ) -> ProcState:
        out_path, err_path = outputs
        err_arg = str(err_path) if err_path is not None else ("=" if out_path else "")
        wrapper = [SHELL, "-c", _AS_USER, "phalanx-launch", cwd, str(out_path or ""), err_arg]
        try:
            out = open_job_file(stdout, run_as)
        except OSError as e:
            return self.fail(
                key, f"cannot open {stdout}: {e}", code=1, stdout=stdout, stderr=stderr
            )
        try:
            err = out if stderr == stdout else open_job_file(stderr, run_as)
        except OSError as e:
            os.close(out)
            return self.fail(
                key, f"cannot open {stderr}: {e}", code=1, stdout=stdout, stderr=stderr
            )
        try:
            # The wrapper enters the job's directory as the user.
            popen, pid = spawn.start(
                [*wrapper, "--", *argv], env, "/", out, err, run_as, cgroup, status
            )
        except OSError as e:
            msg = f"cannot start {argv[0] if argv else 'the job'} as uid {run_as.uid}: {e}"
            return self.fail(key, msg, code=EXIT_CANNOT_START, stdout=stdout, stderr=stderr)
        except (ValueError, TypeError) as e:  # a NUL in argv, env or cwd; never the job's run
            msg = f"LaunchFailed: cannot start {argv[0] if argv else 'the job'!r}: {e}"
            return self.fail(
                key, msg, code=EXIT_CANNOT_START, stdout=stdout, stderr=stderr, launch_error=True
            )
        finally:
            os.close(out)
            if err != out:
                os.close(err)
        shown = None
        if out_path is not None or err_path is not None:
            shown = (
                _absolute(out_path, cwd) if out_path else stdout,
                _absolute(err_path, cwd)
                if err_path
                else (_absolute(out_path, cwd) if out_path else stderr),
            )
        proc = _Proc(popen, stdout, stderr, owner, outputs=shown, uid=run_as.uid, pid=pid)
        return self._track(key, proc)

    def fail(
        self,
        key: Hashable,
        message: str,
        *,
        code: int | None,
        stdout: Path,
        stderr: Path,
        signal: int | None = None,
        lost: bool = False,
        launch_error: bool = False,
    ) -> ProcState:
        """Record a process that could not be started: `message` goes to its stderr file
        (prefixed `phalanx-agent:`, when that file can be written) and it reads as ended
        with exit `code` (or `signal`); `lost` marks it as ended by the agent, not the job.
        `launch_error` reports the message to the head as why the job cannot be launched
        (the job fails, not requeued). Never raises."""
        try:
            stderr.parent.mkdir(parents=True, exist_ok=True)
            with open(stderr, "ab") as f:
                f.write(f"phalanx-agent: {message}\n".encode(errors="replace"))
        except (OSError, ValueError) as e:  # the message still reaches the head and the log
            log.warning("cannot write to %r: %s", str(stderr), _why(e))
        log.warning("cannot start %s: %s", key, message)
        proc = _Proc(None, stdout, stderr)
        proc.exit_code, proc.signal, proc.ended_at = code, signal, time.time()
        proc.lost = lost
        proc.done.set()
        if launch_error:
            proc.launch_error = message.replace("\x00", "\\0")[:MAX_LAUNCH_ERROR]
        with self._lock:
            self._procs[key] = proc
        if self._on_change is not None:
            self._on_change(key)
        return proc.state()

    def adopt(
        self,
        key: Hashable,
        *,
        pid: int,
        group: bool,
        started_at: float,
        stdout: Path,
        stderr: Path,
        owner: Hashable,
        outputs: tuple[Path, Path] | None,
        uid: int | None,
        wait_end: Callable[[], Exit | None],
    ) -> ProcState:
        """Take over a job process an earlier run of the agent started (adopt.py). It is
        not this agent's child: `wait_end()` blocks until it ended and says how (None: no
        status; it reads as killed by SIGKILL, lost unless this agent stopped it). `group`:
        its process group is verifiably still the job's, so stops and signals go to it."""
        if key in self._procs:
            raise ValueError(f"process {key!r} already exists")
        proc = _Proc(None, stdout, stderr, owner, outputs=outputs, uid=uid, pid=pid)
        proc.started_at = started_at
        proc.pgid = pid if group else None
        with self._lock:
            self._procs[key] = proc
            if self._fenced and proc.pgid is not None:  # fenced meanwhile: never runs on
                proc.lost = True
                _signal_group(pid, signal.SIGKILL)
        threading.Thread(
            target=self._watch_adopted,
            args=(key, proc, wait_end),
            name=f"adopted-{pid}",
            daemon=True,
        ).start()
        return proc.state()

    def _watch_adopted(
        self, key: Hashable, proc: _Proc, wait_end: Callable[[], Exit | None]
    ) -> None:
        end = wait_end()
        with self._lock:
            if end is None:
                proc.ended_at, proc.signal = time.time(), signal.SIGKILL
                proc.lost = proc.lost or not proc.stopping
            else:
                proc.ended_at, proc.exit_code, proc.signal = end.at, end.code, end.signal
        proc.done.set()
        if self._on_change is not None:
            self._on_change(key)

    def _watch(self, key: Hashable, proc: _Proc) -> None:
        """Reap the group leader (no zombies) and record how it ended."""
        assert proc.popen is not None
        code = proc.popen.wait()  # a shim ends as its job process did (shim.py)
        with self._lock:
            proc.ended_at = time.time()
            if code < 0:
                proc.signal = -code
            else:
                proc.exit_code = code
        proc.done.set()
        if self._on_change is not None:
            self._on_change(key)

    def get(self, key: Hashable) -> ProcState | None:
        """The state of one process, or None if unknown."""
        with self._lock:
            proc = self._procs.get(key)
            return proc.state() if proc is not None else None

    def states(self) -> dict[Hashable, ProcState]:
        """Every known process (running and ended) by key."""
        with self._lock:
            return {k: p.state() for k, p in self._procs.items()}

    def forget(self, key: Hashable) -> None:
        """Drop an ended process from the books (its files stay)."""
        with self._lock:
            proc = self._procs.get(key)
            if proc is not None and proc.ended_at is not None:
                del self._procs[key]

    def stop(self, key: Hashable, grace_s: float) -> None:
        """SIGTERM the process group now, SIGKILL it after `grace_s` if anything is left.
        Returns at once; a stop already under way is not restarted."""
        with self._lock:
            proc = self._procs.get(key)
            if proc is None or proc.pgid is None or proc.stopping:
                return
            proc.stopping = True
            pgid = proc.pgid
            ended = proc.ended_at is not None
        if ended and not group_alive(pgid):
            return  # nothing left; never signal an id the kernel may have reused
        t = threading.Thread(
            target=_terminate_group, args=(pgid, grace_s), name=f"stop-{pgid}", daemon=True
        )
        t.start()
        with self._lock:
            self._stoppers = [s for s in self._stoppers if s.is_alive()]
            self._stoppers.append(t)

    def send_signal(self, key: Hashable, sig: signal.Signals) -> bool:
        """Send `sig` to the process group of a running process; False if it is not running."""
        with self._lock:
            proc = self._procs.get(key)
            if proc is None or proc.pgid is None or proc.ended_at is not None:
                return False
            return _signal_group(proc.pgid, sig)

    def signal_owned(
        self, owner: Hashable, sig: signal.Signals, skip: Collection[Hashable] = ()
    ) -> int:
        """Send `sig` to the group of every running process of `owner` but those keyed in
        `skip`; how many got it."""
        with self._lock:
            groups = [
                p.pgid
                for key, p in self._procs.items()
                if p.owner == owner
                and p.pgid is not None
                and p.ended_at is None
                and key not in skip
            ]
            return sum(_signal_group(pgid, sig) for pgid in groups)

    def fence(self, since: float | None = None) -> int:
        """SIGKILL every process group at once (no grace) and start nothing until
        `unfence()`. Processes running until now read as `lost`, and so do those killed by
        SIGKILL since `since` (unix time: the lease guard may have fenced first). Returns
        how many process groups this fence ended; does not wait for them to die."""
        fenced: set[int] = set()
        ended_groups = []
        with self._lock:
            self._fenced = True
            for proc in self._procs.values():
                pgid = proc.pgid
                if pgid is None:
                    continue
                if proc.ended_at is None:  # not reaped yet: the group id is still ours
                    proc.lost = True
                    if _signal_group(pgid, signal.SIGKILL):
                        fenced.add(pgid)
                    continue
                ended_groups.append(pgid)
                if since is not None and proc.signal == signal.SIGKILL and proc.ended_at >= since:
                    proc.lost = True
                    fenced.add(pgid)
        # An ended rank's children may live on in its group; only a group with live members
        # is signalled (its id cannot have been reused while they hold it).
        if ended_groups:
            alive = live_groups()
            fenced.update(
                g for g in ended_groups if g in alive and _signal_group(g, signal.SIGKILL)
            )
        return len(fenced)

    def unfence(self) -> None:
        """Allow starting processes again (the head answered after a fence)."""
        with self._lock:
            self._fenced = False

    def stop_all(self, grace_s: float) -> None:
        """Stop every process group and wait until all are dead (agent shutdown)."""
        with self._lock:
            keys = list(self._procs)
        for key in keys:
            self.stop(key, grace_s)
        with self._lock:
            stoppers = list(self._stoppers)
            procs = list(self._procs.values())
        for t in stoppers:
            t.join()
        for p in procs:
            p.done.wait()  # reaped (a child), or its end seen (adopted)


def _absolute(path: Path, cwd: str) -> Path:
    return path if path.is_absolute() else Path(cwd) / path


def open_job_file(path: Path, run_as: RunAs | None) -> int:
    """Open (create) one of the agent's log files of a job for appending: never through a
    symlink, only a regular file, and owned by the job's user (created so, or already
    theirs). The directories holding them are the agent's, so the user cannot swap them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
    except FileExistsError:
        fd = os.open(path, flags)
        created = False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        if run_as is not None and run_as.switches:
            if created:
                os.fchown(fd, run_as.uid, run_as.gid)
            elif st.st_uid != run_as.uid:
                raise OSError(errno.EPERM, f"{path} belongs to uid {st.st_uid}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _why(e: Exception) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def live_groups() -> set[int]:
    """The process group ids that have a live (non-zombie) member, from one /proc scan."""
    groups: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # exited while we looked
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X"):
            groups.add(int(fields[2]))
    return groups


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process of the group still exists.

    Zombies do not count: an orphaned grandchild that nobody reaps must not make a stop
    wait for its whole grace period. Without /proc, any member counts.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # exited while we looked
            continue
        # "pid (comm) state ppid pgrp …"; comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _terminate_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the group; SIGKILL whatever is left after the grace period."""
    if not _signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.05)
    if _signal_group(pgid, signal.SIGKILL):
        log.info("process group %d ignored SIGTERM for %.1fs; killed", pgid, grace_s)


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to the group; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except OSError as e:  # EPERM: only zombies left, which cannot be signalled anyway
        if e.errno != errno.EPERM:
            raise
    return True
