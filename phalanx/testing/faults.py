"""The chaos driver's actions on a LocalCluster (crash a node, freeze an agent, kill a rank,
restart the head, inject a GPU fault), each with its undoing scheduled for later."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from phalanx.api.models import FaultInjection, JobInfo
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.local.cluster import LocalCluster
from phalanx.testing import workload

T = TypeVar("T")
ACTIONS = ("crash_node", "freeze_agent", "kill_rank", "restart_head", "xid_critical", "xid_app")


def retry(call: Callable[[], T], timeout: float = 30.0) -> T:
    """`call()`, retried while the head cannot be reached (it may be restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except ApiError as exc:
            if (exc.status is not None and exc.status < 500) or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


class Faults:
    """Does the actions of ACTIONS on `cluster` and undoes them when due (`recover()`).

    Actions aim at jobs named `prefix…` that run (their ledger: `ledger(job_id)`), and
    never leave fewer than `min_healthy` nodes untouched. `requeue_s` (lease + requeue
    margin) sets how long a frozen agent stays frozen (past it) and how long a crashed
    node may stay down. `note(action, detail)` records what was done.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        client: PhalanxClient,
        rng: random.Random,
        *,
        prefix: str,
        ledger: Callable[[int], Path | None],
        requeue_s: float,
        min_healthy: int,
        note: Callable[[str, str], None],
    ) -> None:
        self.cluster = cluster
        self.client = client
        self.rng = rng
        self.prefix = prefix
        self.ledger = ledger
        self.requeue_s = requeue_s
        self.min_healthy = min_healthy
        self.note = note
        self.trouble: dict[str, str] = {}  # node → crashed | frozen | drained
        self.recoveries: list[tuple[float, str, str]] = []  # (due, what, node)

    def act(self, action: str) -> bool:
        """Do `action` (one of ACTIONS); False when it had nothing to hit."""
        if action not in ACTIONS:
            raise ValueError(f"unknown chaos action {action!r}; known: {', '.join(ACTIONS)}")
        done: bool = getattr(self, f"_{action}")()
        return done

    def running(self) -> list[JobInfo]:
        """The driver's running jobs, by id (none while the head cannot answer)."""
        try:
            jobs = self.client.jobs(active=True, states=["R"]).jobs
        except ApiError:
            return []
        return sorted((j for j in jobs if j.name.startswith(self.prefix)), key=lambda j: j.id)

    def _healthy(self) -> list[str]:
        return [n for n in self.cluster.addresses if n not in self.trouble]

    def _victim_node(self) -> str | None:
        """A node without trouble, preferring one that runs a job; None if touching one
        would leave fewer than min_healthy nodes untouched."""
        healthy = self._healthy()
        if len(healthy) <= self.min_healthy:
            return None
        busy = sorted({p.node for j in self.running() for p in j.placement} & set(healthy))
        return self.rng.choice(busy or healthy)

    def _later(self, delay: float, what: str, node: str) -> None:
        self.recoveries.append((time.monotonic() + delay, what, node))

    # ------------------------------------------------------------------ actions
    def _crash_node(self) -> bool:
        node = self._victim_node()
        if node is None:
            return False
        killed = self.cluster.crash_node(node)
        self.trouble[node] = "crashed"
        back = self.rng.uniform(1.5, 3 * self.requeue_s)  # sometimes before it is declared dead
        self._later(back, "start_agent", node)
        self.note("crash_node", f"{node} ({len(killed)} job processes), back in {back:.1f}s")
        return True

    def _freeze_agent(self) -> bool:
        node = self._victim_node()
        if node is None:
            return False
        self.cluster.signal_agent(node, signal.SIGSTOP)
        self.trouble[node] = "frozen"
        frozen = self.requeue_s + self.rng.uniform(0.5, 3.0)  # past lease + margin
        self._later(frozen, "thaw", node)
        self.note("freeze_agent", f"{node} for {frozen:.1f}s")
        return True

    def _kill_rank(self) -> bool:
        candidates = []
        for info in self.running():
            path = self.ledger(info.id)
            for e in workload.read_ledger(path) if path is not None else []:
                if (
                    e["event"] == "begin"
                    and e["epoch"] == info.epoch
                    and workload.is_running(e, self.cluster.url)
                ):
                    candidates.append((info.id, e["epoch"], e["rank"], e["pid"]))
        if not candidates:
            return False
        job, epoch, rank, pid = self.rng.choice(sorted(candidates))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.note("kill_rank", f"job {job} epoch {epoch} rank {rank} (pid {pid})")
        return True

    def _restart_head(self) -> bool:
        if "crashed" in self.trouble.values():
            # LocalCluster.restart_head() fails while any agent process is dead (its start-up
            # check covers the agents too), so the head restarts only with every agent alive.
            return False
        outage = self.rng.uniform(0.3, self.requeue_s)  # sometimes longer than the lease
        self.cluster.kill_head(signal.SIGKILL)
        self.note("restart_head", f"SIGKILL, restarting in {outage:.1f}s")
        time.sleep(outage)
        self.cluster.restart_head()
        return True

    def _xid(self, code: int) -> str | None:
        """Inject XID `code` on a GPU a running job uses (else any); the node, or None."""
        if code == 79 and len(self._healthy()) <= self.min_healthy:
            return None  # it drains the node
        targets = sorted(
            (p.node, g)
            for j in self.running()
            for p in j.placement
            if p.node not in self.trouble
            for g in p.gpus
        )
        if not targets:
            node = self._victim_node()
            if node is None:
                return None
            targets = [(node, self.rng.randrange(self.cluster.gpus_per_node))]
        node, gpu = self.rng.choice(targets)
        try:
            self.client.inject_fault(node, FaultInjection(gpu=gpu, kind="xid", code=code))
        except ApiError as exc:
            self.note(f"xid {code} refused", f"{node} GPU {gpu}: {exc}")
            return None
        self.note(f"xid {code}", f"{node} GPU {gpu}")
        return node

    def _xid_critical(self) -> bool:
        node = self._xid(79)
        if node is None:
            return False
        self.trouble[node] = "drained"
        self._later(self.rng.uniform(2.0, 6.0), "resume", node)
        return True

    def _xid_app(self) -> bool:
        return self._xid(13) is not None

    # ------------------------------------------------------------------ undoing
    def recover(self, everything: bool = False) -> None:
        """Undo what is due (everything: all of it, now)."""
        now = time.monotonic()
        for item in sorted(self.recoveries):
            due, what, node = item
            if due > now and not everything:
                continue
            self.recoveries.remove(item)
            if what == "start_agent":
                self.cluster.start_agent(node)
            elif what == "thaw":
                self.cluster.signal_agent(node, signal.SIGCONT)
            elif what == "resume":
                self.resume(node)
            self.trouble.pop(node, None)
            self.note(what, node)

    def resume(self, node: str) -> None:
        """Put `node` back in service if it is drained."""
        for info in retry(self.client.nodes).nodes:
            if info.name == node and info.state in ("drain", "draining"):
                retry(lambda: self.client.resume(node))

    def thaw_all(self) -> None:
        """SIGCONT every frozen agent now (a stopped agent would sit out a SIGTERM)."""
        for node, what in list(self.trouble.items()):
            if what == "frozen":
                self.cluster.signal_agent(node, signal.SIGCONT)
