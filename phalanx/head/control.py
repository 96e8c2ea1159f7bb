"""The control plane's one writer: a thread that applies operations in batched transactions.

Every change (a submit, a heartbeat's report, a cancel, a scheduling cycle) is a function run
by this thread on the mirror and the database in one transaction; its caller's future is
resolved only after the commit, so an answered request is durable. Batching all operations
that arrive together into one commit (group commit) is what makes thousands of submits a
second possible on SQLite's one fsync per commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from phalanx.core import Team
from phalanx.head import clock as timed
from phalanx.head import scheduling, store
from phalanx.head.mirror import Mirror, Settings, Tx
from phalanx.head.overload import Backlog, Horizon
from phalanx.head.rejoin import Rejoin
from phalanx.head.timesource import Clock, SystemClock

log = logging.getLogger("phalanx.head")
T = TypeVar("T")

# Under a flood of submits, one scheduling cycle per batch would cost more than the batch;
# cycles run at most this often (a pending change waits at most this long to be scheduled).
CYCLE_MIN_INTERVAL_S = 0.02


class HeadError(Exception):
    """An operation refused with an HTTP status and a message for the user; nothing changed."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(slots=True)
class _Op:
    fn: Callable[[Tx], Any]
    future: Future[Any] | asyncio.Future[Any]  # a thread's, or an event loop's
    queued: float = dataclasses.field(default_factory=time.monotonic)  # head/overload.py


class ControlThread:
    """Owns the mirror; runs operations, the scheduler and the clock in one thread."""

    def __init__(self, engine: Engine, settings: Settings, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.mirror = Mirror(settings)
        self.lock = threading.RLock()  # held while the mirror changes; readers take it too
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._held: Connection | None = None  # kept between back-to-back batches
        self._thread = threading.Thread(target=self._run, name="phalanx-control", daemon=True)
        self._stopping = False
        self.on_commit: Callable[[set[str]], None] = lambda nodes: None
        # After a commit that moved jobs or nodes (job notifications): called on this
        # thread with the committed Tx; it must not block, and what it raises is logged.
        self.on_moves: Callable[[Tx], None] | None = None
        # Also after such a commit, each in turn, the same way (head/usage.py: which job
        # holds which GPU).
        self.move_watchers: list[Callable[[Tx], None]] = []
        # After every commit, on this thread, with the committed Tx (metrics); same rules.
        self.on_committed: list[Callable[[Tx], None]] = []
        self.cycles = 0
        # Bumped after each committed transaction (and by other changes people see, such
        # as progress reports): the dashboard's cheap "something changed" (head/dashboard).
        self.changes = 0
        self._pauses = timed.PauseWatch(settings, self.clock.monotonic())
        # How far behind the head is, and the lease clock that does not count it against
        # nodes (head/overload.py); real monotonic seconds, whatever `clock` is.
        self.backlog = Backlog()
        self.horizon = Horizon()
        # After a start: the fleet heard back before silence is judged (head/rejoin.py).
        self.rejoin = Rejoin()
        # Unexpected exceptions in operations or cycles that were rolled back and survived.
        self.loop_errors = 0
        self._kicked = False  # something changed that the scheduler should look at
        self._last_cycle = float("-inf")
        # Operations per transaction (group commit). 1 turns batching off: bench/submit.py
        # runs that as its baseline.
        self.max_batch = max(1, int(os.environ.get("PHALANX_MAX_BATCH", "2000")))

    # ------------------------------------------------------------------ start-up
    def load(self) -> None:
        """Rebuild the mirror from the database (start-up, also after a crash)."""
        m = self.mirror
        with self.engine.connect() as conn:
            now = self.clock.time()
            for known in store.all_nodes(conn):
                known.last_heartbeat = now  # a lease's grace after a head restart
                m.nodes[known.name] = known
            for team in store.all_teams(conn):
                m.teams[team.name] = _core_team(team)
                if team.qos is not None:
                    m.team_qos[team.name] = frozenset(team.qos)
            m.unix_accounts = store.unix_accounts(conn)
            for rec in store.live_jobs(conn):
                m.jobs[rec.id] = rec
                m.live_per_user[rec.user] = m.live_per_user.get(rec.user, 0) + 1
                for node, _ in rec.placement:
                    m.node_jobs.setdefault(node, set()).add(rec.id)
                if rec.stopping is not None:
                    rec.stop_version = {n: 0 for n, _ in rec.placement}
            _mark_array_throttle(m)
            m.next_job_id = store.max_job_id(conn) + 1
        m.core_dirty = True

    def start(self) -> None:
        # Every node's lease counts from now, when the loop starts to run, not from when
        # `load` began: loading 100,000 live jobs takes seconds, and a lease counted from
        # before it ran out at the first tick, before the agents were heard (their nodes
        # were marked down and their running jobs requeued: killed by a head restart).
        now = self.clock.time()
        for node in self.mirror.nodes.values():
            if node.last_heartbeat is not None:
                node.last_heartbeat = max(node.last_heartbeat, now)
        self.rejoin.begin(self.mirror, now)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._queue.put(None)
        self._thread.join(timeout=10)
        if not self._thread.is_alive() and self._held is not None:
            self._held.close()
            self._held = None

    # ------------------------------------------------------------------ operations
    def submit_op(self, fn: Callable[[Tx], T]) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put(_Op(fn, future))
        return future

    def run_async(self, fn: Callable[[Tx], T]) -> asyncio.Future[T]:
        """`submit_op` for the event loop: the loop's own future, resolved from the control
        thread with one wake-up of the loop per batch rather than one per operation."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put(_Op(fn, future))
        return future

    def call(self, fn: Callable[[Tx], T], timeout: float = 60.0) -> T:
        return self.submit_op(fn).result(timeout)

    def run_now(self, fn: Callable[[Tx], T] | None = None, *, tick: bool = False) -> T | None:
        """Run `fn` (and the clock's tick when `tick`, and a scheduling cycle if one is due)
        as one batch in the caller's thread, and return its result; for a control loop that
        was not started (in-process tests on a fake clock, phalanx.testing.headloop)."""
        if self._thread.is_alive():
            raise RuntimeError("run_now is for a control loop whose thread was not started")
        future: Future[T] = Future()
        ops = [] if fn is None else [_Op(fn, future)]
        paused = self._pauses.paused(self.clock.monotonic()) if tick else 0.0
        self._batch(ops, tick, paused)
        return future.result(timeout=0) if ops else None

    def _run(self) -> None:
        settings = self.mirror.settings
        mono = self.clock.monotonic
        next_tick = mono()
        self._pauses = timed.PauseWatch(settings, next_tick, time.process_time())
        while not self._stopping:
            ops: list[_Op] = []
            wake = next_tick
            if self._kicked:
                wake = min(wake, self._last_cycle + CYCLE_MIN_INTERVAL_S)
            try:
                first = self._queue.get(timeout=max(0.0, wake - mono()))
                if first is not None:
                    ops.append(first)
                while len(ops) < self.max_batch:
                    more = self._queue.get_nowait()
                    if more is not None:
                        ops.append(more)
            except queue.Empty:
                pass
            tick = mono() >= next_tick
            paused = 0.0
            if tick:
                next_tick = mono() + settings.tick_s
                paused = self._pauses.paused(mono(), time.process_time())
            self.backlog.control_batch(ops[0].queued if ops else None)
            try:
                self._batch(ops, tick, paused)
            finally:
                self.backlog.control_idle()

    def _connect(self) -> Connection:
        held, self._held = self._held, None
        return held if held is not None else self.engine.connect()

    def _release(self, connection: Connection | None) -> None:
        """After a batch: keep its connection (or the one still held, if the batch wrote
        nothing) for the next batch if one is already waiting, else give it back to the
        pool. Under load the control thread so skips a pool checkout, its reset and
        (PostgreSQL) its liveness ping per batch; once the queue runs dry the next batch
        gets a pinged connection from the pool as before."""
        if connection is not None:
            self._held = connection
        if self._held is not None and self._queue.empty():
            self._held.close()
            self._held = None

    def _batch(self, ops: list[_Op], tick: bool, paused: float = 0.0) -> None:
        """Run `ops` (and the clock, the scheduler) in one transaction. An unexpected
        exception in one of them (a bug, bad data) is rolled back with the whole batch, the
        mirror is rebuilt from the database as a restart would, that operation is answered
        500, and the others run again: one poisoned request never stops the head."""
        while True:
            failed, bad = self._try_batch(ops, tick, paused)
            if not failed:
                return
            if bad is not None:
                ops = [op for op in ops if op is not bad]
                error = HeadError(500, "internal error in the head; nothing was changed")
                _resolve([(bad, None, error)])
            else:  # the clock or the scheduler: try them again a tick later, not at once
                tick = False
                self._kicked = False
                self._last_cycle = self.clock.monotonic() + self.mirror.settings.tick_s

    def _try_batch(self, ops: list[_Op], tick: bool, paused: float) -> tuple[bool, _Op | None]:
        """One attempt of `_batch`: (False, None) when committed and answered; (True, op)
        when `op` (None: the clock or the scheduler) raised and all was rolled back.
        `paused`: seconds the control thread itself was stopped (SIGSTOP, a frozen VM)."""
        tx = Tx(self._connect, self.clock.time())
        results: list[tuple[_Op, Any, BaseException | None]] = []
        try:
            with self.lock:
                current: _Op | None = None
                try:
                    for op in ops:
                        current = op
                        try:
                            results.append((op, op.fn(tx), None))
                        except HeadError as e:  # refused before changing anything
                            results.append((op, None, e))
                    current = None
                    now = tx.now
                    if tick:
                        # Leases judged up to when the head could hear (head/overload.py).
                        cfg = self.mirror.settings
                        behind = self.backlog.behind_s()
                        heard = self.horizon.heard_until(
                            now, behind, cfg.overload_grace_s, cfg.lease_s
                        )
                        self.rejoin.tick(self.mirror, tx, now)
                        timed.tick(self.mirror, tx, now, paused, heard)
                    self._kicked = self._kicked or tx.kick or self.mirror.core_dirty
                    mono = self.clock.monotonic()
                    due = mono >= self._last_cycle + CYCLE_MIN_INTERVAL_S
                    if tick or (self._kicked and due):
                        began = time.perf_counter()
                        scheduling.cycle(self.mirror, tx, now)
                        tx.cycle_s = time.perf_counter() - began
                        self.cycles += 1
                        self._kicked = False
                        self._last_cycle = mono
                except Exception:
                    self.loop_errors += 1
                    where = "an operation" if current is not None else "the clock or a cycle"
                    log.exception(
                        "control loop: unexpected error in %s (#%d); rolled back, rebuilding "
                        "the mirror from the database and carrying on",
                        where,
                        self.loop_errors,
                    )
                    # Nothing of this batch was committed or answered. A failing rollback
                    # or reload is a store failure: the handler below stops the head.
                    tx.rollback()
                    self._reload()
                    self._release(tx.connection)
                    return True, current
                tx.commit()
        except BaseException:
            # The store failed (or the mirror may disagree with it): stop rather than serve
            # wrong answers. The database holds every committed change; a restart rebuilds.
            log.exception("control loop failed; the head stops (state is safe in the database)")
            try:
                with contextlib.suppress(Exception):  # uncommitted work is dropped regardless
                    tx.rollback()
                _resolve([(op, None, HeadError(503, "the head is restarting")) for op in ops])
            finally:
                os._exit(70)
        self._release(tx.connection)
        self.changes += 1
        _resolve(results)
        if tx.touched_nodes:
            self.on_commit(tx.touched_nodes)
        for hook in self.on_committed:
            try:
                hook(tx)
            except Exception:  # committed and answered already: a hook's bug loses only itself
                log.exception("control loop: an after-commit hook failed; carrying on")
        if tx.moves:
            hooks = [self.on_moves] if self.on_moves is not None else []
            for hook in [*hooks, *self.move_watchers]:
                try:
                    hook(tx)
                except Exception:  # committed and answered: a hook's bug loses only itself
                    log.exception("control loop: an after-commit hook failed; carrying on")
        return False, None

    def _reload(self) -> None:
        """Rebuild the mirror in place (readers hold references to it) from the database,
        as a restart would: what was committed is all there is."""
        fresh = Mirror(self.mirror.settings)
        for f in dataclasses.fields(Mirror):
            if f.name != "leases":  # the event loop may hold it now
                setattr(self.mirror, f.name, getattr(fresh, f.name))
        self.load()


def _resolve(results: list[tuple[_Op, Any, BaseException | None]]) -> None:
    """Answer each operation's caller: threads' futures here, each event loop's in one
    callback on that loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Op, Any, BaseException | None]]] = {}
    for item in results:
        future = item[0].future
        if isinstance(future, asyncio.Future):
            by_loop.setdefault(future.get_loop(), []).append(item)
        elif not future.done():
            _settle(future, item[1], item[2])
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits
            loop.call_soon_threadsafe(_settle_all, items)


def _settle_all(items: list[tuple[_Op, Any, BaseException | None]]) -> None:
    for op, value, error in items:
        if not op.future.done():  # a caller that went away cancelled its future
            _settle(op.future, value, error)


def _settle(
    future: Future[Any] | asyncio.Future[Any], value: Any, error: BaseException | None
) -> None:
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def _core_team(team: Any) -> Team:
    return Team(
        name=team.name,
        quota=team.quota_gpus,
        cohort=team.cohort,
        borrowing_limit=team.borrowing_limit,
        weight=team.weight,
    )


def _mark_array_throttle(m: Mirror) -> None:
    """Which array tasks may be queued: at most `max_parallel` of one array at a time."""
    by_array: dict[int, list[int]] = {}
    for rec in m.jobs.values():
        if rec.hold is not None and not rec.placement:
            rec.in_core = False  # held: queued when released (corestate.rebuild knows it)
            continue
        if rec.array_job_id is None or rec.spec.array is None:
            rec.in_core = True
            continue
        by_array.setdefault(rec.array_job_id, []).append(rec.id)
    for ids in by_array.values():
        limit = m.jobs[ids[0]].spec.array
        cap = limit.max_parallel if limit and limit.max_parallel else len(ids)
        active = [i for i in ids if m.jobs[i].placement]
        free = max(0, cap - len(active))
        for i in sorted(ids):
            rec = m.jobs[i]
            if rec.placement:
                rec.in_core = True
            elif free > 0:
                rec.in_core = True
                free -= 1
            else:
                rec.in_core = False
                rec.reason, rec.reason_message = (
                    "JobArrayTaskLimit",
                    f"array {rec.array_job_id} runs at most {cap} tasks at once",
                )
