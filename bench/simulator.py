"""Simulator benchmark: the full Philly trace on the default layout and 1M synthetic jobs on
100,000 GPUs, this checkout against a baseline revision, side by side in one invocation.

* philly — all 82,247 jobs of the Philly CSV on `phalanx sim`'s default layout (64 nodes
  × 8 GPUs = 512 GPUs, racks of 32), default policy (priority + fair share, EASY backfill,
  preemption). Target ≤ 10 s.
* synthetic — `--synthetic-jobs` (default 1,000,000) seeded jobs at offered load 0.9 on
  `--synthetic-nodes` (default 12,500) × 8 GPUs, as `phalanx sim --synthetic 1000000
  --nodes 12500 --load 0.9`. Target ≤ 120 s.

Baseline: the same runs with the code of `--baseline-rev` (default: the last commit before
this round of speed-ups), exported with `git archive` into a temporary folder. Every run
is a fresh interpreter; baseline and new runs alternate. Each run reports wall seconds of
the simulation (trace loading apart), the CPU seconds of its process, and the host's CPU
steal and load average over it (the machine is shared: CPU seconds move less than wall
seconds), and the process's peak resident memory (loading included). `same_outcome`
compares a digest of every job's start and end time, the cycle count and the utilisation
series of the two versions, computed in this run.

Run:  .venv/bin/python bench/simulator.py [--synthetic-jobs N] [--skip-synthetic]
Prints one JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from phalanx.sim.demo import find_trace

REPO = Path(__file__).resolve().parents[1]
# The last commit before this round of work (branch simfast2); 60bc35e, the last before
# the first round (branch simfast), can be passed with --baseline-rev.
BASELINE_REV = "d2d181f"
PHILLY_TARGET_S = 10.0
SYNTHETIC_TARGET_S = 120.0

# Runs inside a fresh interpreter whose `phalanx` is the version under test.
CHILD = r"""
import hashlib, json, resource, sys, time
from phalanx.sim.engine import SimConfig, simulate
from phalanx.sim.layout import uniform
from phalanx.sim.workload import read_philly, synthetic
from pathlib import Path
kind, arg, nodes = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
if kind == "philly":
    workload = read_philly(Path(arg))
else:
    workload = synthetic(int(arg), nodes * 8, load=0.9)
load_s = time.perf_counter() - t0
layout = uniform(nodes, 8)
wall0, cpu0 = time.perf_counter(), time.process_time()
res = simulate(layout, workload, SimConfig())
wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
digest = hashlib.sha256()
for series in (res.start, res.finish, res.busy, res.queued):
    digest.update(bytes(series))
digest.update(str(res.cycles).encode())
print(json.dumps({
    "jobs": len(res.submit), "gpus": res.gpus, "cycles": res.cycles,
    "load_s": round(load_s, 2), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
    "outcome": digest.hexdigest()[:16],
    "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
}))
"""


def cpu_counters() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs so far, from /proc/stat (None elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n")[0].split()
    except OSError:
        return None
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    return int(fields[8]), sum(int(x) for x in fields[1:9])


def run_child(tree: Path, kind: str, arg: str, nodes: int) -> dict[str, Any]:
    before = cpu_counters()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, arg, str(nodes)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    after = cpu_counters()
    result: dict[str, Any] = json.loads(out.stdout)
    if before and after:
        result["steal_pct"] = round(
            100.0 * (after[0] - before[0]) / max(1, after[1] - before[1]), 1
        )
    result["loadavg_1m"] = os.getloadavg()[0]
    return result


def export(rev: str, into: Path) -> Path:
    """The `phalanx` package of `rev`, extracted under `into`."""
    archive = into / "baseline.tar"
    subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), rev, "phalanx"],
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def compare(name: str, new: dict[str, Any], base: dict[str, Any], target: float) -> dict[str, Any]:
    return {
        "new": new,
        "baseline": base,
        "speedup_wall": round(base["wall_s"] / max(new["wall_s"], 1e-9), 2),
        "speedup_cpu": round(base["cpu_s"] / max(new["cpu_s"], 1e-9), 2),
        "same_outcome": new["outcome"] == base["outcome"],
        "target_s": target,
        "meets_target_wall": new["wall_s"] <= target,
        "meets_target_cpu": new["cpu_s"] <= target,
        "what": name,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--baseline-rev", default=BASELINE_REV)
    parser.add_argument("--synthetic-jobs", type=int, default=1_000_000)
    parser.add_argument("--synthetic-nodes", type=int, default=12_500)
    parser.add_argument("--skip-synthetic", action="store_true")
    args = parser.parse_args()

    trace = str(find_trace())
    out: dict[str, Any] = {"benchmark": "simulator", "baseline_rev": args.baseline_rev}
    with tempfile.TemporaryDirectory(prefix="phalanx-simbench-") as tmp:
        base_tree = export(args.baseline_rev, Path(tmp))
        runs = [("philly", trace, 64, PHILLY_TARGET_S, "full Philly CSV, 64 × 8 GPUs")]
        if not args.skip_synthetic:
            what = f"{args.synthetic_jobs:,} synthetic jobs, {args.synthetic_nodes:,} × 8 GPUs"
            runs.append(
                (
                    "synthetic",
                    str(args.synthetic_jobs),
                    args.synthetic_nodes,
                    SYNTHETIC_TARGET_S,
                    what,
                )
            )
        for kind, arg, nodes, target, what in runs:
            print(f"{kind}: baseline ({args.baseline_rev}) …", file=sys.stderr, flush=True)
            base = run_child(base_tree, kind, arg, nodes)
            print(f"  {base}\n{kind}: new …", file=sys.stderr, flush=True)
            new = run_child(REPO, kind, arg, nodes)
            print(f"  {new}", file=sys.stderr, flush=True)
            out[kind] = compare(what, new, base, target)
    out["cpus"] = os.cpu_count()
    out["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
