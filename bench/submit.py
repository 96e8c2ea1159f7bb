"""Control-plane throughput and latency: submits/s, submit→running latency, `queue` at 10k jobs.

    python bench/submit.py --db sqlite|postgresql --clients 32 [--jobs 10000] [--starts 40]

Starts a real local cluster (head + 2 agents × 4 fake GPUs, real processes), then:
- start latency on the idle cluster: `--starts` jobs of 2 nodes × 4 GPUs, one at a time;
  submit → all 8 ranks running, from the head's own timestamps (submit time and the
  "running" event, written when every rank has reported itself running);
- submits/s: `--clients` concurrent HTTP clients submit `--jobs` jobs; each answer comes
  after the job is committed to the database (durable); then the count is checked; beside
  it, the share of CPU time the virtual machine's host took away meanwhile (steal);
- `queue` with those jobs in the system: the API call `phalanx queue` makes + parse (rows
  of values, `format=table`), the same jobs as JobInfo models (`client.jobs()`), and the
  whole `phalanx queue` command as a process (Python start-up included);
- baseline, side by side: the same submits against a head with group commit turned off
  (PHALANX_MAX_BATCH=1: one transaction, one fsync, per submit);
- TLS against plain HTTP, side by side: the cluster above serves TLS (the default); the
  same start latency and submits against a cluster started with --plain-http (skip with
  --no-plain), each client connection doing one TLS handshake, as a keep-alive client does.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from phalanx.api.models import JobSpec
from phalanx.local.cluster import LocalCluster
from phalanx.testing.postgres import PostgresServer


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def start_latency(cluster: LocalCluster, count: int) -> list[float]:
    client = cluster.client()
    out = []
    for _ in range(count):
        spec = JobSpec(command=["true"], workdir="/tmp", nodes=2, gpus_per_node=4, name="lat")
        job_id = client.submit(spec).job_ids[0]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            detail = client.job(job_id)
            if detail.job.state in ("CD", "F", "CA", "TO"):
                break
            time.sleep(0.02)
        running = [e.time for e in detail.events if e.kind == "running"]
        if detail.job.state != "CD" or not running:
            raise SystemExit(f"latency job {job_id} ended {detail.job.state}: {detail.events}")
        out.append(running[0] - detail.job.submit_time)
    return out


def _client_process(args: tuple[str, str, str | None, list[int]]) -> None:
    """One load-generator process: a thread per connection, each submitting its share.

    Each connection is a plain keep-alive socket sending one complete, pre-encoded HTTP/1.1
    request at a time and reading the whole answer (status line, headers, Content-Length
    body) before the next: the load generator shares the head's 2 cores here, so it must
    cost little per request (http.client ~350 µs of CPU, httpx ~4 ms; this ~40 µs)."""
    url, token, ca, counts = args
    parsed = urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    tls = ssl.create_default_context(cafile=ca) if parsed.scheme == "https" else None
    body = JobSpec(command=["sleep", "3600"], workdir="/tmp", name="flood").model_dump_json()
    payload = body.encode()
    request = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    errors: list[str] = []

    def one(n: int) -> None:
        try:
            with socket.create_connection((host, port), timeout=60) as raw:
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = tls.wrap_socket(raw, server_hostname=host) if tls else raw
                buffer = b""
                for _ in range(n):
                    conn.sendall(request)
                    status, buffer = _read_answer(conn, buffer)
                    if status != 201:
                        errors.append(f"HTTP {status}: {buffer[:200]!r}")
                        return
        except (OSError, SystemExit) as e:  # a thread's exception would vanish otherwise
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, args=(n,)) for n in counts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"submit failed: {errors[0]}")


def _read_answer(conn: socket.socket, buffer: bytes) -> tuple[int, bytes]:
    """Read one HTTP/1.1 answer with a Content-Length body: its status and what is left
    over (nothing, for a client that sends one request at a time)."""
    while b"\r\n\r\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            raise SystemExit("the head closed the connection")
        buffer += chunk
    head, _, rest = buffer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = next(
        (
            int(v)
            for k, _, v in (h.partition(b":") for h in lines[1:])
            if k.lower() == b"content-length"
        ),
        None,
    )
    if length is None:
        raise SystemExit(f"an answer without Content-Length: {head[:200]!r}")
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            raise SystemExit("the head closed the connection mid-answer")
        rest += chunk
    if status != 201:
        return status, rest
    return status, rest[length:]


def cpu_steal() -> tuple[int, int] | None:
    """Linux: (steal, total) jiffies of all CPUs so far (None elsewhere). On a shared
    virtual machine the host takes CPU time away from this one; a flood's share of that is
    printed beside its rate, as it moves the rate."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    return int(fields[8]), sum(int(x) for x in fields[1:9])


def steal_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round(100 * (after[0] - before[0]) / (after[1] - before[1]), 1)


def flood(cluster: LocalCluster, jobs: int, clients: int) -> tuple[float, float | None]:
    """`clients` concurrent connections, spread over a few processes (so the load generator,
    not the head, is never the single-core bottleneck of one Python process): the seconds
    the submits took and the host's CPU steal meanwhile (percent; None where unknown)."""
    per_client = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    procs = min(4, clients)
    url, token = cluster.url, cluster.admin_token
    ca = str(cluster.ca_file) if cluster.ca_file else None
    shares = [(url, token, ca, per_client[i::procs]) for i in range(procs)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(procs) as pool:
        pool.map(_client_process, [(url, token, ca, [1]) for _ in range(procs)])  # warm up
        steal_before = cpu_steal()
        t0 = time.perf_counter()
        pool.map(_client_process, shares)
        elapsed = time.perf_counter() - t0
        return elapsed, steal_pct(steal_before, cpu_steal())


def queue_times(cluster: LocalCluster, config_dir: Path) -> tuple[float, float, float, int]:
    """Medians: the API call `phalanx queue` makes (rows, JobTable), the same jobs as
    JobInfo models (JobList), and the whole `phalanx queue` process; the count listed."""
    client = cluster.client()
    api, models = [], []
    count = 0
    for _ in range(5):
        t0 = time.perf_counter()
        count = len(client.job_table(active=True, limit=100_000).rows)
        api.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        if len(client.jobs(active=True, limit=100_000).jobs) != count:
            raise SystemExit("the table and the object listing disagree")
        models.append(time.perf_counter() - t0)
    env = {
        **os.environ,
        **cluster.client_env(),
        "PHALANX_CONFIG_DIR": str(config_dir),
        "COLUMNS": "200",
    }
    cli = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "phalanx.cli.main", "queue", "--limit", "100000"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        cli.append(time.perf_counter() - t0)
    return statistics.median(api), statistics.median(models), statistics.median(cli), count


def run_cluster(
    root: Path, name: str, db_url: str | None, max_batch: int | None, tls: bool = True
) -> LocalCluster:
    if max_batch is not None:
        os.environ["PHALANX_MAX_BATCH"] = str(max_batch)
    else:
        os.environ.pop("PHALANX_MAX_BATCH", None)
    # No per-user cap: the flood is one user's 10,000 queued jobs on purpose.
    cluster = LocalCluster(
        root / name,
        nodes=2,
        gpus_per_node=4,
        db_url=db_url,
        tls=tls,
        head_args=["--max-queued-per-user", "0"],
    )
    cluster.start()
    return cluster


def plain_run(
    root: Path, db_url: str | None, args: argparse.Namespace, tls_rate: float, tls_lat: list[float]
) -> dict[str, object]:
    """The same start latency and submits against a head serving plain HTTP (the TLS run's
    figures are the top-level ones), with the ratios TLS / plain."""
    plain = run_cluster(root, "plain", db_url, None, tls=False)
    try:
        lat = start_latency(plain, args.starts)
        elapsed, steal = flood(plain, args.jobs, args.clients)
    finally:
        plain.stop()
    rate = args.jobs / elapsed
    return {
        "submits_per_s": round(rate, 1),
        "cpu_steal_pct_during_submits": steal,
        "start_p50_s": round(percentile(lat, 0.5), 4),
        "start_p99_s": round(percentile(lat, 0.99), 4),
        "tls_submit_rate_ratio": round(tls_rate / rate, 3),
        "tls_start_p50_ratio": round(percentile(tls_lat, 0.5) / percentile(lat, 0.5), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--baseline-jobs", type=int, default=2_000)
    parser.add_argument(
        "--no-plain", action="store_true", help="skip the plain-HTTP run beside the TLS one"
    )
    args = parser.parse_args()
    if args.clients < 1 or args.jobs < args.clients or args.starts < 1:
        parser.error("need --clients ≥ 1, --jobs ≥ --clients and --starts ≥ 1")

    pg = PostgresServer().start() if args.db == "postgresql" else None
    root = Path(tempfile.mkdtemp(prefix="phalanx-bench-"))
    try:
        result: dict[str, object] = {"db": args.db, "clients": args.clients, "jobs": args.jobs}
        cluster = run_cluster(root, "grouped", pg.url if pg else None, None)
        try:
            lat = start_latency(cluster, args.starts)
            print(f"start latency measured over {len(lat)} jobs", file=sys.stderr)
            elapsed, steal = flood(cluster, args.jobs, args.clients)
            api_s, models_s, cli_s, count = queue_times(cluster, root / "config")
            total = len(cluster.client().jobs(active=True, ended=True, limit=100_000).jobs)
        finally:
            cluster.stop()
        expected = args.jobs + args.starts + min(4, args.clients)  # + the warm-up submits
        if total < expected:
            raise SystemExit(f"only {total} of {expected} jobs were stored")
        if pg:
            pg.reset()
        base = run_cluster(root, "baseline", pg.url if pg else None, 1)
        try:
            base_elapsed, _ = flood(base, args.baseline_jobs, args.clients)
            base_total = len(base.client().jobs(active=True, ended=True, limit=100_000).jobs)
        finally:
            base.stop()
            os.environ.pop("PHALANX_MAX_BATCH", None)
        base_expected = args.baseline_jobs + min(4, args.clients)
        if base_total < base_expected:
            raise SystemExit(f"baseline: only {base_total} of {base_expected} jobs were stored")
        rate = args.jobs / elapsed
        base_rate = args.baseline_jobs / base_elapsed
        if not args.no_plain:
            if pg:
                pg.reset()
            result["plain_http"] = plain_run(root, pg.url if pg else None, args, rate, lat)
        result.update(
            submits_per_s=round(rate, 1),
            cpu_steal_pct_during_submits=steal,
            start_p50_s=round(percentile(lat, 0.5), 4),
            start_p99_s=round(percentile(lat, 0.99), 4),
            queue_10k_ms=round(api_s * 1000, 1),
            queue_10k_as_models_ms=round(models_s * 1000, 1),
            queue_10k_cli_process_ms=round(cli_s * 1000, 1),
            jobs_listed=count,
            baseline_one_commit_per_submit_per_s=round(base_rate, 1),
            group_commit_ratio=round(rate / base_rate, 2),
            target_submits_per_s=2000 if args.db == "sqlite" else 1000,
            target_start_p50_s=0.5,
            target_start_p99_s=1.0,
            target_queue_ms=300,
        )
        print(json.dumps(result))
    finally:
        if pg:
            pg.stop()


if __name__ == "__main__":
    main()
