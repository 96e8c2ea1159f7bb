"""The head's live state in memory (jobs, nodes, teams, the core's ClusterState) and the
transaction every change to it is written through."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from phalanx.core import ClusterState, Decisions, JobTransition, NodeTransition, Team
from phalanx.head import store
from phalanx.head.answers import DesiredAnswers
from phalanx.head.deltas import HeldReports
from phalanx.head.leases import Leases
from phalanx.head.records import JobRecord, NodeRecord


@dataclass(slots=True, frozen=True)
class Settings:
    """The head's timing knobs (`phalanx head --help`; docs/fault-tolerance.md)."""

    heartbeat_s: float = 2.0
    # Heartbeats a second the head budgets for: past `heartbeat_s × heartbeat_rate` nodes
    # agents are told to heartbeat less often, within their lease (head/intervals.py).
    heartbeat_rate: float = 1500.0
    # A node with no heartbeat for this long is marked down; its agent stops its jobs when
    # it has not heard from the head for as long (fencing), so the head requeues them only
    # once `lease_s + requeue_margin_s` have passed: a job never runs as two copies.
    lease_s: float = 8.0
    requeue_margin_s: float = 2.0
    # The head's own backlog is not a node's silence (head/overload.py): a lease is judged
    # against the time up to which the head could hear, at most this far behind now (0:
    # the wall clock alone). A dead node is down by lease_s + this at the latest.
    overload_grace_s: float = 30.0
    # Past this backlog (seconds), the head answers users' submits and reads 503 with
    # Retry-After, so that heartbeats get the head first (head/shedding.py; 0: never).
    shed_backlog_s: float = 2.0
    kill_grace_s: float = 5.0  # SIGTERM → SIGKILL when a job is stopped
    preempt_grace_s: float = 60.0  # a preemption notice → the kill (jobs may override)
    hang_timeout_s: float = 600.0  # no progress report for this long → restart (0: off)
    tick_s: float = 0.5
    public_url: str = ""
    # A personal cluster (`phalanx up`): users without an explicit uid run as the head's
    # own Unix account rather than the account with their name (docs/security.md).
    users_map_to_self: bool = False
    # Identity and limits (docs/security.md).
    api_token_ttl_s: float = 90 * 86400.0  # a user's API token, unless it asks (0: never)
    join_token_ttl_s: float = 86400.0  # a join token, unless it asks; the first-start one
    max_queued_per_user: int = 10_000  # live jobs (PD, R, CG, PR) a user may have (0: no cap)
    max_spec_bytes: int = 256 * 1024  # a submitted JobSpec's JSON
    # Agents keep their jobs through a head outage this long (when their peers confirm the
    # head is out rather than they are cut off: docs/fault-tolerance.md#head-outages).
    max_outage_s: float = 720.0  # a 10-minute outage, plus the head's own restart
    # Where job notifications may be posted (head/notify.py): hosts or URL prefixes;
    # ("none",): nowhere. The default is this machine only.
    notify_allow: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")
    # Telemetry retention (head/tsdb.py): raw samples, minute and hour rollups, in days.
    telemetry_raw_days: float = 7.0
    telemetry_minute_days: float = 30.0
    telemetry_hour_days: float = 365.0


@dataclass(slots=True)
class Mirror:
    """Everything live, owned by the control thread (readers take the lock)."""

    settings: Settings
    jobs: dict[int, JobRecord] = field(default_factory=dict)  # non-terminal jobs only
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    teams: dict[str, Team] = field(default_factory=dict)
    node_jobs: dict[str, set[int]] = field(default_factory=dict)  # node → jobs placed there
    core: ClusterState | None = None
    decisions: Decisions | None = None  # the last cycle's, for pending reasons
    core_dirty: bool = True
    node_failures: dict[str, list[float]] = field(default_factory=dict)  # node → when
    unix_accounts: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    next_job_id: int = 1
    version: int = 0
    live_per_user: dict[str, int] = field(default_factory=dict)  # user → jobs in `jobs`
    team_qos: dict[str, frozenset[str]] = field(default_factory=dict)  # teams that set one
    # Head outages (head/peers.py): each node's peers as last computed, as last sent to it,
    # and when they were computed (control-thread monotonic seconds).
    peer_lists: dict[str, list[str]] = field(default_factory=dict)
    peers_sent: dict[str, list[str]] = field(default_factory=dict)
    peers_at: float | None = None
    # Heartbeats at scale: each node's last reports, the base of its deltas (head/deltas.py),
    # and each node's answer serialized once per change (head/answers.py). Here so that a
    # rebuilt mirror (a rolled-back batch, a restart) starts them afresh with it.
    held: HeldReports = field(default_factory=HeldReports)
    answers: DesiredAnswers = field(default_factory=DesiredAnswers)
    # Orders the event loop's lease renewals against the clock's down decisions
    # (head/leases.py); kept across a rebuilt mirror.
    leases: Leases = field(default_factory=Leases)

    def bump(self, tx: Tx, node: str) -> None:
        """What `node` must run changed: a new desired-state version wakes its long poll."""
        self.version += 1
        rec = self.nodes.get(node)
        if rec is not None:
            rec.version = self.version
        tx.touched_nodes.add(node)

    def addresses(self) -> dict[str, str]:
        return {n.name: n.address for n in self.nodes.values()}


class Tx:
    """One database transaction of the control thread; events are written in one batch.

    The connection comes from `connect` on first use, so a batch of operations that changed
    nothing durable (most heartbeats) never touches the database. The caller owns it: after
    `commit` or `rollback`, `connection` is open with no transaction, to reuse or close.
    """

    def __init__(self, connect: Callable[[], Connection], now: float) -> None:
        self._connect = connect
        self.now = now  # the head's clock when the batch began: every change in it is "now"
        self.connection: Connection | None = None
        self._events: list[dict[str, Any]] = []
        self._new_jobs: list[JobRecord] = []
        self.kick = False  # run a scheduling cycle before committing
        self.touched_nodes: set[str] = set()
        # The state transitions of this transaction, in order (what tests and watchers read),
        # and the jobs that moved (job notifications read them after the commit).
        self.moves: list[JobTransition | NodeTransition] = []
        self.moved_jobs: dict[int, JobRecord] = {}
        self.cycle_s: float | None = None  # how long this batch's scheduling cycle took

    @property
    def conn(self) -> Connection:
        if self.connection is None:
            self.connection = self._connect()
            self.connection.begin()
        return self.connection

    def event(
        self,
        now: float,
        kind: str,
        message: str,
        job_id: int | None = None,
        node: str | None = None,
        move: JobTransition | NodeTransition | None = None,
    ) -> None:
        """Record an event; `move` is the state transition it reports, stored typed."""
        row: dict[str, Any] = {
            "time": now,
            "kind": kind,
            "message": message,
            "job_id": job_id,
            "node": node,
            "from_state": None,
            "to_state": None,
            "epoch": None,
        }
        if move is not None:
            row["from_state"] = move.from_state.value
            row["to_state"] = move.to_state.value
            if isinstance(move, JobTransition):
                row["epoch"] = move.epoch
            self.moves.append(move)
        self._events.append(row)

    def insert_jobs(self, records: list[JobRecord]) -> None:
        """New jobs, inserted together at commit (one statement for a whole batch)."""
        self._new_jobs.extend(records)
        self.conn  # noqa: B018  # open the transaction now so the batch is one commit

    def flush(self) -> None:
        """Write buffered new jobs now (before statements that update them)."""
        if self._new_jobs:
            store.insert_jobs(self.conn, self._new_jobs)
            self._new_jobs = []

    def update_job(self, rec: JobRecord) -> None:
        self.flush()
        store.update_job(self.conn, rec)

    def commit(self) -> None:
        self.flush()
        if self._events:
            store.insert_events(self.conn, self._events)
            self._events = []
        if self.connection is not None:
            self.connection.commit()

    def rollback(self) -> None:
        if self.connection is not None:
            self.connection.rollback()
