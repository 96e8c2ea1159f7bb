"""Node health on the agent: numbered GPU fault events until the head acks them, NHC checks."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import ValidationError

from phalanx.api.models import GpuHealthEvent, NodeHealth

from .gpus import GpuFault, GpuProvider
from .survive import Survivals

log = logging.getLogger(__name__)

EVENTS_FILE = "health-events.json"  # in the agent's state dir
MAX_EVENTS = 100  # unacknowledged events kept; older ones are dropped (and logged)
MAX_REASON = 500  # check_failure length, so it fits a drain reason
GPU_POLL_S = 1.0  # how long one provider poll waits for a GPU fault
# Credentials of the agent's own environment that a check script has no business seeing.
_SECRET_ENV = ("PHALANX_JOIN_TOKEN", "PHALANX_TOKEN")


class EventQueue:
    """GPU health events not yet acknowledged by the head, numbered by an increasing `seq`.

    The last seq and the unacknowledged events are kept in `path` (JSON, replaced
    atomically), so a restarted agent neither reuses a number nor forgets an event. Without
    that file (a fresh state dir) numbering starts after the current Unix time in seconds:
    an earlier agent of this node whose state was lost would have needed more than one
    event per second of its life to have used such a number. Thread-safe; keeps the newest
    `limit` events. `path` None: in memory only.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        limit: int = MAX_EVENTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.limit = limit
        self._lock = threading.Lock()
        self._events: list[GpuHealthEvent] = []
        self._write_warned = False
        self.last_seq = int(clock())
        if path is not None and path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            last = int(data["last_seq"])
            events = [GpuHealthEvent.model_validate(e) for e in data["events"]]
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as e:
            # Keep the time-based start: it is still above any number used before.
            log.warning("ignoring unreadable GPU health state %s: %s", path, e)
            return
        self.last_seq = max(last, *(e.seq for e in events), 0)
        self._events = events[-self.limit :]

    def add(self, fault: GpuFault) -> GpuHealthEvent:
        """Number `fault` and queue it until acknowledged."""
        with self._lock:
            self.last_seq += 1
            event = GpuHealthEvent(
                seq=self.last_seq,
                time=fault.time,
                gpu=fault.gpu,
                kind=fault.kind,
                code=fault.code,
                message=fault.message,
            )
            self._events.append(event)
            if len(self._events) > self.limit:
                dropped = self._events[: -self.limit]
                self._events = self._events[-self.limit :]
                log.warning(
                    "dropped %d GPU health event(s) the head never acknowledged (up to seq %d)",
                    len(dropped),
                    dropped[-1].seq,
                )
            self._save()
            return event

    def pending(self) -> list[GpuHealthEvent]:
        """The events to send in the next heartbeat, oldest first."""
        with self._lock:
            return list(self._events)

    def ack(self, seq: int) -> None:
        """The head has handled every event up to `seq`: forget them."""
        with self._lock:
            kept = [e for e in self._events if e.seq > seq]
            if len(kept) != len(self._events):
                self._events = kept
                self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        state = {"last_seq": self.last_seq, "events": [e.model_dump() for e in self._events]}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(state), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as e:
            if not self._write_warned:  # keep working from memory; say so once
                self._write_warned = True
                log.warning("cannot save GPU health events to %s: %s", self.path, e)


def check_problem(path: Path) -> str | None:
    """Why `path` cannot be a health check (not a file, not executable), or None."""
    if not path.is_file():
        return f"--health-check {path}: no such file"
    if not os.access(path, os.X_OK):
        return f"--health-check {path}: not executable (chmod +x it)"
    return None


def run_check(path: Path, timeout_s: float, stop: threading.Event | None = None) -> str | None:
    """Run one NHC-style check: None if it exits 0, else `"<name>: <first line>"` (of its
    stdout, else stderr, else `exit N`). Killed with its whole process group after
    `timeout_s` (reported as failed) or when `stop` is set (reported as passing)."""
    env = {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}
    try:
        proc = subprocess.Popen(
            [str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own group: a timeout kills its children too
        )
    except OSError as e:
        return _reason(f"{path.name}: cannot run: {e.strerror or e}")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            out, err = proc.communicate(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() < deadline and not (stop is not None and stop.is_set()):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            if stop is not None and stop.is_set():
                return None
            return _reason(f"health check {path} timed out after {timeout_s:g}s")
    if proc.returncode == 0:
        return None
    line = _first_line(out) or _first_line(err)
    if line is None:
        code = proc.returncode
        line = f"exit {code}" if code > 0 else f"killed by signal {-code}"
    return _reason(f"{path.name}: {line}")


def _first_line(data: bytes) -> str | None:
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()
    return None


def _reason(text: str) -> str:
    text = text.replace("\x00", "\\0")  # a script's binary output: NUL is no wire text
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


class HealthMonitor:
    """The node's health as the heartbeat reports it (`snapshot()`), kept current by two
    threads: one polls the GPU provider for faults into the EventQueue, one runs the check
    scripts every `interval_s` (each with `interval_s` as its timeout), first at start().
    `on_change` (thread-safe) is called when there is news: a fault, or a check result that
    differs from the last one. The checks run in order; the first failing one is reported.
    """

    def __init__(
        self,
        gpus: GpuProvider,
        events: EventQueue,
        checks: Sequence[Path] = (),
        *,
        interval_s: float = 30.0,
        on_change: Callable[[], None] = lambda: None,
        survivals: Survivals | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"the health-check interval must be > 0 seconds, got {interval_s}")
        self.gpus = gpus
        self.events = events
        self.checks = list(checks)
        self.interval_s = interval_s
        self.on_change = on_change
        self.survivals = survivals or Survivals()
        self.check_failure: str | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start polling GPUs and (if there are checks) running them."""
        targets = [self._poll_gpus] + ([self._run_checks] if self.checks else [])
        for target in targets:
            t = threading.Thread(target=target, name=f"health-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop both threads (a running check is killed); returns once they have ended."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []

    def snapshot(self) -> NodeHealth:
        """What the next heartbeat says: unacknowledged events and the check failure."""
        return NodeHealth(events=self.events.pending(), check_failure=self.check_failure)

    def ack(self, seq: int) -> None:
        """The head's DesiredState.health_ack: drop the events it has handled."""
        self.events.ack(seq)

    def run_checks(self) -> str | None:
        """Run the checks once, in order, up to the first failure; record and return it."""
        failure = None
        for path in self.checks:
            failure = run_check(path, self.interval_s, self._stop)
            if failure is not None or self._stop.is_set():
                break
        if failure != self.check_failure and not self._stop.is_set():
            self.check_failure = failure
            if failure is None:
                log.warning("health checks pass again")
            else:
                log.warning("health check failed: %s", failure)
            self.on_change()
        return failure

    def _run_checks(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_checks()
            except Exception:  # checks resume next interval; the last result stands
                self.survivals.record("health", "running the health checks")
            self._stop.wait(self.interval_s)

    def _poll_gpus(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                faults = self.gpus.health_events(GPU_POLL_S)
            except Exception:  # a provider bug must not end health monitoring
                if not failing:
                    log.exception("polling the GPUs for faults failed; retrying")
                self.survivals.record("health", "polling the GPUs", quiet=failing)
                failing = True
                self._stop.wait(GPU_POLL_S)
                continue
            failing = False
            for fault in faults:
                try:
                    e = self.events.add(fault)
                except Exception:  # one unreadable fault must not end health monitoring
                    self.survivals.record("health", f"recording the GPU fault {fault!r}")
                    continue
                log.warning(
                    "GPU health event seq=%d gpu=%s kind=%s code=%s: %s",
                    e.seq,
                    e.gpu,
                    e.kind,
                    e.code,
                    e.message,
                )
            if faults:
                self.on_change()
