"""An overloaded head, reproduced with a few hundred simulated nodes (head/overload.py).

At 10,000 nodes on two cores the head falls behind: heartbeats the agents did send wait in
its queues, and a head that judges leases on its wall clock declares live nodes down and
requeues their running jobs. The same happens with far fewer nodes when the head gets
little CPU: `cpu_limit` caps the head process (every thread of it) with a cgroup, and
`run` drives the scenario against a real head process over real HTTP:

1. a head (`phalanx head`, SQLite, plain HTTP on loopback) with a short lease, and `nodes`
   `LiveFleet` nodes long-polling as real agents do, each running one job;
2. the head is capped to `cores` of CPU; `clients` users submit jobs meanwhile (one at a
   time, each waiting a second after a 503);
3. `kill_after_s` into it one node dies (stops heartbeating);
4. the cap stays `overload_s`, and longer until the dead node's job has been requeued
   (`deadline_s` at most), then `settle_s` more at full speed.

It reports what happened to the live nodes' jobs (taken away while running, requeued),
how often live nodes were marked down, and how long after its death the dead node's job
was requeued (from the head's own event). bench/fleet.py --overload runs it with and
without the head's protection (`--overload-grace 0 --shed-backlog 0` is the head before
it) side by side; tests/e2e/test_overloaded_head.py asserts the outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from phalanx.api.models import ArraySpec, JobSpec
from phalanx.local.cluster import LocalCluster
from phalanx.testing.fleet import Fleet, HeadConnection, LiveFleet, SimNode

CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
REQUEUES = "phalanx_job_requeues_total"


class NoCgroup(RuntimeError):
    """No cgroup CPU controller this process may use (it needs root and cgroup v1 or v2)."""


def _cgroup_root() -> tuple[Path, bool]:
    """(a cgroup directory to make children in, whether it is cgroup v2)."""
    controllers = CGROUP_V2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        subtree = CGROUP_V2 / "cgroup.subtree_control"
        if "cpu" not in subtree.read_text().split():
            with contextlib.suppress(OSError):
                subtree.write_text("+cpu")
        return CGROUP_V2, True
    if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        return CGROUP_V1_CPU, False
    raise NoCgroup(
        "no cgroup CPU controller found (cgroup v2 with `cpu` in "
        f"{controllers}, or cgroup v1 at {CGROUP_V1_CPU})"
    )


@contextlib.contextmanager
def cpu_limit(pid: int, cores: float) -> Iterator[Path]:
    """Cap process `pid` (all its threads) to `cores` of one CPU while in the block, with a
    cgroup of its own (v2 `cpu.max`, else v1 `cpu.cfs_quota_us`); root only. The process
    goes back to the root cgroup afterwards."""
    root, v2 = _cgroup_root()
    group = root / f"phalanx-overload-{pid}-{os.getpid()}"
    quota = max(1000, round(cores * PERIOD_US))
    try:
        group.mkdir(exist_ok=True)
        if v2:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(pid))
    except OSError as e:
        with contextlib.suppress(OSError):
            group.rmdir()
        raise NoCgroup(f"cannot cap process {pid} with a cgroup in {root}: {e}") from e
    try:
        yield group
    finally:
        for member in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # it may have exited meanwhile
                (root / "cgroup.procs").write_text(member)
        with contextlib.suppress(OSError):
            group.rmdir()


@dataclass(frozen=True)
class Scenario:
    nodes: int = 250
    cores: float = 0.06  # the head's CPU while overloaded, in cores
    heartbeat_s: float = 0.5
    lease_s: float = 3.0
    requeue_margin_s: float = 1.0
    # 0: the head requeues a silent node's jobs at lease + margin, whether or not its peers
    # are heard (no riding out what may be an outage): the head's lease judgement alone.
    max_outage_s: float = 0.0
    protected: bool = True  # False: --overload-grace 0 --shed-backlog 0 (the head before)
    overload_grace_s: float = 20.0
    shed_backlog_s: float = 2.0
    clients: int = 4  # users submitting one job at a time
    queued: int = 5_000  # jobs waiting (the control thread's clock walks them every tick)
    churn_per_s: float = 10.0  # running jobs that end each second (their nodes report it)
    kill_after_s: float = 2.0
    overload_s: float = 8.0  # at least this long, and until the dead node's job is requeued
    deadline_s: float = 40.0  # at most this long with the cap on
    settle_s: float = 2.0


@dataclass
class Outcome:
    scenario: Scenario
    live_jobs_taken: list[tuple[int, str]] = field(default_factory=list)  # (job, node)
    requeues: int = 0  # jobs requeued (the dead node's included)
    node_downs: int = 0  # nodes marked down (the dead node's included)
    victim_job: int = 0
    live_requeued: list[int] = field(default_factory=list)  # live nodes' jobs requeued
    victim_requeued: bool = False
    victim_requeued_s: float | None = None  # its death → its job requeued (the head's event)
    overloaded_s: float = 0.0
    submits: dict[str, int] = field(default_factory=dict)  # by status
    shed: int = 0
    backlog_max_s: float = 0.0  # the head's phalanx_head_backlog_seconds, sampled
    fleet_lag_max_s: float = 0.0  # this process's own event-loop lag (it must not be late)
    heartbeat_failures: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds: setup, overload, after

    def summary(self) -> dict[str, Any]:
        return {
            "protected": self.scenario.protected,
            "live_jobs_taken": len(self.live_jobs_taken),
            "live_jobs_requeued": len(self.live_requeued),
            "live_node_downs": max(0, self.node_downs - 1),
            "victim_requeued": self.victim_requeued,
            "victim_requeued_s": _round(self.victim_requeued_s),
            "overloaded_s": round(self.overloaded_s, 1),
            "submits": self.submits,
            "shed": self.shed,
            "head_backlog_max_s": round(self.backlog_max_s, 2),
            "fleet_loop_lag_max_s": round(self.fleet_lag_max_s, 2),
            "heartbeat_failures": self.heartbeat_failures,
            "errors": self.errors[:5],
            "phases_s": {k: round(v, 1) for k, v in self.phases.items()},
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def head_args(s: Scenario) -> list[str]:
    grace, shed = (s.overload_grace_s, s.shed_backlog_s) if s.protected else (0.0, 0.0)
    return [
        *("--heartbeat", str(s.heartbeat_s), "--lease", str(s.lease_s)),
        *("--requeue-margin", str(s.requeue_margin_s), "--max-outage", str(s.max_outage_s)),
        *("--overload-grace", str(grace), "--shed-backlog", str(shed)),
        *("--max-queued-per-user", "0", "--hang-timeout", "0"),
    ]


def run(s: Scenario, state_dir: Path | None = None) -> Outcome:
    """The scenario against a fresh head (its state in `state_dir`, else a temporary one)."""
    with contextlib.ExitStack() as stack:
        if state_dir is None:
            state_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        cluster = stack.enter_context(
            LocalCluster(state_dir, nodes=0, tls=False, head_args=head_args(s))
        )
        return asyncio.run(_run(s, cluster))


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus text (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            with contextlib.suppress(ValueError):
                total += float(line.rpartition(" ")[2])
    return total


async def _run(s: Scenario, cluster: LocalCluster) -> Outcome:
    out = Outcome(s)
    pid = next(r["pid"] for r in cluster.process_table() if r["kind"] == "head")
    assert isinstance(pid, int)
    headers = {"Authorization": f"Bearer {cluster.admin_token}"}
    nodes = Fleet.make(cluster.url, cluster.join_token, s.nodes, verify=False).nodes
    fleet = LiveFleet(cluster.url, cluster.join_token, nodes, verify=False)
    spec = JobSpec(
        command=["train"],
        workdir="/tmp",
        nodes=1,
        gpus_per_node=8,
        array=ArraySpec(indices=list(range(s.nodes))),
    )
    async with httpx.AsyncClient(
        base_url=cluster.url, headers=headers, timeout=httpx.Timeout(60.0)
    ) as api:
        began = time.monotonic()
        try:
            (await api.post("/v1/jobs", content=spec.model_dump_json())).raise_for_status()
            await fleet.start()
            for left in range(s.queued, 0, -1000):
                waiting = spec.model_copy(
                    update={"array": ArraySpec(indices=list(range(min(1000, left))))}
                )
                (await api.post("/v1/jobs", content=waiting.model_dump_json())).raise_for_status()
            deadline = time.monotonic() + 60
            while len(fleet.running_jobs()) < s.nodes:
                if time.monotonic() > deadline:
                    started = len(fleet.running_jobs())
                    raise RuntimeError(f"only {started} of {s.nodes} jobs started")
                await asyncio.sleep(0.2)
            victim = fleet.nodes[-1]
            text = (await api.get("/metrics")).text
            downs = _metric(text, "phalanx_node_failures_total")
            out.phases["setup"] = time.monotonic() - began
            with cpu_limit(pid, s.cores):
                killed_at = await _overload(s, cluster, api, fleet, victim, out)
            began = time.monotonic()
            await asyncio.sleep(s.settle_s)
            text = (await api.get("/metrics")).text
        finally:
            await fleet.stop()
        # The head at full speed again: what happened, from its own records.
        out.node_downs = round(_metric(text, "phalanx_node_failures_total") - downs)
        out.shed = round(_metric(text, "phalanx_requests_shed_total"))
        rows = (await _read(api, "/v1/jobs", {"active": "true"}))["jobs"]
        restarted = {int(j["id"]) for j in rows if int(j["restart_count"]) > 0}
        out.requeues = len(restarted)
        out.live_requeued = sorted(restarted - {out.victim_job})
        detail = await _read(api, f"/v1/jobs/{out.victim_job}")
        fails = [
            e["time"]
            for e in detail["events"]
            if e["kind"] == "nodefail" and e["node"] == victim.name and e["time"] >= killed_at
        ]
        out.victim_requeued = bool(fails)
        if fails:
            out.victim_requeued_s = min(fails) - killed_at
        out.phases["after"] = time.monotonic() - began
    out.live_jobs_taken = [(j, n) for j, n, _ in fleet.killed if n != victim.name]
    out.heartbeat_failures = dict(fleet.failures)
    out.errors = list(fleet.errors)
    return out


async def _overload(
    s: Scenario,
    cluster: LocalCluster,
    api: httpx.AsyncClient,
    fleet: LiveFleet,
    victim: SimNode,
    out: Outcome,
) -> float:
    """The overloaded phase; the wall-clock time the victim died."""
    began = time.monotonic()
    stop = asyncio.Event()
    users = [asyncio.create_task(_submitter(cluster, stop, out)) for _ in range(s.clients)]
    users.append(asyncio.create_task(_churn(s, fleet, victim.name, stop)))
    watch = asyncio.create_task(_watch_backlog(api, stop, out))
    lag = asyncio.create_task(_loop_lag(out))
    try:
        await asyncio.sleep(s.kill_after_s)
        requeues = _metric((await api.get("/metrics")).text, REQUEUES)
        while not (running := _running(victim)):  # its job just ended: the next is coming
            await asyncio.sleep(0.05)
        out.victim_job = running[0]
        fleet.kill([victim.name])
        killed_at = time.time()
        seen = False
        while time.monotonic() - began < s.deadline_s:
            seen = seen or await _requeued(api, out.victim_job, requeues)
            if seen and time.monotonic() - began >= s.overload_s:
                break
            await asyncio.sleep(0.25)
        return killed_at
    finally:
        out.overloaded_s = out.phases["overload"] = time.monotonic() - began
        lag.cancel()
        stop.set()
        await asyncio.gather(*users, watch, return_exceptions=True)


async def _read(
    api: httpx.AsyncClient, path: str, params: dict[str, str] | None = None
) -> dict[str, Any]:
    """GET `path`'s JSON, waiting out 503s (a head still catching up sheds reads)."""
    deadline = time.monotonic() + 120
    while True:
        r = await api.get(path, params=params)
        if r.status_code != 503 or time.monotonic() > deadline:
            r.raise_for_status()
            body: dict[str, Any] = r.json()
            return body
        await asyncio.sleep(float(r.headers.get("retry-after", "1")))


async def _requeued(api: httpx.AsyncClient, job: int, since: float) -> bool:
    """Whether the head has requeued `job`; while it sheds reads (503), whether it has
    requeued any job since its requeue count was `since` (/metrics is never shed; a head
    that sheds protects live nodes' jobs, so that one is the dead node's)."""
    with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
        r = await api.get(f"/v1/jobs/{job}")
        if r.status_code == 200:
            return int(r.json()["job"]["restart_count"]) > 0
        if r.status_code == 503:
            r = await api.get("/metrics")
            return r.status_code == 200 and _metric(r.text, REQUEUES) > since
    return False


async def _submitter(cluster: LocalCluster, stop: asyncio.Event, out: Outcome) -> None:
    """A user submitting jobs one by one, waiting a second after a 503 (Retry-After)."""
    conn = HeadConnection(cluster.url, "127.0.0.1")
    body = JobSpec(command=["x"], workdir="/tmp", nodes=1, gpus_per_node=8).model_dump_json()
    try:
        while not stop.is_set():
            try:
                status, _ = await conn.post("/v1/jobs", cluster.admin_token, body.encode(), 30)
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                out.submits[type(e).__name__] = out.submits.get(type(e).__name__, 0) + 1
                await asyncio.sleep(1.0)
                continue
            out.submits[str(status)] = out.submits.get(str(status), 0) + 1
            if status == 503:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        conn.close()


def _running(node: SimNode) -> list[int]:
    """The jobs whose ranks run on `node` (not those it ended and has yet to report)."""
    return sorted(j for j, (_, ps) in node.running.items() if any(p.running for p in ps))


async def _churn(s: Scenario, fleet: LiveFleet, spare: str, stop: asyncio.Event) -> None:
    """Running jobs end, `churn_per_s` a second (never `spare`'s, the node that dies):
    their nodes report it at once, and the head starts queued jobs there."""
    rng = random.Random(0)
    while not stop.is_set():
        alive = [n for n in fleet.nodes if n.name not in fleet.dead and n.name != spare]
        jobs = [j for n in alive for j in _running(n)]
        if jobs:
            fleet.finish(rng.choice(jobs))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0 / s.churn_per_s)


async def _watch_backlog(api: httpx.AsyncClient, stop: asyncio.Event, out: Outcome) -> None:
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            text = (await api.get("/metrics")).text
            out.backlog_max_s = max(
                out.backlog_max_s, _metric(text, "phalanx_head_backlog_seconds")
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def _loop_lag(out: Outcome) -> None:
    """This process's own lateness while the head is capped: live nodes must not be late
    by their own fault."""
    while True:
        due = time.monotonic() + 0.1
        await asyncio.sleep(0.1)
        out.fleet_lag_max_s = max(out.fleet_lag_max_s, time.monotonic() - due)
