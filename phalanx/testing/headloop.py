"""The head's control loop in process, on a fake clock: its real lifecycle code and a real
SQLite store, no HTTP and no agent processes — the test plays the agents. Events in
(submits, heartbeats, exits, silence, time, a restart), transitions and effects out.

    loop = HeadLoop(tmp_path, Settings(lease_s=8.0))
    loop.join("n1")
    job = loop.submit(command=["train"])
    loop.advance(1.0)
    assert loop.moves(job) == [("PD", "R")]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine

from phalanx.api.models import (
    GpuInfo,
    Heartbeat,
    JobEvent,
    JobProgress,
    JobSpec,
    NodeHealth,
    ProcessStatus,
    RegisterRequest,
    TeamSpec,
)
from phalanx.head import db, jobcontrol, jobs, nodestates, reports, store
from phalanx.head.auth import Principal
from phalanx.head.control import ControlThread
from phalanx.head.migrate import upgrade
from phalanx.head.mirror import Mirror, Settings, Tx
from phalanx.head.records import JobRecord
from phalanx.testing.clock import FakeClock

T = TypeVar("T")
USER = Principal(kind="api", token_id=0, user="alice", admin=True, teams=frozenset({"default"}))


@dataclass
class _Rank:
    pid: int
    started: float
    exit_code: int | None = None  # set: it exited with this code
    signal: int | None = None


@dataclass
class FakeAgent:
    """One node's well-behaved agent: it runs every rank of what the head wants there,
    stops what the head no longer wants, and reports; a test makes ranks exit or the whole
    node go silent."""

    name: str
    silent: bool = False
    ranks: dict[tuple[int, int, int], _Rank] = field(default_factory=dict)  # (job, epoch, rank)


class HeadLoop:
    """A head (mirror, store, lifecycle, scheduler) driven by hand on a fake clock."""

    def __init__(
        self, state_dir: Path, settings: Settings | None = None, clock: FakeClock | None = None
    ) -> None:
        self.settings = settings or Settings()
        self.clock = clock or FakeClock()
        state_dir.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = db.make_engine(db.default_url(state_dir))
        upgrade(self.engine)
        with self.engine.begin() as conn:
            store.put_team(conn, TeamSpec(name="default"), self.clock.time())
        self.agents: dict[str, FakeAgent] = {}
        self._pids = 1000
        self._next_heartbeat = 0.0
        self.control = self._start()

    def _start(self) -> ControlThread:
        control = ControlThread(self.engine, self.settings, self.clock)
        control.load()
        control.run_now(tick=True)
        return control

    @property
    def mirror(self) -> Mirror:
        return self.control.mirror

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ events in
    def op(self, fn: Callable[[Tx], T]) -> T:
        """Run `fn(tx)` as one operation of the control loop (with a scheduling cycle)."""
        result: T = self.control.run_now(fn)  # type: ignore[assignment]  # fn given: its T
        return result

    def join(self, name: str, gpus: int = 1, **labels: str) -> None:
        """Node `name` registers (or rejoins) with `gpus` fake GPUs."""
        infos = [
            GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model="H100", memory_mb=81920)
            for i in range(gpus)
        ]
        req = RegisterRequest(
            name=name,
            address=name,
            agent_url=f"https://{name}:1",
            agent_secret="s" * 32,
            cpus=8,
            memory_mb=65536,
            gpus=infos,
            labels=labels,
        )
        self.op(lambda tx: nodestates.register(self.mirror, tx, req, tx.now))
        self.agents.setdefault(name, FakeAgent(name)).silent = False

    def submit(self, qos: str = "normal", **spec: Any) -> int:
        """Submit a job (JobSpec fields; a `command` and `workdir` are filled in)."""
        spec.setdefault("command", ["train"])
        spec.setdefault("workdir", "/work")
        job = JobSpec(qos=qos, **spec)
        return int(self.op(lambda tx: jobs.submit(self.mirror, tx, USER, job)).job_ids[0])

    def cancel(self, job_id: int) -> None:
        self.op(lambda tx: jobcontrol.cancel(self.mirror, tx, USER, str(job_id)))

    def exit(self, job_id: int, rank: int, code: int = 0, signal: int | None = None) -> None:
        """Rank `rank` of the job's current epoch exits (reported at the next heartbeat)."""
        rec = self.mirror.jobs[job_id]
        self._rank(rec, rank).exit_code = code
        self._rank(rec, rank).signal = signal

    def progress(self, job_id: int, rank: int, step: int) -> None:
        """The job's rank reports training progress (as phalanx.train does)."""
        with self.control.lock:
            rec = self.mirror.jobs[job_id]
            rec.progress[rank] = JobProgress(rank=rank, step=step, time=self.clock.time())
            rec.progress_at[rank] = self.clock.time()

    def silence(self, node: str) -> None:
        """The node stops heartbeating (it died, or its network did)."""
        self.agents[node].silent = True

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass: the loop ticks every tick_s and every agent that is not
        silent heartbeats every heartbeat_s with what it runs."""
        end = self.clock.time() + seconds
        tick = self.settings.tick_s
        while self.clock.time() + tick <= end + 1e-9:
            self.clock.advance(tick)
            if self.clock.time() + 1e-9 >= self._next_heartbeat:
                self._next_heartbeat = self.clock.time() + self.settings.heartbeat_s
                for agent in self.agents.values():
                    if not agent.silent:
                        self.heartbeat(agent.name)
            self.control.run_now(tick=True)
        rest = end - self.clock.time()
        if rest > 0:
            self.clock.advance(rest)

    def pause(self, seconds: float) -> None:
        """The head itself stops (SIGSTOP, a frozen VM) for `seconds`; nobody is heard."""
        self.clock.advance(seconds)

    def restart(self) -> None:
        """The head process dies and starts again on its database: all it knew in memory
        (heartbeat times, rank reports) is gone."""
        self.control = self._start()

    def heartbeat(self, node: str) -> None:
        """`node`'s agent reports now: its ranks of what the head wants there (started if
        new), and what it stopped."""
        agent = self.agents[node]
        rec_node = self.mirror.nodes[node]
        wanted: set[tuple[int, int]] = set()
        for job_id in sorted(self.mirror.node_jobs.get(node, set())):
            rec = self.mirror.jobs.get(job_id)
            if rec is None or rec.stopping is not None or not rec.state.running:
                continue
            wanted.add((rec.id, rec.epoch))
            index = [n for n, _ in rec.placement].index(node)
            for rank in rec.expected_ranks(index):
                self._rank(rec, rank)
        processes = []
        for (job_id, epoch, rank), r in sorted(agent.ranks.items()):
            if (job_id, epoch) not in wanted and r.exit_code is None and r.signal is None:
                r.signal = 15  # stopped: no longer in the desired state
            processes.append(
                ProcessStatus(
                    job_id=job_id,
                    epoch=epoch,
                    rank=rank,
                    local_rank=rank,
                    pid=r.pid,
                    running=r.exit_code is None and r.signal is None,
                    exit_code=r.exit_code,
                    signal=r.signal,
                    started_at=r.started,
                )
            )
        hb = Heartbeat(
            name=node, version=rec_node.version, processes=processes, health=NodeHealth()
        )
        self.op(lambda tx: reports.heartbeat(self.mirror, tx, self.mirror.nodes[node], hb, tx.now))

    def _rank(self, rec: JobRecord, rank: int) -> _Rank:
        node = self._node_of(rec, rank)
        key = (rec.id, rec.epoch, rank)
        ranks = self.agents[node].ranks
        if key not in ranks:
            self._pids += 1
            ranks[key] = _Rank(self._pids, self.clock.time())
        return ranks[key]

    @staticmethod
    def _node_of(rec: JobRecord, rank: int) -> str:
        for i, (node, _) in enumerate(rec.placement):
            if rank in rec.expected_ranks(i):
                return node
        raise KeyError(f"job {rec.id} has no rank {rank} in epoch {rec.epoch}")

    # ------------------------------------------------------------------ what came out
    def events(self, job_id: int) -> list[JobEvent]:
        """The job's event log, as `phalanx show` reads it."""
        with self.engine.connect() as conn:
            return store.job_events(conn, job_id)

    def moves(self, job_id: int) -> list[tuple[str, str]]:
        """The job's state transitions, (from, to), in order."""
        return [(e.from_state or "", e.to_state) for e in self.events(job_id) if e.to_state]

    def kinds(self, job_id: int) -> list[str]:
        return [e.kind for e in self.events(job_id)]

    def state(self, job_id: int) -> str:
        rec = self.mirror.jobs.get(job_id)
        if rec is not None:
            return rec.state.value
        with self.engine.connect() as conn:
            ended = store.job(conn, job_id)
        assert ended is not None, f"no job {job_id}"
        return ended.state.value

    def job(self, job_id: int) -> JobRecord:
        rec = self.mirror.jobs.get(job_id)
        if rec is None:
            with self.engine.connect() as conn:
                rec = store.job(conn, job_id)
        assert rec is not None, f"no job {job_id}"
        return rec

    def node_state(self, node: str) -> str:
        return self.mirror.nodes[node].state.value

    def node_moves(self, node: str) -> list[tuple[str, str]]:
        """The node's state transitions, (from, to), in order."""
        with self.engine.connect() as conn:
            return store.node_moves(conn, node)
