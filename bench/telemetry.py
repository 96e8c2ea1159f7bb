"""Telemetry store: bytes per GPU per day, ingest cost, and submits/s with ingest on vs off.

    python bench/telemetry.py [--nodes 1000] [--gpus 8] [--jobs 3000] [--clients 16]

1. Storage: one node × `--gpus` GPUs sampled every 10 s for a day by the agent's own
   sampler over fake GPUs running a mix of jobs (busy with noise, declared 35%, idle), fed
   through the head's store (head/tsdb.py: a chunk a minute, compacted hourly, minute and
   hour rollups) on SQLite. Bytes per GPU per day at each level, extrapolated to the
   issue's target (8,000 GPUs: a week of raw samples plus 30 days of minutes and a year
   of hours) — beside the baseline, one SQL row per GPU sample (indexed), measured the
   same way.
2. Ingest cost: `--nodes` nodes × `--gpus` GPUs at 10 s, each node shipping one sample
   every 10 s (the agent default). (a) In-process, what the head's store does per round
   (parse the JSON body, queue, ingest; a flush every 30 s), as CPU % of one core;
   baseline: the same samples as one row each. (b) End to end: a real head process
   (SQLite) given every node's batch over HTTP (node credentials), its own CPU time per
   round from /proc.
3. Submits/s against that head (bench/submit.py's load generator), with the telemetry of
   `--nodes` nodes flowing at the 10 s rate, and with none: three of each, alternating
   (a shared machine drifts), medians side by side and their ratio; beside it, how long
   one flush of 30 s of every node's samples takes (the SQLite write lock it holds).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from phalanx.agent import fakeload
from phalanx.agent.fakeload import Holding
from phalanx.agent.gpus import FakeProvider
from phalanx.agent.telemetry import Sample, Sampler, batch_of
from phalanx.api.telemetry import TelemetryBatch
from phalanx.head import db
from phalanx.head.migrate import upgrade
from phalanx.head.telemetry import GpuSamples
from phalanx.head.tsdb import HOUR, MINUTE, RAW, TelemetryStore
from phalanx.local.cluster import LocalCluster
from phalanx.testing.clock import FakeClock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from submit import _client_process  # bench/ is not a package

DAY = 86400.0
T0 = 19676 * DAY  # a midnight
TARGET_GPUS = 8000
NAIVE_SCHEMA = (
    "CREATE TABLE samples (node TEXT, gpu INTEGER, time REAL, util REAL, memory INTEGER, "
    "power REAL, temperature REAL, energy REAL, job INTEGER, epoch INTEGER);"
    "CREATE INDEX ix_samples ON samples (node, gpu, time);"
)


# ----------------------------------------------------------------------------- 1. storage
def _noisy(minutes: list[list[Sample]], seed: int = 1) -> list[list[Sample]]:
    """The same day with every reading random (utilisation 0-100 at 0.1%, memory, power,
    temperature): the worst case for compression, as an upper bound on real GPUs."""
    rng = np.random.default_rng(seed)
    out = []
    for batch in minutes:
        noisy = []
        for s in batch:
            gpus = tuple(
                g.model_copy(
                    update={
                        "utilization_pct": round(float(rng.uniform(0, 100)), 1),
                        "memory_used_mb": int(rng.integers(0, 81559)),
                        "power_w": round(float(rng.uniform(65, 700)), 1),
                        "temperature_c": round(float(rng.uniform(30, 85)), 1),
                    }
                )
                for g in s.gpus
            )
            noisy.append(Sample(s.time, gpus, s.epochs, s.jobs))
        out.append(noisy)
    return out


def _day_of_samples(gpus: int) -> list[list[Sample]]:
    """A day of 10 s samples of one node, a minute (6 samples) per list."""
    clock = FakeClock(T0)
    d = Path(tempfile.mkdtemp())
    half, three_q = gpus // 2, 3 * gpus // 4
    jobs = {
        "a": Holding(101, 1, tuple(range(half)), {}, d, None, (), 0),  # busy (default)
        "b": Holding(
            102, 1, tuple(range(half, three_q)), {fakeload.UTIL_ENV: "35"}, d, None, (), 0
        ),
        "c": Holding(103, 1, tuple(range(three_q, gpus)), {}, d, None, (), 0),
    }

    def holdings() -> list[Holding]:
        hour = (clock.time() - T0) / 3600
        out = [jobs["a"], jobs["b"]]
        if hour >= 12:  # the last GPUs idle half the day, then busy
            out.append(jobs["c"])
        return out

    provider = FakeProvider(
        gpus, load=lambda: fakeload.loads(holdings()), clock=clock.monotonic, node_name="n1"
    )
    sampler = Sampler(provider, holdings, clock=clock.time, buffer=10)
    minutes = []
    for _ in range(1440):
        batch = []
        for _ in range(6):
            batch.append(sampler.sample_once())
            clock.advance(10)
        minutes.append(batch)
    return minutes


def storage(gpus: int, noisy: bool = False) -> dict[str, Any]:
    minutes = _day_of_samples(gpus)
    if noisy:
        minutes = _noisy(minutes)
    with tempfile.TemporaryDirectory() as tmp:
        engine = db.make_engine(f"sqlite:///{tmp}/tele.db")
        upgrade(engine)
        clock = FakeClock(T0)
        store = TelemetryStore(engine, clock.time, GpuSamples())
        for i, batch in enumerate(minutes):
            clock.wall = batch[-1].time
            store.submit(batch_of("n1", batch, 0, clock.wall))
            store.drain()
            store.flush()
            if i % 60 == 59:
                store.maintain(clock.wall + 30)
        store.maintain(T0 + DAY + 2 * 3600)  # the day's hour rollups
        levels = store.bytes_stored()
        engine.dispose()
        naive = _naive_bytes(minutes[:60], tmp)  # an hour, one row per GPU sample
    per_gpu_day = {lvl: levels.get(lvl, (0, 0))[1] / gpus for lvl in (RAW, MINUTE, HOUR)}
    rows = {lvl: levels.get(lvl, (0, 0))[0] for lvl in (RAW, MINUTE, HOUR)}
    row_overhead = 80  # per chunk row: node, level, times, count, id, index entries
    ours = {lvl: per_gpu_day[lvl] + rows[lvl] * row_overhead / gpus for lvl in (RAW, MINUTE, HOUR)}
    total = TARGET_GPUS * (7 * ours[RAW] + 30 * ours[MINUTE] + 365 * ours[HOUR])
    naive_per_gpu_day = naive * 24 / gpus
    return {
        "samples_per_gpu_per_day": 8640,
        "raw_bytes_per_gpu_day": round(ours[RAW]),
        "minute_bytes_per_gpu_day": round(ours[MINUTE]),
        "hour_bytes_per_gpu_day": round(ours[HOUR]),
        "raw_bytes_per_sample": round(ours[RAW] / 8640, 2),
        "chunk_rows_per_node_day": rows,
        "target_8000_gpus_week_raw_year_rollups_gb": round(total / 1e9, 2),
        "baseline_row_per_sample_bytes_per_gpu_day": round(naive_per_gpu_day),
        "baseline_8000_gpus_week_raw_gb": round(TARGET_GPUS * 7 * naive_per_gpu_day / 1e9, 2),
        "ratio_raw_baseline_over_ours": round(naive_per_gpu_day / ours[RAW], 1),
    }


def _naive_bytes(minutes: list[list[Sample]], tmp: str) -> int:
    """Bytes an SQLite file grows by for these samples stored one row per GPU sample."""
    path = f"{tmp}/naive.db"
    conn = sqlite3.connect(path)
    conn.executescript(NAIVE_SCHEMA)
    conn.commit()
    conn.execute("VACUUM")
    before = os.path.getsize(path)
    for batch in minutes:
        conn.executemany(
            "INSERT INTO samples VALUES (?,?,?,?,?,?,?,?,?,?)",
            [
                ("n1", g.index, s.time, g.utilization_pct, g.memory_used_mb, g.power_w,
                 g.temperature_c, g.energy_j, g.job_id, e)
                for s in batch for g, e in zip(s.gpus, s.epochs, strict=True)
            ],
        )  # fmt: skip
        conn.commit()
    conn.execute("VACUUM")
    conn.close()
    return os.path.getsize(path) - before


# ----------------------------------------------------------------------------- 2. ingest
def _bodies(nodes: int, gpus: int, t: float, samples: int = 1) -> list[bytes]:
    """One batch per node: `samples` samples 10 s apart ending at `t`, of each GPU, half of
    them held by a job."""
    times = [t - 10.0 * (samples - 1 - k) for k in range(samples)]
    out = []
    for n in range(nodes):
        util = [93.0 + (n * 7 + g) % 5 if g < gpus // 2 else 0.0 for g in range(gpus)]
        body = {
            "node": f"n{n}",
            "sent_at": t,
            "gpus": list(range(gpus)),
            "times": times,
            "utilization_pct": util * samples,
            "memory_used_mb": [60_000 if g < gpus // 2 else 0 for g in range(gpus)] * samples,
            "power_w": [650.0 if g < gpus // 2 else 65.0 for g in range(gpus)] * samples,
            "temperature_c": [70.0 if g < gpus // 2 else 32.0 for g in range(gpus)] * samples,
            "energy_j": [1e6 + 650.0 * x for x in times for _ in range(gpus)],
            "job_id": [n + 1 if g < gpus // 2 else None for g in range(gpus)] * samples,
            "epoch": [1 if g < gpus // 2 else None for g in range(gpus)] * samples,
        }
        out.append(json.dumps(body).encode())
    return out


def ingest_in_process(nodes: int, gpus: int, ship: int, rounds: int = 6) -> dict[str, Any]:
    per = max(1, ship // 10)  # samples per batch
    with tempfile.TemporaryDirectory() as tmp:
        engine = db.make_engine(f"sqlite:///{tmp}/tele.db")
        upgrade(engine)
        clock = FakeClock(T0)
        store = TelemetryStore(engine, clock.time, GpuSamples())
        naive = sqlite3.connect(f"{tmp}/naive.db")
        naive.executescript(NAIVE_SCHEMA)
        ours = base = 0.0
        for r in range(rounds):
            clock.wall = T0 + 10 * per * (r + 1)
            bodies = _bodies(nodes, gpus, clock.wall, per)
            c0 = time.process_time()
            for body in bodies:
                store.submit(TelemetryBatch.model_validate_json(body))
            store.drain()
            if (r + 1) * per % 3 == 0:
                store.flush()  # the store flushes every 30 s
            ours += time.process_time() - c0
            c0 = time.process_time()
            rows = []
            for body in bodies:
                b = TelemetryBatch.model_validate_json(body)
                g = len(b.gpus)
                for k, t in enumerate(b.times):
                    for i, gpu in enumerate(b.gpus):
                        j = k * g + i
                        rows.append((b.node, gpu, t, b.utilization_pct[j], b.memory_used_mb[j],
                                     b.power_w[j], b.temperature_c[j], b.energy_j[j],
                                     b.job_id[j], b.epoch[j]))  # fmt: skip
            naive.executemany("INSERT INTO samples VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
            naive.commit()
            base += time.process_time() - c0
        # One flush of 30 s of every node's samples (what the store writes every 30 s): the
        # time it holds SQLite's write lock, which a submit's commit may wait for.
        for r in range(3):
            clock.wall = T0 + 10 * per * rounds + 10 * (r + 1)
            for body in _bodies(nodes, gpus, clock.wall):
                store.submit(TelemetryBatch.model_validate_json(body))
            store.drain()
        f0 = time.perf_counter()
        store.flush()
        flush_ms = 1000 * (time.perf_counter() - f0)
        # The hourly pass (compaction and minute rollups) for every node, amortised per round.
        clock.wall = T0 + 3600 + 60
        c0 = time.process_time()
        store.maintain(clock.wall)
        compact = time.process_time() - c0
        naive.close()
        engine.dispose()
    seconds = 10.0 * per * rounds
    return {
        "store_cpu_pct_of_one_core": round(100 * ours / seconds, 2),
        "flush_of_30s_all_nodes_ms": round(flush_ms, 1),
        "flush_longest_transaction_ms": store.counters.longest_flush_tx_ms,
        "hourly_compaction_cpu_s": round(compact, 3),
        "hourly_compaction_cpu_pct_of_one_core": round(100 * compact / 3600, 3),
        "baseline_row_per_sample_cpu_pct_of_one_core": round(100 * base / seconds, 2),
    }


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _register(url: str, join: str, nodes: int, gpus: int) -> list[str]:
    tokens = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {join}"}, timeout=60) as c:
        for n in range(nodes):
            reg = {
                "name": f"n{n}", "address": f"10.0.{n // 250}.{n % 250 + 1}",
                "agent_url": "http://127.0.0.1:1", "agent_secret": "s" * 32, "cpus": 64,
                "memory_mb": 512_000,
                "gpus": [{"index": g, "uuid": f"GPU-{n}-{g}", "model": "H100", "memory_mb": 81559}
                         for g in range(gpus)],
            }  # fmt: skip
            r = c.post("/v1/agent/register", json=reg)
            r.raise_for_status()
            tokens.append(r.json()["node_token"])
    return tokens


def _feeder(url: str, tokens: list[str], nodes: int, gpus: int, ship: int, stop: Any) -> None:
    """Post each node's batch once per `ship` seconds, spread evenly, fresh samples each
    cycle, on keep-alive sockets."""
    host, port = url.split("://")[1].split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(4)]
    per = max(1, ship // 10)
    gap = ship / len(tokens)
    nxt = time.monotonic()
    i = 0
    bodies: list[bytes] = []
    while not stop.is_set():
        if i % len(tokens) == 0:
            bodies = _bodies(nodes, gpus, time.time(), per)
        body = bodies[i % len(tokens)]
        req = (
            f"POST /v1/telemetry HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
            f"{tokens[i % len(tokens)]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        s = socks[i % 4]
        s.sendall(req)
        _read_all(s)
        i += 1
        nxt += gap
        delay = nxt - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _read_all(s: socket.socket) -> None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = next(int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])
                  if k.lower() == b"content-length")  # fmt: skip
    while len(rest) < length:
        rest += s.recv(65536)


def over_http(nodes: int, gpus: int, ship: int, jobs: int, clients: int) -> dict[str, Any]:
    per = max(1, ship // 10)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), nodes=1, gpus_per_node=1, tls=False)
        with cluster:
            head_pid = cluster.processes()[0].pid
            tokens = _register(cluster.url, cluster.join_token, nodes, gpus)
            t = time.time() - 3600  # the rounds below move on from here, 10 s a sample
            bodies = _bodies(nodes, gpus, t)
            # Bodies carry each node's own name: pair them.
            with httpx.Client(timeout=60) as c:  # warm up every node once
                for tok, body in zip(tokens, bodies, strict=True):
                    r = c.post(f"{cluster.url}/v1/telemetry", content=body,
                               headers={"Authorization": f"Bearer {tok}",
                                        "Content-Type": "application/json"})  # fmt: skip
                    r.raise_for_status()
            # (b) a round: every node's batch, as fast as the head takes them.
            rounds = 3
            cpu0, w0 = _cpu_s(head_pid), time.monotonic()
            for k in range(rounds):
                fresh = _bodies(nodes, gpus, t + 10.0 * per * (k + 1), per)
                _one_pass(cluster.url, tokens, fresh)
            cpu = (_cpu_s(head_pid) - cpu0) / rounds
            wall = (time.monotonic() - w0) / rounds
            # 3. submits/s, telemetry off then on, alternating: a shared machine drifts
            rates: dict[str, list[float]] = {"off": [], "on": []}
            for mode in ("off", "on") * 3:
                stop = threading.Event()
                feeder = None
                if mode == "on":
                    feeder = threading.Thread(
                        target=_feeder,
                        args=(cluster.url, tokens, nodes, gpus, ship, stop),
                        daemon=True,
                    )
                    feeder.start()
                    time.sleep(1.0)
                rates[mode].append(_flood(cluster.url, cluster.admin_token, jobs, clients))
                stop.set()
                if feeder is not None:
                    feeder.join(timeout=15)
                _cancel_all(cluster.url, cluster.admin_token)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    return {
        "head_cpu_s_per_round_all_nodes": round(cpu, 3),
        "head_cpu_pct_of_one_core": round(100 * cpu / (10.0 * per), 2),
        "round_wall_s": round(wall, 3),
        "submits_per_s_telemetry_off": round(off),
        "submits_per_s_telemetry_on": round(on),
        "submits_ratio_on_over_off": round(on / off, 3),
        "submit_runs": {k: [round(x) for x in v] for k, v in rates.items()},
    }


def _cancel_all(url: str, token: str) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=120, headers=auth) as c:
        listed = c.get("/v1/jobs", params={"active": True, "limit": 100000}).json()["jobs"]
        for job in listed:
            c.post(f"/v1/jobs/{job['id']}/cancel")


def _one_pass(url: str, tokens: list[str], bodies: list[bytes]) -> None:
    host, port = url.split("://")[1].split(":")
    s = socket.create_connection((host, int(port)))
    try:
        for tok, body in zip(tokens, bodies, strict=True):
            s.sendall(
                (
                    f"POST /v1/telemetry HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {tok}"
                    f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode()
                + body
            )
            _read_all(s)
    finally:
        s.close()


def _flood(url: str, token: str, jobs: int, clients: int) -> float:
    per = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    procs = min(4, clients)
    shares = [(url, token, None, per[i::procs]) for i in range(procs)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(procs) as pool:
        pool.map(_client_process, [(url, token, None, [1]) for _ in range(procs)])
        t0 = time.perf_counter()
        pool.map(_client_process, shares)
        return (jobs) / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--ship", type=int, default=10, help="seconds between a node's batches")
    p.add_argument("--no-http", action="store_true", help="skip parts 2b and 3")
    p.add_argument("--no-storage", action="store_true", help="skip part 1")
    a = p.parse_args()
    out: dict[str, Any] = {
        "nodes": a.nodes, "gpus_per_node": a.gpus, "interval_s": 10, "ship_s": a.ship
    }  # fmt: skip
    if not a.no_storage:
        out["storage"] = storage(a.gpus)
        out["storage_worst_case_random_readings"] = storage(a.gpus, noisy=True)
    out["ingest_in_process"] = ingest_in_process(a.nodes, a.gpus, a.ship)
    if not a.no_http:
        out["http"] = over_http(a.nodes, a.gpus, a.ship, a.jobs, a.clients)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
