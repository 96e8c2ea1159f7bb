"""Phalanx behind the Slurm shims against a real Slurm on the same machine, side by side.

    python bench/slurm.py [--rounds 10] [--jobs 10000] [--runs 5] [--skip-queries]

Must run as root (the real slurmd starts job steps; phalanx.testing.slurmcluster).

1. **submitit round trip** (submit → result), `--rounds` sequential jobs each side, on
   - Phalanx: a LocalCluster (head + 2 agents, 2 fake GPUs each), the shims
     (`phalanx slurm-shims`) first on PATH;
   - Slurm: Debian's slurm-wlm 22.05 (a real slurmctld and 2 slurmd, SlurmCluster),
     `/usr/bin/sbatch` etc.;
   with submitit unchanged (`AutoExecutor(cluster="slurm")`, a function adding two numbers).
   Per round: `submit_s` (submitit's `sbatch FILE` call), `result_file_s` (the result
   pickle appears: submit, schedule, launch, Python start, run; polled every 10 ms in a
   thread) and `result_s` (`job.result()` returns, as a user sees it: submitit checks every
   second and calls `sacct` at 0, 2, 4, 8 s). `command_start_s`: `sinfo --version` on each
   side, a command that asks no one anything (for Phalanx: the Python start and imports every
   shim pays).
2. **Queries at `--jobs` jobs**: `squeue` (default columns), `squeue --json` and `sacct
   --parsable2` as fresh processes, `--runs` each, p50/max:
   - Slurm: `--jobs` held jobs submitted with `sbatch -H` (their submit rate is reported)
     for squeue; then all cancelled (`scancel -u root`), and `sacct -c --parsable2` reads
     them from the completion log (jobcomp/filetxt: this Slurm has no slurmdbd, so plain
     `sacct` answers "accounting storage is disabled");
   - Phalanx: a real head (SQLite, uvicorn, HTTP) seeded as bench/slurm_queries.py does:
     2 nodes, `--jobs` live jobs (2 running, the rest queued) for squeue and `--jobs` ended
     ones for `sacct --parsable2 -a -S now-7days -s CD,F`.

Ratios: Phalanx / Slurm (> 1: Phalanx slower). Prints one JSON object, with the host's CPU
steal and load average (this machine is shared: compare the two sides of one run only).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import submitit
import uvicorn
from dashboard import free_port, populate  # bench/dashboard.py
from observability import steal_pct  # bench/observability.py
from slurm_queries import measure_commands  # bench/slurm_queries.py
from submitit.slurm.slurm import SlurmJob

from phalanx.head.app import create_app
from phalanx.head.mirror import Settings
from phalanx.head.server import ADMIN_TOKEN_FILE, build
from phalanx.head.server import _tune_gc as tune_gc
from phalanx.local import LocalCluster
from phalanx.testing.slurmcluster import SLURM_BIN, SlurmCluster

QUERIES: dict[str, list[str]] = {
    "squeue": ["squeue"],
    "squeue_json": ["squeue", "--json"],
}
PHALANX_SACCT = ["sacct", "--parsable2", "-a", "-S", "now-7days", "-s", "CD,F"]
SLURM_SACCT = ["sacct", "-c", "--parsable2"]


def add(a: int, b: int) -> int:
    return a + b


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_s": round(statistics.median(values), 3),
        "p95_s": round(_pct(values, 0.95), 3),
        "max_s": round(max(values), 3),
    }


@contextmanager
def _environ(changes: Mapping[str, str], drop: tuple[str, ...] = ()) -> Iterator[None]:
    """This process's environment with `changes` (submitit calls sbatch from here)."""
    saved = dict(os.environ)
    for name in drop:
        os.environ.pop(name, None)
    os.environ.update(changes)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _watch(path: Callable[[], Path], stop: threading.Event, seen: list[float]) -> None:
    while not stop.is_set():
        if path().exists():
            seen.append(time.perf_counter())
            return
        time.sleep(0.01)


def roundtrips(folder: Path, rounds: int) -> dict[str, Any]:
    """`rounds` sequential submitit jobs with the Slurm commands first on PATH now."""
    SlurmJob.watcher.clear()  # the other side's job ids are the same numbers
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(timeout_min=10)
    submit_s, file_s, result_s = [], [], []
    for i in range(rounds):
        start = time.perf_counter()
        job = ex.submit(add, i, 1)
        submit_s.append(time.perf_counter() - start)
        stop, seen = threading.Event(), list[float]()
        watcher = threading.Thread(
            target=_watch, args=(lambda j=job: Path(j.paths.result_pickle), stop, seen)
        )
        watcher.start()
        try:
            value = job.result()
        finally:
            result_s.append(time.perf_counter() - start)
            stop.set()
            watcher.join()
        if value != i + 1:
            raise RuntimeError(f"round {i}: got {value!r}, expected {i + 1}")
        file_s.append((seen[0] if seen else time.perf_counter()) - start)
    return {
        "rounds": rounds,
        "submit_s": _summary(submit_s),
        "result_file_s": _summary(file_s),
        "result_s": _summary(result_s),
    }


def command_start(argv: list[str], runs: int) -> dict[str, float]:
    """How long a command that asks no one anything takes (`sinfo --version`)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True, timeout=120)
        times.append(time.perf_counter() - start)
    return _summary(times)


def phalanx_roundtrips(tmp: Path, rounds: int) -> dict[str, Any]:
    with LocalCluster(tmp / "cluster", nodes=2, gpus_per_node=2) as cluster:
        bin_dir = tmp / "slurm-bin"
        env = {**os.environ, **cluster.client_env(), "PHALANX_CONFIG_DIR": str(tmp / "config")}
        subprocess.run(
            [sys.executable, "-m", "phalanx", "slurm-shims", "--force", str(bin_dir)],
            env=env,
            check=True,
            capture_output=True,
        )
        venv = str(Path(sys.executable).parent)
        changes = {
            **cluster.client_env(),
            "PHALANX_CONFIG_DIR": env["PHALANX_CONFIG_DIR"],
            "PATH": f"{bin_dir}:{venv}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
        with _environ(changes, drop=("SLURM_CONF",)):
            out = roundtrips(tmp / "jobs", rounds)
            out["command_start_s"] = command_start([str(bin_dir / "sinfo"), "--version"], rounds)
            return out


def slurm_roundtrips(tmp: Path, rounds: int) -> dict[str, Any]:
    with SlurmCluster(tmp / "slurm", nodes=2, gpus_per_node=2) as slurm:
        venv = str(Path(sys.executable).parent)
        changes = {
            "SLURM_CONF": str(slurm.conf),
            "PATH": f"{SLURM_BIN}:{venv}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
        with _environ(changes, drop=("PHALANX_HEAD", "PHALANX_TOKEN")):
            out = roundtrips(tmp / "jobs", rounds)
            out["command_start_s"] = command_start([str(SLURM_BIN / "sinfo"), "--version"], rounds)
            return out


def slurm_queries(tmp: Path, jobs: int, runs: int) -> dict[str, Any]:
    conf = [f"MaxJobCount={jobs * 2 + 1000}", "MinJobAge=3600"]
    with SlurmCluster(tmp / "slurm", nodes=2, gpus_per_node=2, extra_conf=conf) as slurm:
        env = slurm.env()

        def submit(i: int) -> int:
            argv = [str(SLURM_BIN / "sbatch"), "-H", "-J", f"q{i}", "--wrap", "true"]
            return subprocess.run(argv, env=env, capture_output=True).returncode

        start = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            failed = sum(1 for rc in pool.map(submit, range(jobs)) if rc != 0)
        submit_wall = time.perf_counter() - start
        if failed:
            raise RuntimeError(f"{failed} of {jobs} sbatch calls failed")
        real = {k: [str(SLURM_BIN / v[0]), *v[1:]] for k, v in QUERIES.items()}
        out = measure_commands([], env, runs, real)
        slurm.run("scancel", "--user=root", timeout=300)
        deadline = time.monotonic() + 300
        while len(slurm._jobcomp_lines()) < jobs and time.monotonic() < deadline:
            time.sleep(0.5)
        sacct = {"sacct_parsable2": [str(SLURM_BIN / SLURM_SACCT[0]), *SLURM_SACCT[1:]]}
        out.update(measure_commands([], env, runs, sacct))
    out["submit"] = {
        "jobs": jobs,
        "wall_s": round(submit_wall, 1),
        "per_s": round(jobs / submit_wall),
    }
    return out


def phalanx_queries(tmp: Path, jobs: int, runs: int) -> dict[str, Any]:
    state = tmp / "head"
    state.mkdir(mode=0o700, parents=True)
    head = build(state, None, Settings(max_queued_per_user=0))
    populate(head, 2, jobs, jobs)
    tune_gc()
    token = (state / ADMIN_TOKEN_FILE).read_text().strip()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(head), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    env = {**os.environ, "PHALANX_HEAD": f"http://127.0.0.1:{port}", "PHALANX_TOKEN": token}
    env["PHALANX_CONFIG_DIR"] = str(tmp / "config")
    try:
        py = [sys.executable, "-m", "phalanx.slurmcli"]
        return measure_commands(py, env, runs, {**QUERIES, "sacct_parsable2": PHALANX_SACCT})
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=10, help="submitit jobs per side")
    p.add_argument("--jobs", type=int, default=10_000, help="jobs in each queue for queries")
    p.add_argument("--runs", type=int, default=5, help="runs of each query command")
    p.add_argument("--skip-queries", action="store_true", help="only the submitit round trip")
    args = p.parse_args()
    # submitit logs to stdout (e.g. each failed `sacct` on the real Slurm, which has no
    # accounting storage): keep stdout for the one JSON object.
    logging.getLogger("submitit").setLevel(logging.ERROR)
    if os.geteuid() != 0:
        p.error("run as root: the real Slurm side starts slurmctld and slurmd")
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as d:
        tmp = Path(d)
        rt = {
            "phalanx": phalanx_roundtrips(tmp / "p-rt", args.rounds),
            "slurm": slurm_roundtrips(tmp / "s-rt", args.rounds),
        }
        queries = None
        if not args.skip_queries:
            queries = {
                "phalanx": phalanx_queries(tmp / "p-q", args.jobs, args.runs),
                "slurm": slurm_queries(tmp / "s-q", args.jobs, args.runs),
            }
    steal = steal_pct(1.0)

    def ratio(a: Mapping[str, Any], b: Mapping[str, Any], key: str) -> float:
        return round(float(a[key]) / max(float(b[key]), 1e-6), 2)

    out: dict[str, Any] = {
        "submitit_roundtrip": rt,
        "submitit_ratios_phalanx_over_slurm_p50": {
            k: ratio(rt["phalanx"][k], rt["slurm"][k], "p50_s")
            for k in ("submit_s", "result_file_s", "result_s", "command_start_s")
        },
    }
    if queries is not None:
        out["queries"] = {"jobs": args.jobs, "runs": args.runs, **queries}
        out["query_ratios_phalanx_over_slurm_p50"] = {
            k: ratio(queries["phalanx"][k], queries["slurm"][k], "p50_s")
            for k in (*QUERIES, "sacct_parsable2")
        }
    out["bench_wall_s"] = round(time.perf_counter() - started, 1)
    out["host_steal_pct"] = steal
    out["load_average_1m"] = {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)}
    out["cpus"] = os.cpu_count()
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
