"""Heartbeats at scale: round trip and head CPU of N simulated agents, before and after.

    python bench/heartbeat.py [--nodes 2000] [--seconds 20] [--procs 2] [--probes 50]
                              [--jobs 0.5] [--baseline-ref REF|none]

Three runs in one invocation, each against a fresh head process (SQLite, plain HTTP on
loopback) with `--nodes` SimNodes (phalanx/testing/fleet.py: the real agent protocol,
8 GPUs each) spread over `--procs` client processes, a `--jobs` share of the nodes running
a one-node job (their answers carry an assignment):

- `baseline`: the head as it was at `--baseline-ref` (default: where this branch left
  main), its files extracted by `git archive`, and agents sending full reports;
- `full`: this head, agents sending full reports (agents older than delta heartbeats);
- `delta`: this head, agents sending deltas (agent/reportdelta.py).

After a warm-up (nodes register, get their jobs, report them running), each node
heartbeats at the interval its head tells it (2 s by default; this head scales it with the
fleet: head/intervals.py) with no long poll and nothing changing: the "no change pending"
round trip of the issue's target. Reported per run: round trip p50/p99 (ms) of `--probes`
nodes in a client process of their own (lightly loaded, so it is the head's round trip, not
a busy client's; `loaded_rtt_*`: the other clients' view), heartbeats per second answered,
the head's CPU (% of one core, from /proc over the measured window) and its CPU per
heartbeat; then ratios delta / baseline; and the host's CPU steal over the run.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection as MpConnection
from pathlib import Path
from typing import Any, cast

import httpx

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _stat() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return sum(values), values[7]


def _baseline_tree(ref: str, into: Path) -> Path:
    """The `phalanx` package as it was at `ref`, extracted under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "phalanx"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


class HeadProcess:
    """`serve()` of the phalanx package at `source` (None: this tree) in a process."""

    def __init__(self, state: Path, source: Path | None) -> None:
        self.state = state
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        code = (
            "from pathlib import Path; from phalanx.head.server import serve; "
            f"serve(Path({str(state)!r}), '127.0.0.1', {port})"
        )
        env = {**os.environ, "PYTHONPATH": str(source or ROOT)}
        state.mkdir(parents=True, mode=0o700)
        self.log = open(state.parent / f"{state.name}.log", "wb")  # noqa: SIM115
        # Run from outside this tree: the working directory comes first on sys.path.
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(state.parent),
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError((state.parent / f"{state.name}.log").read_text()[-3000:])
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the head did not start in 60 s")
            time.sleep(0.1)

    def token(self, name: str) -> str:
        return (self.state / f"{name}.token").read_text().strip()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Connection:
    """One node's keep-alive HTTP/1.1 connection to the head, as plain as it gets: httpx
    costs the client ~1 ms of CPU per request and its pool O(connections) per request,
    which on a shared 2-core machine measures the clients rather than the head."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.prefix = (
            f"POST /v1/agent/heartbeat HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        ).encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(self.prefix + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _worker(
    conn: MpConnection,
    url: str,
    join: str,
    count: int,
    first: int,
    protocol: str,
    seconds: float,
) -> None:
    """One client process: `count` SimNodes. Registers them, says so, waits for "go", runs
    a warm-up, then the measured window; sends back its round trips and counts."""
    from phalanx.api.models import DesiredState
    from phalanx.testing.fleet import Fleet, Protocol, SimNode

    speak = cast(Protocol, protocol)
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def node_loop(
        node: SimNode, until: float, measure_from: float, offset: float, out: list[float]
    ) -> None:
        link = Connection(host, int(port), node.token)
        await asyncio.sleep(offset)
        try:
            while time.monotonic() < until:
                began = time.monotonic()
                beat = node.heartbeat(0.0, lambda _job: 95.0)
                sent = time.perf_counter()
                try:
                    status, answer = await link.post(beat.model_dump_json().encode())
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                    link.close()
                    errors.append(f"{node.name}: connection lost")
                    await asyncio.sleep(1.0)
                    continue
                if began >= measure_from:
                    out.append(time.perf_counter() - sent)
                node.heartbeats += 1
                if status == 422 and beat.delta is not None:
                    node.reports.reset()  # a head before deltas: full reports
                    continue
                if status != 200:
                    errors.append(f"{node.name}: {status} {answer[:200]!r}")
                    await asyncio.sleep(1.0)
                    continue
                raw = json.loads(answer)
                again = bool(raw.get("full_report"))
                if raw["version"] != node.version or again or (not node.running and raw["jobs"]):
                    node.apply(DesiredState.model_validate_json(answer), time.time())
                else:  # nothing new: only what the answer acknowledges
                    node.heartbeat_s = raw["heartbeat_s"]
                    node.reports.answered(raw.get("report_ack"), False)
                if again:
                    continue  # the head asks for a full report: at once
                await asyncio.sleep(max(0.0, node.heartbeat_s - (time.monotonic() - began)))
        finally:
            link.close()

    errors: list[str] = []

    async def main() -> dict[str, Any]:
        fleet = Fleet.make(url, join, count, first_address=first, prefix="hb", protocol=speak)
        fleet.concurrency = 32  # registering: a write each, in the head's one writer
        async with fleet.client() as client:
            await fleet.register_all(client)
        conn.send("registered")
        await asyncio.to_thread(conn.recv)  # "go": the jobs are queued
        interval = fleet.nodes[0].heartbeat_s
        start = time.monotonic()
        measure_from = start + max(6.0, 3 * interval)  # warm-up: jobs placed and reported
        until = measure_from + seconds
        latencies: list[float] = []
        spread = [interval * i / len(fleet.nodes) for i in range(len(fleet.nodes))]
        await asyncio.gather(
            *(
                node_loop(n, until, measure_from, o, latencies)
                for n, o in zip(fleet.nodes, spread, strict=True)
            )
        )
        fulls = sum(n.reports.full_reports for n in fleet.nodes)
        deltas = sum(n.reports.delta_reports for n in fleet.nodes)
        return {
            "latencies": latencies,
            "window_s": time.monotonic() - measure_from,
            "errors": errors[:5],
            "running": len(fleet.running_jobs()),
            "interval_s": fleet.nodes[0].heartbeat_s,
            "full_reports": fulls,
            "delta_reports": deltas,
        }

    conn.send(asyncio.run(main()))


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(
    name: str, source: Path | None, protocol: str, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    head = HeadProcess(tmp / f"{name}-head", source)
    try:
        ctx = multiprocessing.get_context("spawn")
        # The first client process holds only the probes (lightly loaded: their round trips
        # are the head's, not a busy client's); the others carry the rest of the fleet.
        probes = min(args.probes, args.nodes)
        load = args.nodes - probes
        per = -(-load // args.procs) if load else 0
        shares = [(probes, 0)] + [
            (min(per, load - i * per), probes + i * per)
            for i in range(args.procs)
            if load - i * per > 0
        ]
        pipes, procs = [], []
        for count, first in shares:
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_worker,
                args=(child, head.url, head.token("join"), count, first, protocol, args.seconds),
            )
            p.start()
            pipes.append(parent)
            procs.append(p)
        print(f"{name}: registering {args.nodes} nodes", file=sys.stderr, flush=True)
        for pipe in pipes:
            if pipe.recv() != "registered":
                raise RuntimeError("a client process failed to register its nodes")
        jobs = int(args.nodes * args.jobs)
        spec = {"command": ["train"], "workdir": "/tmp", "gpus_per_node": 8}
        with httpx.Client(
            base_url=head.url, headers={"Authorization": f"Bearer {head.token('admin')}"}
        ) as admin:
            for _ in range(jobs):
                admin.post("/v1/jobs", json=spec).raise_for_status()
        print(f"{name}: {jobs} jobs queued; heartbeating", file=sys.stderr, flush=True)
        (t0, s0) = _stat()
        for pipe in pipes:
            pipe.send("go")
        # The measured window starts after the warm-up: sample the head's CPU then.
        warm = max(6.0, 3 * 2.67)
        time.sleep(warm)
        cpu0, wall0 = _cpu_s(head.proc.pid), time.monotonic()
        results = [pipe.recv() for pipe in pipes]
        cpu1, wall1 = _cpu_s(head.proc.pid), time.monotonic()
        t1, s1 = _stat()
        for p in procs:
            p.join(timeout=30)
        latencies = results[0]["latencies"]  # the probes'
        loaded = [x for r in results[1:] for x in r["latencies"]]
        head_cpu_pct = 100.0 * (cpu1 - cpu0) / max(1e-9, wall1 - wall0)
        beats_per_s = sum(len(r["latencies"]) / r["window_s"] for r in results)
        return {
            "protocol": protocol,
            "head": "baseline" if source is not None else "this",
            "nodes": args.nodes,
            "running_jobs": sum(r["running"] for r in results),
            "interval_s": results[0]["interval_s"],
            "heartbeats_per_s": round(beats_per_s, 1),
            "probes": probes,
            "rtt_p50_ms": round(1000 * _pct(latencies, 0.50), 2),
            "rtt_p99_ms": round(1000 * _pct(latencies, 0.99), 2),
            "rtt_mean_ms": round(1000 * statistics.fmean(latencies), 2) if latencies else None,
            # The loaded clients' own view (includes their event loops' lag).
            "loaded_rtt_p50_ms": round(1000 * _pct(loaded, 0.50), 2),
            "loaded_rtt_p99_ms": round(1000 * _pct(loaded, 0.99), 2),
            "head_cpu_pct": round(head_cpu_pct, 1),
            "head_cpu_ms_per_heartbeat": round(
                10.0 * head_cpu_pct / max(1e-9, beats_per_s), 3
            ),  # % of a core / (beats/s) × 10 = ms of CPU per beat
            "reports": {
                "full": sum(r["full_reports"] for r in results),
                "delta": sum(r["delta_reports"] for r in results),
            },
            "errors": [e for r in results for e in r["errors"]][:5],
            "host_steal_pct": round(100.0 * (s1 - s0) / max(1, t1 - t0), 1),
        }
    finally:
        head.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--procs", type=int, default=2, help="client processes besides the probes'")
    ap.add_argument("--probes", type=int, default=50, help="nodes whose round trips are measured")
    ap.add_argument("--jobs", type=float, default=0.5, help="share of nodes running a job")
    ap.add_argument("--baseline-ref", default=None, help="git ref of the baseline head")
    args = ap.parse_args()
    ref = (
        args.baseline_ref
        or subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    out: dict[str, Any] = {
        "bench": "heartbeat",
        "nodes": args.nodes,
        "seconds": args.seconds,
        "client_processes": args.procs,
        "cpus": os.cpu_count(),
        "baseline_ref": ref,
    }
    with tempfile.TemporaryDirectory(prefix="phalanx-hb-") as d:
        tmp = Path(d)
        runs = {}
        if ref != "none":  # --baseline-ref none: this head's full reports are the baseline
            (tmp / "baseline").mkdir()
            base = _baseline_tree(ref, (tmp / "baseline").resolve())
            runs["baseline"] = run("baseline", base, "full", args, tmp)
        runs["full"] = run("full", None, "full", args, tmp)
        runs["delta"] = run("delta", None, "delta", args, tmp)
    out["runs"] = runs
    f, d_ = runs["full"], runs["delta"]
    b = runs.get("baseline", f)
    out["ratios"] = {
        "rtt_p99_delta_over_baseline": round(d_["rtt_p99_ms"] / b["rtt_p99_ms"], 3),
        "rtt_p50_delta_over_baseline": round(d_["rtt_p50_ms"] / b["rtt_p50_ms"], 3),
        "head_cpu_per_beat_delta_over_baseline": round(
            d_["head_cpu_ms_per_heartbeat"] / b["head_cpu_ms_per_heartbeat"], 3
        ),
        "head_cpu_per_beat_full_over_baseline": round(
            f["head_cpu_ms_per_heartbeat"] / b["head_cpu_ms_per_heartbeat"], 3
        ),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
