"""Chaos: while ledger jobs stream into a LocalCluster, a seeded driver crashes nodes,
freezes agents, kills ranks, restarts the head and injects GPU faults; then it checks the
fault-tolerance invariants (docs/fault-tolerance.md) on the head's answers and the ledgers.

    report = run_chaos(tmp_dir, ChaosConfig(seed=1, duration_s=40))
    assert report.ok, report.to_json()

Used by tests/e2e/test_chaos.py (short) and bench/chaos.py (long). Every process the run
starts is stopped when it returns or raises.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from phalanx.api.models import JobSpec, UserCreate
from phalanx.client.api import ApiError
from phalanx.local.cluster import LocalCluster
from phalanx.testing import workload
from phalanx.testing.audit import Submission, audit, ledger_env, settle, submission_counts
from phalanx.testing.faults import ACTIONS, Faults, retry
from phalanx.testing.invariants import Verdict

# (nodes, GPUs per node, weight): mostly one node, a share of 2-node gangs.
SHAPES = ((1, 1, 0.4), (1, 2, 0.25), (2, 1, 0.2), (2, 2, 0.15))
NAME_PREFIX = "chaos-"


@dataclass(frozen=True)
class ChaosConfig:
    """One chaos run. The head's settings default to a short lease (the lead's FT tests)."""

    seed: int = 0
    duration_s: float = 40.0  # chaos and submissions
    settle_s: float = 30.0  # then wait this long for jobs to end before cancelling the rest
    nodes: int = 4
    gpus_per_node: int = 2
    heartbeat_s: float = 0.5
    lease_s: float = 2.0
    requeue_margin_s: float = 1.0
    kill_grace_s: float = 2.0
    submit_every_s: float = 0.8  # mean time between submissions
    fault_every_s: float = 3.0  # mean time between chaos actions
    warmup_s: float = 3.0  # no chaos before this (jobs get going)
    min_steps: int = 15
    max_steps: int = 50
    step_s: float = 0.1
    max_restarts: int = 20
    min_healthy_nodes: int = 2  # never disturb a node if fewer would be left untouched
    weights: tuple[float, ...] = (3.0, 2.0, 3.0, 1.5, 1.5, 1.5)  # in ACTIONS order
    # Unix accounts the jobs run as, taking turns (each a Phalanx user of the same name;
    # the agents must run as root). Empty: every job runs as the cluster's own account.
    users: tuple[str, ...] = ()

    def head_args(self) -> list[str]:
        """`phalanx head` flags for these settings (the hang check is off)."""
        return [
            *("--heartbeat", str(self.heartbeat_s), "--lease", str(self.lease_s)),
            *("--requeue-margin", str(self.requeue_margin_s)),
            *("--kill-grace", str(self.kill_grace_s), "--hang-timeout", "0"),
        ]

    def validate(self) -> None:
        """Raise ValueError naming the setting that cannot work."""
        if len(self.weights) != len(ACTIONS) or min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError(f"weights: {len(ACTIONS)} non-negative numbers for {ACTIONS}")
        if self.nodes < 2 or self.min_healthy_nodes < 2 or self.min_healthy_nodes > self.nodes:
            raise ValueError("need nodes ≥ min_healthy_nodes ≥ 2 (2-node jobs must still run)")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError("need 1 ≤ min_steps ≤ max_steps")
        if min(self.duration_s, self.settle_s, self.submit_every_s, self.fault_every_s) <= 0:
            raise ValueError("durations and intervals must be positive")
        for user in self.users:
            try:
                pwd.getpwnam(user)
            except KeyError:
                raise ValueError(f"users: no Unix account {user!r} on this machine") from None
        if self.users and os.geteuid() != 0:
            raise ValueError("users: jobs run as other accounts only under root agents")


@dataclass
class ChaosReport:
    """What a run did and found; `ok` when every invariant held."""

    config: ChaosConfig
    state_dir: Path
    wall_s: float = 0.0
    actions: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)  # chosen, but nothing to hit
    timeline: list[str] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)
    final_states: Counter[str] = field(default_factory=Counter)
    restarts: int = 0
    runs: int = 0  # (job, epoch, rank) processes seen in the ledgers
    ledger_owners: Counter[str] = field(default_factory=Counter)  # Unix account → ledgers
    unacknowledged: int = 0  # jobs the head has for submits whose answer never came
    leftover_processes: int = 0  # job processes still alive after the cluster stopped
    invariants: list[Verdict] = field(default_factory=list)
    evidence: dict[int, list[str]] = field(default_factory=dict)  # job → its event log
    errors: list[str] = field(default_factory=list)  # the driver could not do its part

    @property
    def ok(self) -> bool:
        """Every invariant checked and held, and the driver ran to the end."""
        return bool(self.invariants) and all(v.ok for v in self.invariants) and not self.errors

    def to_json(self) -> dict[str, Any]:
        """One JSON-ready object: counts, the invariants' results, evidence."""
        return {
            "ok": self.ok,
            "seed": self.config.seed,
            "wall_s": round(self.wall_s, 1),
            "config": asdict(self.config),
            "actions": dict(sorted(self.actions.items())),
            "skipped_actions": dict(sorted(self.skipped.items())),
            **submission_counts(self.submissions),
            "unacknowledged_in_head": self.unacknowledged,
            "final_states": dict(sorted(self.final_states.items())),
            "restarts": self.restarts,
            "runs": self.runs,
            "ledger_owners": dict(sorted(self.ledger_owners.items())),
            "invariants": {v.name: v.to_json() for v in self.invariants},
            "evidence": {str(k): v for k, v in self.evidence.items()},
            "errors": self.errors,
            "leftover_processes": self.leftover_processes,
            "state_dir": str(self.state_dir),
            "timeline": self.timeline,
        }


def run_chaos(
    state_dir: Path, config: ChaosConfig, say: Callable[[str], None] | None = None
) -> ChaosReport:
    """Run the chaos in `state_dir` (cluster state, logs, job ledgers) and check the
    invariants; `say` gets progress lines. A failure of the run itself (the cluster did not
    start, a node never came back) is in `errors`. Raises ValueError for a config that
    cannot work."""
    config.validate()
    return _Driver(Path(state_dir).resolve(), config, say or (lambda _m: None)).run()


class _Driver:
    def __init__(self, state_dir: Path, config: ChaosConfig, say: Callable[[str], None]) -> None:
        self.dir = state_dir
        self.cfg = config
        self.say = say
        self.rng = random.Random(config.seed)
        self.report = ChaosReport(config, state_dir)
        self.cluster = LocalCluster(
            state_dir / "cluster",
            nodes=config.nodes,
            gpus_per_node=config.gpus_per_node,
            head_args=config.head_args(),
            users_map_to_self=not config.users,  # with users: each runs as its own account
        )
        self.stop = threading.Event()
        self._tokens: dict[str, str] = {}  # each of config.users: its API token
        self.faults: Faults | None = None
        self.t0 = self.started = time.monotonic()

    # ------------------------------------------------------------------ the run
    def run(self) -> ChaosReport:
        url = ""
        try:
            self.cluster.start()
            url = self.cluster.url
            self.t0 = time.monotonic()  # chaos time counts from here
            self.say(f"cluster up: {self.cfg.nodes} nodes × {self.cfg.gpus_per_node} GPUs")
            self.client = self.cluster.client()
            self.faults = Faults(
                self.cluster,
                self.client,
                self.rng,
                prefix=NAME_PREFIX,
                ledger=self._ledger,
                requeue_s=self.cfg.lease_s + self.cfg.requeue_margin_s,
                min_healthy=self.cfg.min_healthy_nodes,
                note=self._note,
            )
            with self.client:
                self._tokens = self._add_users()
                submitter = threading.Thread(target=self._submit_loop, name="chaos-submit")
                submitter.start()
                try:
                    self._chaos_loop(self.faults, self.t0 + self.cfg.duration_s)
                finally:
                    self.stop.set()
                    submitter.join()
                self._recover_all(self.faults)
                self._settle()
                self._check()
        except Exception as exc:  # reported (ok is False), with where it happened
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.report.errors.append(
                f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})"
            )
        finally:
            if self.faults is not None:
                self.faults.thaw_all()
            self.cluster.stop()
            self.report.leftover_processes = workload.kill_job_processes(url) if url else 0
            self.report.wall_s = time.monotonic() - self.started
        return self.report

    def _note(self, action: str, detail: str) -> None:
        line = f"{time.monotonic() - self.t0:6.1f}s ({time.time():.3f}) {action} {detail}"
        self.report.timeline.append(line)
        self.say(line)

    # ------------------------------------------------------------------ submissions
    def _add_users(self) -> dict[str, str]:
        """The Phalanx user of each Unix account in `users` (team default) and its token;
        the run's folders open to them (each job's own folder is its user's)."""
        tokens = {}
        for user in self.cfg.users:
            with contextlib.suppress(ApiError):  # 409: made by an earlier run on this head
                self.client.create_user(UserCreate(name=user, teams=["default"]))
            tokens[user] = self.client.create_token(user).token
        if self.cfg.users:
            for folder in (self.dir, self.dir / "jobs"):
                folder.mkdir(parents=True, exist_ok=True)
                folder.chmod(0o755)
        return tokens

    def _submit_loop(self) -> None:
        rng = random.Random(self.cfg.seed * 7919 + 1)  # its own stream: shapes don't shift
        deadline = time.time() + self.cfg.duration_s + self.cfg.settle_s + 300
        shapes = [(n, g) for n, g, _ in SHAPES]
        weights = [w for _, _, w in SHAPES]
        users = list(self.cfg.users)
        clients = {u: self.cluster.client(self._tokens[u]) for u in users}
        with self.cluster.client() as client, contextlib.ExitStack() as stack:
            for c in clients.values():
                stack.enter_context(c)
            seq = 0
            while not self.stop.wait(rng.uniform(0.5, 1.5) * self.cfg.submit_every_s):
                seq += 1
                nodes, gpus = rng.choices(shapes, weights)[0]
                workdir = self.dir / "jobs" / f"{seq:04d}"
                workdir.mkdir(parents=True)
                sub = Submission(
                    seq,
                    f"{NAME_PREFIX}{seq}",
                    workdir,
                    rng.randint(self.cfg.min_steps, self.cfg.max_steps),
                    nodes,
                    gpus,
                    user=users[seq % len(users)] if users else None,
                )
                if sub.user is not None:  # the job writes its ledger as its own user
                    account = pwd.getpwnam(sub.user)
                    os.chown(workdir, account.pw_uid, account.pw_gid)
                spec = JobSpec(
                    name=sub.name,
                    command=workload.command(sub.steps, self.cfg.step_s),
                    workdir=str(workdir),
                    env=ledger_env(sub, deadline),
                    nodes=nodes,
                    gpus_per_node=gpus,
                    max_restarts=self.cfg.max_restarts,
                    restart_on_failure=rng.random() < 0.5,
                )
                sub.submit(clients[sub.user] if sub.user is not None else client, spec)
                self.report.submissions.append(sub)

    # ------------------------------------------------------------------ chaos
    def _ledger(self, job_id: int) -> Path | None:
        for s in list(self.report.submissions):
            if s.job_id == job_id:
                return s.ledger
        return None

    def _chaos_loop(self, faults: Faults, until: float) -> None:
        next_action = self.t0 + self.cfg.warmup_s
        while time.monotonic() < until:
            faults.recover()
            if time.monotonic() >= next_action:
                action = self.rng.choices(ACTIONS, self.cfg.weights)[0]
                if faults.act(action):
                    self.report.actions[action] += 1
                else:
                    self.report.skipped[action] += 1
                next_action = time.monotonic() + self.rng.uniform(0.5, 1.5) * self.cfg.fault_every_s
            time.sleep(0.05)

    def _recover_all(self, faults: Faults) -> None:
        """Undo every disturbance, then wait until every node is up again."""
        faults.recover(everything=True)
        deadline = time.monotonic() + 60

        def all_up() -> bool:
            nodes = retry(self.client.nodes).nodes
            for n in nodes:
                if n.state in ("drain", "draining"):  # a late XID 79 drained it
                    faults.resume(n.name)
            return len(nodes) == self.cfg.nodes and all(n.state == "up" for n in nodes)

        while not all_up():
            if time.monotonic() > deadline:
                raise RuntimeError("nodes not all up 60 s after the chaos stopped")
            time.sleep(0.2)
        self.say("chaos over: every node up")

    def _settle(self) -> None:
        """Let jobs finish for settle_s; cancel what is left; wait until all have ended."""
        settle(self.client, self.report.submissions, NAME_PREFIX, self.cfg.settle_s, self.say)

    # ------------------------------------------------------------------ invariants
    def _check(self) -> None:
        found = audit(self.client, self.report.submissions, NAME_PREFIX)
        self.report.unacknowledged = found.unacknowledged
        self.report.final_states = found.final_states
        self.report.restarts = found.restarts
        self.report.runs = len(found.lives)
        self.report.ledger_owners = found.ledger_owners
        self.report.invariants = found.invariants
        self.report.evidence = found.evidence
