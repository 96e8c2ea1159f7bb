"""One head against a simulated fleet: N agents speaking the real protocol, 100,000 jobs queued.

    python bench/fleet.py [--nodes 100,1000,5000,10000] [--baseline 100] [--db sqlite|postgresql]
                          [--jobs 100000] [--load-s 60] [--idle-s 20] [--procs 2]
                          [--heartbeat S] [--lease S] [--smoke] [--head-args FLAGS]
    python bench/fleet.py --overload [--overload-nodes 250] [--overload-cores 0.06]
                          [--overload-s 20] [--overload-runs 1]

For each N (and the baseline N, the same load at 100 nodes, side by side): a real head
process (`phalanx head`, plain HTTP on 127.0.0.1, SQLite or a throwaway PostgreSQL), and N
simulated agents (phalanx/testing/fleet.py `LiveFleet`: register with a join token, long-poll
heartbeats carrying 8 GPUs' readings and their jobs' ranks, as a real agent) spread over
`--procs` processes, each node's connection from its own 127.1.x.y address group. Then:

1. queue: `--jobs` jobs submitted as arrays of up to 10,000 tasks (a mix: 1 node × 8 GPUs,
   1 node × 4 GPUs, gangs of 2 nodes × 8 GPUs), before any node joins;
2. join: the N nodes register (joins/s) and the head fills them from the queue;
3. load (`--load-s`): jobs end continuously (each node's job ends after ~`--job-s` on
   average, at least 2 a second over the fleet) and the head starts the next ones; submits
   from `--clients` concurrent clients as fast as the head takes them (durable, one job per
   request); nodes die (stop heartbeating) and new nodes join. Measured: submits/s; job
   start, from the head's decision (the job's start_time) to the moment every node of the
   job has its assignment (p50/p99); node death to the head showing it down;
4. head restart: SIGKILL, start again on the same database; the time until every living
   node's heartbeat is answered again (reconciled), and how many running jobs the head told
   a node to stop meanwhile (must be 0);
5. idle (`--idle-s`, no submits, no job ends): the head's CPU (% of one core, from
   /proc/PID/stat) and the heartbeat round trip of a node with no change pending (probe
   nodes send plain heartbeats every interval; p50/p99);
6. listings: `GET /v1/nodes` and `GET /v1/jobs?active=true` (the REST lists, whole);
   the head's peak RSS (VmHWM of /proc/PID/status, across the restart).

Prints one JSON object: per-N results, the baseline, ratios (largest N / baseline), the
issue's targets at the largest N, and the host (CPUs, CPU steal % during each run, load).

`--overload` runs something else: an overloaded head reproduced with a few hundred nodes
(phalanx/testing/overload.py: the head capped to `--overload-cores` of CPU by a cgroup, so
root only; jobs ending, users submitting, one node dying), once as the head was before
its overload protection (`--overload-grace 0 --shed-backlog 0`), once with it, and once
with the lease horizon but no shedding (`--shed-backlog 0`), and prints the live nodes'
jobs requeued and live nodes marked down by each, the head's backlog, the submits it took
and how long the dead node's job took to be requeued, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from phalanx.api.models import ArraySpec, JobSpec
from phalanx.head.mirror import Settings
from phalanx.local.cluster import LocalCluster
from phalanx.testing import overload
from phalanx.testing.fleet import Fleet, HeadConnection, LiveFleet
from phalanx.testing.postgres import PostgresServer

TICK = os.sysconf("SC_CLK_TCK")
GPUS = 8
ARRAY = 10_000  # the most tasks one array may have (api/models.py MAX_ARRAY_TASKS)
PROBES_PER_PROC = 20


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def secs(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


# ----------------------------------------------------------------------------- host
def cpu_times() -> tuple[int, int]:
    """(all jiffies, steal jiffies) from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return sum(values), values[7]


def steal_pct(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    total = after[0] - before[0]
    return round(100.0 * (after[1] - before[1]) / total, 2) if total > 0 else None


def fsync_ms(directory: str, count: int = 20) -> dict[str, float | None]:
    """How long this disk takes to make a small write durable (the head's SQLite commits
    once per batch with synchronous=FULL: with slow fsyncs, submits/s is bounded by the
    batch size over the fsync time, not by CPU)."""
    times = []
    path = Path(directory) / "fsync-probe"
    with path.open("wb") as f:
        for _ in range(count):
            f.write(b"x" * 4096)
            t0 = time.perf_counter()
            f.flush()
            os.fsync(f.fileno())
            times.append(time.perf_counter() - t0)
    path.unlink()
    return {"p50": ms(percentile(times, 0.5)), "p99": ms(percentile(times, 0.99))}


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_mem_mb(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


# ----------------------------------------------------------------------------- fleet procs
def sim_main(
    conn: Connection,
    head_url: str,
    join_token: str,
    prefix: str,
    count: int,
    first_address: int,
    seed: int,
) -> None:
    """One fleet process: its nodes, driven by the parent's commands over `conn`."""
    asyncio.run(_sim(conn, head_url, join_token, prefix, count, first_address, seed))


async def _sim(
    conn: Connection,
    head_url: str,
    join_token: str,
    prefix: str,
    count: int,
    first_address: int,
    seed: int,
) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    def reader() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("stop",)
            loop.call_soon_threadsafe(inbox.put_nowait, msg)
            if msg[0] == "stop":
                return

    threading.Thread(target=reader, daemon=True).start()
    rng = random.Random(seed)
    nodes = Fleet.make(head_url, join_token, count, prefix=prefix, first_address=first_address)
    fleet = LiveFleet(head_url, join_token, nodes.nodes, probes=min(PROBES_PER_PROC, count // 4))
    probes = {n.name for n in fleet.nodes[: fleet.probes]}
    t0 = time.perf_counter()
    await fleet.start()
    conn.send(("registered", time.perf_counter() - t0))
    churn = [0.0]  # jobs to end per second
    joined = [0]

    async def churner() -> None:
        debt = 0.0
        while True:
            await asyncio.sleep(0.25)
            debt += churn[0] * 0.25
            k = int(debt)
            if k:
                debt -= k
                fleet.end_some(k, rng)

    churning = asyncio.create_task(churner())
    while True:
        msg = await inbox.get()
        op = msg[0]
        if op == "churn":
            churn[0] = float(msg[1])
        elif op == "kill":
            alive = [n.name for n in fleet.nodes if n.name not in probes | fleet.dead.keys()]
            names = rng.sample(alive, min(int(msg[1]), len(alive)))
            fleet.kill(names)
            conn.send(("killed", {n: fleet.dead[n] for n in names}))
        elif op == "join":
            extra = Fleet.make(
                head_url,
                join_token,
                int(msg[1]),
                prefix=f"{prefix}j",
                first_address=first_address + count + 2000 + joined[0],
            ).nodes
            joined[0] += len(extra)
            t = time.perf_counter()
            await fleet.start(extra)
            conn.send(("joined", len(extra), time.perf_counter() - t))
        elif op == "stats":
            conn.send(("stats", _stats(fleet, probes, float(msg[1]))))
        elif op == "stop":
            churning.cancel()
            await fleet.stop()
            conn.send(("stopped",))
            return


def _stats(fleet: LiveFleet, probes: set[str], since: float) -> dict[str, Any]:
    """What happened since the last call (lists drained), and the state now."""
    latencies = [x for n in fleet.nodes if n.name in probes for x in n.latencies]
    for n in fleet.nodes:
        n.latencies.clear()
    seen, killed = fleet.seen, fleet.killed
    fleet.seen, fleet.killed = [], []
    alive = [n for n in fleet.nodes if n.name not in fleet.dead]
    return {
        "latencies": latencies,
        "seen": [s for s in seen if s[1] not in probes],
        "killed": killed,
        "alive": len(alive),
        "answered_since": sum(1 for n in alive if fleet.ok_at.get(n.name, 0.0) >= since),
        "running": len({j for n in alive for j, (_, ps) in n.running.items() if ps[0].running}),
        "busy_gpus": sum(len(g) for n in alive for g in n.holds.values()),
        "heartbeats": sum(n.heartbeats for n in fleet.nodes),
        "ended": fleet.ended,
        "errors": fleet.errors[:5],
        "failures": dict(fleet.failures),
        "silent": sorted(n.name for n in alive if fleet.ok_at.get(n.name, 0.0) < since)[:5],
        # When each node was first answered after `since`, had it gone unanswered across it.
        "back": [at for _, before, at in fleet.gaps if before < since <= at] if since else [],
        # Jobs that ran on a node that died: their gang partners on live nodes are stopped
        # and the gang requeued, rightly (gang or nothing).
        "dead_jobs": sorted({j for n in fleet.nodes if n.name in fleet.dead for j in n.running}),
    }


class Sims:
    """The fleet processes, as seen from the parent."""

    def __init__(self, url: str, join_token: str, counts: list[int]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs = []
        first = 0
        for k, count in enumerate(counts):
            mine, theirs = ctx.Pipe()
            args = (theirs, url, join_token, f"sim{k}", count, first, 1000 + k)
            proc = ctx.Process(target=sim_main, args=args, daemon=True)
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)
            first += count + 5000  # room for the nodes that join later

    def recv_all(self, timeout: float) -> list[tuple[Any, ...]]:
        out = []
        for pipe, proc in zip(self.pipes, self.procs, strict=True):
            deadline = time.monotonic() + timeout
            while not pipe.poll(0.2):
                if not proc.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"fleet process {proc.pid} gave no answer")
            out.append(pipe.recv())
        return out

    def ask(self, *msg: Any, timeout: float = 120.0) -> list[tuple[Any, ...]]:
        for pipe in self.pipes:
            pipe.send(msg)
        return self.recv_all(timeout)

    def stats(self, since: float = 0.0) -> dict[str, Any]:
        parts = [r[1] for r in self.ask("stats", since)]
        lists = ("latencies", "seen", "killed", "errors", "silent", "back", "dead_jobs")
        out: dict[str, Any] = {k: [] for k in lists}
        out["failures"] = {}
        for k in ("alive", "answered_since", "running", "busy_gpus", "heartbeats", "ended"):
            out[k] = sum(p[k] for p in parts)
        for p in parts:
            for k in lists:
                out[k].extend(p[k])
            for k, v in p["failures"].items():
                out["failures"][k] = out["failures"].get(k, 0) + v
        return out

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


# ----------------------------------------------------------------------------- head side
def spec(kind: int, tasks: int) -> JobSpec:
    """The mix: 1 × 8 GPUs (most), 1 × 4 GPUs, gangs of 2 × 8."""
    nodes, gpus = ((1, 8), (1, 8), (1, 4), (1, 8), (2, 8))[kind % 5]
    return JobSpec(
        command=["python", "train.py"],
        workdir="/tmp",
        name=f"fleet-{kind % 5}",
        nodes=nodes,
        gpus_per_node=gpus,
        array=ArraySpec(indices=list(range(tasks))) if tasks > 1 else None,
    )


def queue_jobs(client: httpx.Client, count: int) -> float:
    """`count` jobs as arrays (of up to 1,000 tasks, kinds interleaved); seconds taken."""
    t0 = time.perf_counter()
    k = 0
    left = count
    while left > 0:
        tasks = min(1000, left, ARRAY)
        r = client.post("/v1/jobs", content=spec(k, tasks).model_dump_json())
        if r.status_code not in (200, 201):
            raise RuntimeError(f"queueing jobs: {r.status_code} {r.text[:300]}")
        left -= tasks
        k += 1
    return time.perf_counter() - t0


class Submitter:
    """`clients` concurrent clients submitting one job per request until stopped."""

    def __init__(self, url: str, token: str, clients: int) -> None:
        self.url, self.token, self.clients = url, token, clients
        self.done = 0
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        # Each client its own keep-alive connection (HeadConnection), not one httpx pool:
        # httpcore's pool checks every connection per request (O(clients)), and at 64
        # clients that bookkeeping, not the head, bounded submits/s (py-spy of this
        # process: ~95 % of its thread in AsyncConnectionPool._assign_requests_to_connections
        # while the head's own threads were mostly idle).
        body = JobSpec(command=["true"], workdir="/tmp", name="sub", gpus_per_node=1)
        content = body.model_dump_json().encode()

        async def one() -> None:
            conn = HeadConnection(self.url, "127.0.0.1")
            try:
                while not self.stop.is_set():
                    try:
                        status, _ = await conn.post("/v1/jobs", self.token, content, 60.0)
                    except (OSError, asyncio.IncompleteReadError):
                        self.failed += 1
                        await asyncio.sleep(0.2)
                        continue
                    if status in (200, 201):
                        self.done += 1
                    else:
                        self.failed += 1
                        await asyncio.sleep(0.2)
            finally:
                conn.close()

        await asyncio.gather(*(one() for _ in range(self.clients)))

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.thread.start()

    def finish(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join(timeout=90)
        seconds = time.perf_counter() - self.t0
        return {
            "submitted": self.done,
            "failed": self.failed,
            "seconds": round(seconds, 1),
            "per_s": round(self.done / seconds, 1),
        }


def get(client: httpx.Client, path: str) -> httpx.Response:
    """GET, waiting out 503s: a head behind on its work sheds reads (head/shedding.py), as
    phalanx.client waits them out."""
    deadline = time.monotonic() + 300
    while True:
        r = client.get(path)
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(min(5.0, float(r.headers.get("retry-after", "1"))))


def timed_get(client: httpx.Client, path: str, runs: int = 3) -> dict[str, float]:
    times, size = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        r = get(client, path)
        times.append(time.perf_counter() - t0)
        if r.status_code != 200:
            raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:300]}")
        size = len(r.content)
    return {"median_ms": ms(statistics.median(times)) or 0.0, "bytes": size}


def start_latencies(
    client: httpx.Client, seen: list[tuple[int, str, float]], sample: int, rng: random.Random
) -> list[float]:
    """Decision (the job's start_time) → the last of its nodes has its assignment, for a
    sample of the jobs started during the load (all of whose nodes are long-polling)."""
    by_job: dict[int, dict[str, float]] = {}
    for job_id, node, at in seen:
        by_job.setdefault(job_id, {}).setdefault(node, at)
    out = []
    for job_id in rng.sample(sorted(by_job), min(sample, len(by_job))):
        r = get(client, f"/v1/jobs/{job_id}")
        if r.status_code != 200:
            continue
        job = r.json()["job"]
        nodes = {p["node"] for p in job["placement"]}
        if job["start_time"] is None or not nodes or not nodes <= set(by_job[job_id]):
            continue  # requeued since, or one of its nodes is a probe
        out.append(max(by_job[job_id][n] for n in nodes) - job["start_time"])
    return out


def head_pid(cluster: LocalCluster) -> int:
    pids = [r["pid"] for r in cluster.process_table() if r["kind"] == "head"]
    assert isinstance(pids[0], int)
    return pids[0]


def wait_down(client: httpx.Client, killed: dict[str, float], timeout: float) -> list[float]:
    """Poll `GET /v1/nodes` until every killed node shows down: each one's last heartbeat
    sent → the first answer that shows it down, seconds."""
    detected: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(detected) < len(killed) and time.monotonic() < deadline:
        r = client.get("/v1/nodes")
        at = time.time()
        if r.status_code != 200:  # shed (503) while the head is behind: ask again
            time.sleep(0.5)
            continue
        for node in r.json()["nodes"]:
            name = node["name"]
            if name in killed and name not in detected and node["state"] == "down":
                detected[name] = at - killed[name]
        time.sleep(0.5)
    return [detected.get(n, float("inf")) for n in killed]


def run_one(n: int, args: argparse.Namespace, db_url: str | None) -> dict[str, Any]:
    rng = random.Random(n)
    result: dict[str, Any] = {"nodes": n, "gpus": n * GPUS}
    head_args = ["--max-queued-per-user", "0", "--hang-timeout", "0", *args.head_args.split()]
    if args.heartbeat is not None:
        head_args += ["--heartbeat", str(args.heartbeat)]
    if args.lease is not None:
        head_args += ["--lease", str(args.lease)]
    host0 = cpu_times()
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(
            Path(tmp),
            nodes=0,
            tls=False,
            db_url=db_url,
            head_args=head_args,
            start_timeout_s=600,
        ) as c,
    ):
        pid = head_pid(c)
        hwm = 0.0
        admin = {"Authorization": f"Bearer {c.admin_token}", "Content-Type": "application/json"}
        with httpx.Client(base_url=c.url, headers=admin, timeout=300) as api:
            result["queue_s"] = round(queue_jobs(api, args.jobs), 1)
            result["queued_jobs"] = args.jobs
            procs = max(1, min(args.procs, n // 50))
            counts = [n // procs + (1 if k < n % procs else 0) for k in range(procs)]
            t0 = time.perf_counter()
            sims = Sims(c.url, c.join_token, counts)
            try:
                took = max(r[1] for r in sims.recv_all(timeout=600))
                result["join_all_s"] = round(time.perf_counter() - t0, 1)
                result["joins_per_s"] = round(n / took, 1)
                # The head fills the fleet from the queue.
                deadline = time.monotonic() + 120
                while True:
                    st = sims.stats()
                    if st["busy_gpus"] >= 0.9 * n * GPUS or time.monotonic() > deadline:
                        break
                    time.sleep(1)
                result["fill_s"] = round(time.perf_counter() - t0 - took, 1)
                result["busy_gpus_after_fill"] = st["busy_gpus"]

                # ---- load
                sims.stats()  # drain
                cpu0, wall0 = proc_cpu_s(pid), time.perf_counter()
                churn = max(2.0, n / args.job_s)
                for pipe, count in zip(sims.pipes, counts, strict=True):
                    pipe.send(("churn", churn * count / n))
                submitter = Submitter(c.url, c.admin_token, args.clients)
                submitter.start()
                time.sleep(min(5.0, args.load_s / 6))
                deaths = max(1, n // 1000)
                killed: dict[str, float] = {}
                for r in sims.ask("kill", max(1, deaths // procs)):
                    killed.update(r[1])
                down = wait_down(api, killed, timeout=max(30.0, args.load_s / 2))
                joins = max(2, n // 100)
                joined = sims.ask("join", max(1, joins // procs), timeout=300)
                join_n = sum(r[1] for r in joined)
                join_s = max(r[2] for r in joined)
                left = args.load_s - (time.perf_counter() - wall0)
                if left > 0:
                    time.sleep(left)
                subs = submitter.finish()
                for pipe in sims.pipes:
                    pipe.send(("churn", 0.0))
                load_s = time.perf_counter() - wall0
                load_cpu = proc_cpu_s(pid) - cpu0
                st = sims.stats()
                dead_jobs = set(st["dead_jobs"])
                starts = start_latencies(api, st["seen"], args.sample, rng)
                result["load"] = {
                    "seconds": round(load_s, 1),
                    "churn_per_s": round(churn, 1),
                    "jobs_ended": st["ended"],
                    "jobs_started_seen": len({s[0] for s in st["seen"]}),
                    "submits": subs,
                    "head_cpu_pct": round(100 * load_cpu / load_s, 1),
                    "heartbeat_p50_ms": ms(percentile(st["latencies"], 0.5)),
                    "heartbeat_p99_ms": ms(percentile(st["latencies"], 0.99)),
                    "start_sampled": len(starts),
                    "start_p50_ms": ms(percentile(starts, 0.5)),
                    "start_p99_ms": ms(percentile(starts, 0.99)),
                    "deaths": len(killed),
                    "death_detected_max_s": round(max(down), 1) if down else None,
                    "joined": join_n,
                    "join_batch_s": round(join_s, 2),
                    # Taken from live nodes for nothing; a gang partner of a node that died
                    # is stopped rightly and counted apart.
                    "killed_running_jobs": sum(1 for k in st["killed"] if k[0] not in dead_jobs),
                    "gang_partners_of_dead_nodes_stopped": sum(
                        1 for k in st["killed"] if k[0] in dead_jobs
                    ),
                    "errors": st["errors"],
                }
                hwm = max(hwm, proc_mem_mb(pid).get("VmHWM", 0.0))

                # ---- head restart
                time.sleep(2)
                before = sims.stats()
                c.kill_head(signal.SIGKILL)
                t_kill = time.time()
                t = time.perf_counter()
                c.restart_head()
                up_s = time.perf_counter() - t
                t_up = time.time()  # the new head answers /healthz
                pid = head_pid(c)
                deadline = time.monotonic() + args.reconcile_timeout
                taken: list[tuple[int, str, float]] = []  # running jobs a node was told to stop
                while True:
                    st = sims.stats(t_kill)
                    taken += st["killed"]
                    if st["answered_since"] >= st["alive"] or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                # When nodes were heard back after the new head was serving: an agent
                # whose peers were answered but not itself for half a lease would have
                # fenced its jobs, unless told the head was catching up (head/rejoin.py).
                # (An answer the killed head had written still arrives after the kill.)
                back = sorted(st["back"])
                lease_s = args.lease if args.lease is not None else Settings().lease_s
                spread = [max(0.0, b - t_up) for b in back]
                result["restart"] = {
                    "head_up_s": round(up_s, 1),
                    "heard_back_after_up_s": {
                        "p50": secs(percentile(spread, 0.5)),
                        "p99": secs(percentile(spread, 0.99)),
                        "max": secs(spread[-1] if spread else None),
                    },
                    "heard_back_past_half_lease": sum(1 for x in spread if x > lease_s / 2),
                    "all_reconciled_s": round(time.perf_counter() - t, 1),
                    "reconciled": st["answered_since"],
                    "alive": st["alive"],
                    "running_before": before["running"],
                    "running_after": st["running"],
                    "killed_running_jobs": len(taken),
                    "heartbeat_failures": st["failures"],
                    "errors": st["errors"],
                    "not_reconciled": st["silent"],
                }

                # ---- idle
                time.sleep(3)
                sims.stats()
                cpu0, wall0 = proc_cpu_s(pid), time.perf_counter()
                time.sleep(args.idle_s)
                idle_cpu = proc_cpu_s(pid) - cpu0
                idle_s = time.perf_counter() - wall0
                st = sims.stats()
                result["idle"] = {
                    "seconds": round(idle_s, 1),
                    "head_cpu_pct": round(100 * idle_cpu / idle_s, 1),
                    "heartbeat_p50_ms": ms(percentile(st["latencies"], 0.5)),
                    "heartbeat_p99_ms": ms(percentile(st["latencies"], 0.99)),
                    "probe_beats": len(st["latencies"]),
                    "heartbeats_total": st["heartbeats"],
                }
                result["listings"] = {
                    "nodes": timed_get(api, "/v1/nodes"),
                    "jobs_active": timed_get(api, "/v1/jobs?active=true&limit=100000", runs=2),
                }
                mem = proc_mem_mb(pid)
                result["head_rss_mb"] = mem.get("VmRSS")
                result["head_peak_rss_mb"] = max(hwm, mem.get("VmHWM", 0.0))
            finally:
                sims.close()
    result["cpu_steal_pct"] = steal_pct(host0, cpu_times())
    result["fsync_ms"] = fsync_ms(tempfile.gettempdir())
    result["loadavg_1m"] = float(Path("/proc/loadavg").read_text().split()[0])
    return result


def targets(r: dict[str, Any]) -> dict[str, Any]:
    def at_most(value: float | None, limit: float) -> bool | None:
        return None if value is None else value <= limit

    load, idle, restart = r["load"], r["idle"], r["restart"]
    return {
        "heartbeat_p99_le_100ms": at_most(idle["heartbeat_p99_ms"], 100),
        "start_p99_le_1s": at_most(load["start_p99_ms"], 1000),
        "death_detected_le_10s": at_most(load["death_detected_max_s"], 10),
        "restart_reconciled_le_30s_none_killed": restart["all_reconciled_s"] <= 30
        and restart["killed_running_jobs"] == 0
        and restart["reconciled"] >= restart["alive"],
        "idle_cpu_le_50pct": at_most(idle["head_cpu_pct"], 50),
        "rss_le_4GB": at_most(r["head_peak_rss_mb"], 4096),
    }


def overload_main(args: argparse.Namespace) -> None:
    """`--overload`: the same overloaded head (a cgroup CPU cap, N simulated nodes, jobs
    ending, users submitting, one node dying) without and with the head's protection
    (head/overload.py, head/shedding.py), alternating, in one JSON object."""
    base = overload.Scenario(
        nodes=args.overload_nodes,
        cores=args.overload_cores,
        overload_s=args.overload_s,
        deadline_s=args.overload_s + 30.0,
    )
    variants = {
        # The head before: wall-clock leases, nothing shed.
        "before": dataclasses.replace(base, protected=False),
        "after": base,  # the lease horizon and shedding
        "no_shedding": dataclasses.replace(base, shed_backlog_s=0.0),  # the horizon alone
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    host0 = cpu_times()
    for k in range(args.overload_runs):
        for name, scenario in variants.items():
            print(f"overload: {name} ({k + 1}/{args.overload_runs}) …", file=sys.stderr)
            result = overload.run(scenario).summary()
            print(json.dumps(result), file=sys.stderr, flush=True)
            runs[name].append(result)

    def total(name: str, key: str) -> int:
        return sum(int(r[key]) for r in runs[name])

    before, after = total("before", "live_jobs_requeued"), total("after", "live_jobs_requeued")
    out = {
        "mode": "overload",
        "scenario": {k: v for k, v in dataclasses.asdict(base).items() if k != "protected"},
        "runs": runs,
        "live_jobs_requeued": {"before": before, "after": after},
        "live_node_downs": {name: total(name, "live_node_downs") for name in variants},
        "live_jobs_requeued_by_variant": {
            name: total(name, "live_jobs_requeued") for name in variants
        },
        "dead_node_requeued_s": {
            name: [r["victim_requeued_s"] for r in runs[name]] for name in variants
        },
        "head_backlog_max_s": {
            name: [r["head_backlog_max_s"] for r in runs[name]] for name in variants
        },
        "submits_accepted": {
            name: sum(r["submits"].get("201", 0) for r in runs[name]) for name in variants
        },
        "ratio_after_to_before_live_requeues": round(after / before, 3) if before else None,
        "host": {
            "cpus": os.cpu_count(),
            "steal_pct": steal_pct(host0, cpu_times()),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        },
    }
    json.dump(out, sys.stdout)
    print()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", default="10000", help="comma-separated node counts")
    p.add_argument("--baseline", type=int, default=100)
    p.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--load-s", type=float, default=60.0)
    p.add_argument("--idle-s", type=float, default=20.0)
    p.add_argument("--job-s", type=float, default=300.0, help="a job's mean run time")
    p.add_argument("--procs", type=int, default=os.cpu_count() or 2)
    p.add_argument("--clients", type=int, default=64, help="concurrent submitting clients")
    p.add_argument("--sample", type=int, default=300, help="jobs whose start latency is read")
    p.add_argument("--heartbeat", type=float, default=None, help="the head's --heartbeat")
    p.add_argument("--lease", type=float, default=None, help="the head's --lease")
    p.add_argument("--reconcile-timeout", type=float, default=180.0)
    p.add_argument("--smoke", action="store_true", help="N = 200, 60 s in all, 2,000 jobs")
    p.add_argument(
        "--head-args", default="", help="more `phalanx head` flags, e.g. '--overload-grace 0'"
    )
    p.add_argument(
        "--overload",
        action="store_true",
        help="instead: an overloaded head (phalanx/testing/overload.py), the head before its "
        "overload protection (--overload-grace 0 --shed-backlog 0) and with it, side by side",
    )
    p.add_argument("--overload-nodes", type=int, default=overload.Scenario().nodes)
    p.add_argument(
        "--overload-cores", type=float, default=overload.Scenario().cores, help="the head's CPU cap"
    )
    p.add_argument("--overload-s", type=float, default=20.0)
    p.add_argument("--overload-runs", type=int, default=1, help="pairs, alternating")
    args = p.parse_args()
    if args.overload:
        overload_main(args)
        return
    if args.smoke:
        args.nodes, args.baseline, args.jobs = "200", 0, 2000
        args.load_s, args.idle_s, args.sample, args.clients = 20.0, 5.0, 50, 4
    counts = [int(x) for x in args.nodes.split(",") if x.strip()]
    pg = PostgresServer().start() if args.db == "postgresql" else None
    try:
        runs: dict[str, Any] = {}
        for n in sorted({*counts, *([args.baseline] if args.baseline else [])}):
            db_url = None
            if pg is not None:
                db_url = pg.new_database(f"fleet{n}")
            print(f"fleet: N = {n} …", file=sys.stderr, flush=True)
            runs[str(n)] = run_one(n, args, db_url)
            print(json.dumps(runs[str(n)]), file=sys.stderr, flush=True)
    finally:
        if pg is not None:
            pg.stop()
    largest = runs[str(max(counts))]
    out: dict[str, Any] = {
        "db": args.db,
        "jobs_queued": args.jobs,
        "heartbeat_s": args.heartbeat,
        "lease_s": args.lease,
        "host": {"cpus": os.cpu_count(), "loadavg": Path("/proc/loadavg").read_text().split()[:3]},
        "runs": runs,
        "targets_at_largest": targets(largest),
    }
    if args.baseline:
        base = runs[str(args.baseline)]

        def ratio(a: float | None, b: float | None) -> float | None:
            return None if a is None or not b else round(a / b, 2)

        out["baseline_nodes"] = args.baseline
        out["ratio_largest_to_baseline"] = {
            "heartbeat_p99": ratio(
                largest["idle"]["heartbeat_p99_ms"], base["idle"]["heartbeat_p99_ms"]
            ),
            "start_p99": ratio(largest["load"]["start_p99_ms"], base["load"]["start_p99_ms"]),
            "submits_per_s": ratio(
                largest["load"]["submits"]["per_s"], base["load"]["submits"]["per_s"]
            ),
            "idle_cpu": ratio(largest["idle"]["head_cpu_pct"], base["idle"]["head_cpu_pct"]),
            "peak_rss": ratio(largest["head_peak_rss_mb"], base["head_peak_rss_mb"]),
        }
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
