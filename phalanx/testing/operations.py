"""Routine operations under load (issue 12): while ledger jobs run on a LocalCluster with a
PostgreSQL database and a standby head, the head is killed and restarted, frozen, and taken
over by the standby, and the agents are upgraded one by one to a newer release. None of it
may kill a job; the chaos invariants must hold too.

    report = run_operations(tmp_dir, OperationsConfig(operations=OPERATIONS[:3]))
    assert report.ok, report.to_json()

Used by tests/e2e/test_operations_chaos.py (short) and `bench/chaos.py --operations`
(long: a 60 s outage, the head's default lease). Every process the run starts is stopped
when it returns or raises.
"""

from __future__ import annotations

import math
import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from phalanx.api.models import JobSpec
from phalanx.local.cluster import LocalCluster
from phalanx.testing import newer_agent, workload
from phalanx.testing.audit import Audit, Submission, audit, ledger_env, settle, submission_counts
from phalanx.testing.continuity import Running, disturbed, running_jobs
from phalanx.testing.faults import retry
from phalanx.testing.invariants import check_none_killed
from phalanx.testing.postgres import PostgresServer
from phalanx.testing.processes import pid_alive
from phalanx.testing.routine import HEAD_OPERATIONS, Routine, wait

OPERATIONS = ("head_restart", "head_pause", "failover", "agent_upgrade")
# The agent of the next release (API 1.99, fields this one does not know), as
# LocalCluster.upgrade_agent starts it in place of a node's agent.
NEWER_AGENT = tuple(newer_agent.argv_prefix("1.99"))
NAME_PREFIX = "ops-"


@dataclass(frozen=True)
class OperationsConfig:
    """One run. The head's settings default to a lease of 4 s, half the head's default:
    short, yet an agent's peer check (min(0.75 s, lease/8) before its deadline) gets 0.5 s.
    With the chaos run's 2 s lease it gets 0.25 s, and one stall of a busy shared machine
    during a minute-long outage made every agent's check time out and fence (seen once)."""

    operations: tuple[str, ...] = OPERATIONS  # done in this order
    outage_s: float = 16.0  # the head is down this long after kill -9, and frozen this long
    baseline_s: float = 10.0  # short jobs run this long before the first operation
    settle_s: float = 60.0  # then jobs get this long to end before the rest are cancelled
    nodes: int = 3
    gpus_per_node: int = 2
    heartbeat_s: float = 1.0
    lease_s: float = 4.0
    requeue_margin_s: float = 1.0
    kill_grace_s: float = 2.0
    long_jobs: int = 2  # the first spans every node (1 GPU each), the others 1 GPU
    long_step_s: float = 0.2
    short_every_s: float = 2.5  # mean time between short jobs (1 or 2 nodes × 1 GPU)
    short_steps: tuple[int, int] = (10, 40)
    short_step_s: float = 0.1
    seed: int = 0
    db_url: str | None = None  # None: a throwaway PostgreSQL server of the run's own
    upgrade_argv: tuple[str, ...] = NEWER_AGENT

    @property
    def quiet_s(self) -> float:
        """Wait after each operation (once every node it touched heartbeats again): a head
        that wrongly counts a node silent requeues its jobs within a lease + margin of the
        node's last heartbeat, and an agent that gave up fences within its lease; two
        heartbeats more for the news to reach the head."""
        return self.lease_s + self.requeue_margin_s + 2 * self.heartbeat_s

    def budget_s(self) -> float:
        """How long the long jobs run at their pace: three times a generous guess at the
        operations (they are hurried to their end afterwards)."""
        guess = {
            "head_restart": self.outage_s + 30,
            "head_pause": self.outage_s + 15,
            "failover": 30.0,
            "agent_upgrade": 20.0 * self.nodes,
        }
        ops = sum(guess[o] + self.quiet_s for o in self.operations)
        return 3 * (self.baseline_s + ops) + 60

    def head_args(self) -> list[str]:
        """`phalanx head` flags for these settings (the hang check is off)."""
        return [
            *("--heartbeat", str(self.heartbeat_s), "--lease", str(self.lease_s)),
            *("--requeue-margin", str(self.requeue_margin_s)),
            *("--kill-grace", str(self.kill_grace_s), "--hang-timeout", "0"),
        ]

    def validate(self) -> None:
        """Raise ValueError naming the setting that cannot work."""
        unknown = sorted(set(self.operations) - set(OPERATIONS))
        if unknown:
            raise ValueError(f"operations: unknown {unknown}; known: {', '.join(OPERATIONS)}")
        if self.nodes < 3:
            raise ValueError("nodes: at least 3 (a node rides out a head outage on its peers)")
        long_gpus = self.nodes + self.long_jobs - 1
        if self.long_jobs < 1 or long_gpus >= self.nodes * self.gpus_per_node:
            raise ValueError("long_jobs: at least 1, leaving a GPU free for the short jobs")
        if self.outage_s <= 3 * (self.lease_s + self.requeue_margin_s):
            raise ValueError("outage_s: more than 3 × (lease + margin), or it tests nothing")
        if not 1 <= self.short_steps[0] <= self.short_steps[1]:
            raise ValueError("short_steps: 1 ≤ low ≤ high")
        if min(self.baseline_s, self.settle_s, self.short_every_s, self.long_step_s) <= 0:
            raise ValueError("durations and intervals must be positive")


@dataclass
class Step:
    """One operation done on one target (a head, or one node's agent), and its cost."""

    operation: str
    target: str
    at_s: float  # from the first operation's start
    wall_s: float = 0.0  # the operation itself, without the quiet wait after it
    timings: dict[str, Any] = field(default_factory=dict)
    leader_before: int | None = None  # the leading head's index (0: the first head)
    leader_after: int | None = None
    heads_exited: list[str] = field(default_factory=list)  # heads found dead, restarted
    running_before: int = 0  # jobs running on every rank when it began
    killed: list[str] = field(default_factory=list)  # how each of those jobs was disturbed

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["jobs_killed"] = len(self.killed)
        return out


@dataclass
class OperationsReport:
    """What a run did and found; `ok` when no job was killed and every invariant held."""

    config: OperationsConfig
    state_dir: Path
    wall_s: float = 0.0
    steps: list[Step] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)
    phases: dict[int, str] = field(default_factory=dict)  # submission seq → when submitted
    audit: Audit = field(default_factory=Audit)
    leftover_processes: int = 0
    timeline: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every operation ran, killed no job and stopped no head by itself; every
        invariant checked and held."""
        verdicts = self.audit.invariants
        harm = any(s.killed or s.heads_exited for s in self.steps)
        return bool(verdicts) and all(v.ok for v in verdicts) and not harm and not self.errors

    def turnaround_s(self) -> dict[str, float | None]:
        """Mean submit → end (the head's times) of the short jobs that ended CD, submitted
        before the first operation (`baseline`) and during the operations."""
        spans: dict[str, list[float]] = {"baseline": [], "operations": []}
        for sub in self.submissions:
            info = self.audit.head.get(sub.job_id) if sub.job_id is not None else None
            phase = self.phases.get(sub.seq)
            if info and info.end_time and info.state == "CD" and phase in spans:
                spans[phase].append(info.end_time - info.submit_time)
        return {k: (sum(v) / len(v) if v else None) for k, v in spans.items()}

    def to_json(self) -> dict[str, Any]:
        """One JSON-ready object: the operations and their cost, the invariants, evidence."""
        by_op: Counter[str] = Counter()
        for s in self.steps:
            by_op[s.operation] += len(s.killed)
        turnaround = self.turnaround_s()
        base, during = turnaround["baseline"], turnaround["operations"]
        found = self.audit
        return {
            "ok": self.ok,
            "wall_s": round(self.wall_s, 1),
            "config": asdict(self.config),
            "jobs_killed": sum(by_op.values()),
            "jobs_killed_by_operation": {o: by_op[o] for o in self.config.operations},
            "operations": [s.to_json() for s in self.steps],
            "short_job_turnaround_s": {k: _round(v) for k, v in turnaround.items()},
            "turnaround_ratio": _round(during / base if base and during else None),
            "outage_vs_lease": round(self.config.outage_s / self.config.lease_s, 1),
            **submission_counts(self.submissions),
            "unacknowledged_in_head": found.unacknowledged,
            "final_states": dict(sorted(found.final_states.items())),
            "restarts": found.restarts,
            "runs": len(found.lives),
            "invariants": {v.name: v.to_json() for v in found.invariants},
            "evidence": {str(k): v for k, v in found.evidence.items()},
            "errors": self.errors,
            "leftover_processes": self.leftover_processes,
            "state_dir": str(self.state_dir),
            "timeline": self.timeline,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def run_operations(
    state_dir: Path, config: OperationsConfig, say: Callable[[str], None] | None = None
) -> OperationsReport:
    """Run the operations in `state_dir` (cluster state, logs, job ledgers) and check that
    no job was killed and the invariants hold; `say` gets progress lines. A failure of the
    run itself (the cluster did not start, an operation could not be done) is in `errors`.
    Raises ValueError for a config that cannot work."""
    config.validate()
    return _Driver(Path(state_dir).resolve(), config, say or (lambda _m: None)).run()


class _Driver:
    def __init__(self, state_dir: Path, config: OperationsConfig, say: Callable[[str], None]):
        self.dir = state_dir
        self.cfg = config
        self.say = say
        self.report = OperationsReport(config, state_dir)
        self.stop = threading.Event()
        self.phase = "start"
        self.started = self.t0 = time.monotonic()
        self.deadline = time.time() + config.budget_s() + 600  # the jobs' own safety net
        self.seq = 0

    # ------------------------------------------------------------------ the run
    def run(self) -> OperationsReport:
        url = ""
        pg: PostgresServer | None = None
        try:
            db_url = self.cfg.db_url or (pg := PostgresServer().start()).url
            self.cluster = LocalCluster(
                self.dir / "cluster",
                nodes=self.cfg.nodes,
                gpus_per_node=self.cfg.gpus_per_node,
                db_url=db_url,
                standby=True,
                head_args=self.cfg.head_args(),
            )
            self.cluster.start()
            url = self.cluster.url
            self.say(f"cluster up: heads {url}, {self.cfg.nodes} nodes")
            with self.cluster.client() as self.client:
                self._run_jobs_through_operations()
                self._audit()
        except Exception as exc:  # reported (ok is False), with where it happened
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.report.errors.append(
                f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})"
            )
        finally:
            self.stop.set()
            if hasattr(self, "cluster"):
                self.cluster.stop()
            self.report.leftover_processes = workload.kill_job_processes(url) if url else 0
            if pg is not None:
                pg.stop()
            self.report.wall_s = time.monotonic() - self.started
        return self.report

    def _run_jobs_through_operations(self) -> None:
        long = [self._submit_long(k) for k in range(self.cfg.long_jobs)]
        wait("the long jobs to run on every rank", lambda: len(self._running()) == len(long))
        self.phase = "baseline"
        submitter = threading.Thread(target=self._submit_short, name="operations-submit")
        submitter.start()
        try:
            time.sleep(self.cfg.baseline_s)
            self.phase = "operations"
            self.t0 = time.monotonic()
            self._operate(self.cfg.operations)
        finally:
            self.stop.set()
            submitter.join()
        self.phase = "settle"
        for sub in long:  # their remaining steps run at once: they end at their last step
            (sub.workdir / "hurry").touch()
        settle(self.client, self.report.submissions, NAME_PREFIX, self.cfg.settle_s, self.say)

    def _operate(self, operations: tuple[str, ...]) -> None:
        routine = Routine(
            self.cluster,
            self.client,
            outage_s=self.cfg.outage_s,
            upgrade_argv=self.cfg.upgrade_argv,
        )
        for operation in operations:
            if operation != "agent_upgrade":
                action = getattr(routine, operation)
                self._step(operation, HEAD_OPERATIONS[operation], action)
                continue
            for address in self.cluster.addresses:  # one by one: a rolling upgrade
                self._step(operation, address, partial(routine.agent_upgrade, address))

    def _audit(self) -> None:
        found = audit(self.client, self.report.submissions, NAME_PREFIX)
        ranks = {s.job_id: s.ranks for s in self.report.submissions if s.job_id is not None}
        found.add(self.client, [check_none_killed(found.lives, found.head, ranks)])
        self.report.audit = found

    def _note(self, what: str, detail: str) -> None:
        line = f"{time.monotonic() - self.t0:6.1f}s ({time.time():.3f}) {what} {detail}"
        self.report.timeline.append(line)
        self.say(line)

    # ------------------------------------------------------------------ jobs
    def _new_submission(self, nodes: int, steps: int) -> Submission:
        self.seq += 1
        workdir = self.dir / "jobs" / f"{self.seq:04d}"
        workdir.mkdir(parents=True)
        sub = Submission(self.seq, f"{NAME_PREFIX}{self.seq}", workdir, steps, nodes, 1)
        self.report.phases[sub.seq] = self.phase
        return sub

    def _submit_long(self, k: int) -> Submission:
        """A job that runs through every operation: the first on every node (an agent
        upgrade always has a job under it), the others on one node."""
        steps = math.ceil(self.cfg.budget_s() / self.cfg.long_step_s)
        sub = self._new_submission(self.cfg.nodes if k == 0 else 1, steps)
        hurry = ("--hurry-file", str(sub.workdir / "hurry"))
        spec = JobSpec(
            name=sub.name,
            command=workload.command(steps, self.cfg.long_step_s, *hurry),
            workdir=str(sub.workdir),
            env=ledger_env(sub, self.deadline),
            nodes=sub.nodes,
            gpus_per_node=1,
            max_restarts=0,  # a restart is a job killed: let it show as a failure too
        )
        sub.submit(self.client, spec)
        self.report.submissions.append(sub)
        if sub.job_id is None:
            raise RuntimeError(f"the long job {sub.name} was refused: {sub.error}")
        return sub

    def _submit_short(self) -> None:
        """Jobs of 1–4 s that start and end before, during and between the operations."""
        rng = random.Random(self.cfg.seed)
        low, high = self.cfg.short_steps
        with self.cluster.client() as client:
            while not self.stop.wait(rng.uniform(0.5, 1.5) * self.cfg.short_every_s):
                sub = self._new_submission(2 if rng.random() < 0.3 else 1, rng.randint(low, high))
                spec = JobSpec(
                    name=sub.name,
                    command=workload.command(sub.steps, self.cfg.short_step_s),
                    workdir=str(sub.workdir),
                    env=ledger_env(sub, self.deadline),
                    nodes=sub.nodes,
                    gpus_per_node=1,
                    max_restarts=0,
                )
                sub.submit(client, spec)
                self.report.submissions.append(sub)

    def _running(self) -> dict[int, Running]:
        listed = retry(lambda: self.client.jobs(active=True, states=["R"])).jobs
        return running_jobs(listed, list(self.report.submissions), self.cluster.url)

    # ------------------------------------------------------------------ one step
    def _step(self, operation: str, target: str, action: Callable[[], dict[str, Any]]) -> None:
        """Do `action` with jobs running, wait out the requeue window, and record which of
        the jobs running before it were disturbed."""
        before = self._running()
        step = Step(operation, target, round(time.monotonic() - self.t0, 1))
        step.leader_before, step.running_before = self.cluster.leader(), len(before)
        self._note(operation, f"{target}: {len(before)} job(s) running on every rank")
        started = time.monotonic()
        step.timings = {k: round(v, 2) if isinstance(v, float) else v for k, v in action().items()}
        step.wall_s = round(time.monotonic() - started, 1)
        time.sleep(self.cfg.quiet_s)
        step.heads_exited = self._restart_exited_heads()
        step.leader_after = self.cluster.wait_leader()
        head = {j: retry(partial(self.client.job, j)).job for j in before}
        subs = {s.job_id: s for s in self.report.submissions if s.job_id in before}
        lives = [x for s in subs.values() for x in workload.lives(workload.read_ledger(s.ledger))]
        step.killed = disturbed(before, head, lives, pid_alive)
        self.report.steps.append(step)
        self._note(operation, f"{target}: done in {step.wall_s}s, {len(step.killed)} killed")

    def _restart_exited_heads(self) -> list[str]:
        """A head that died on its own is a finding: noted, and started again (as a
        standby) so that the next operation has both heads."""
        exited = []
        for index in range(2):
            code = self.cluster.head_returncode(index)
            if code is not None:
                exited.append(f"head {index} exited with status {code}")
                self.cluster.restart_head(index)
        return exited
