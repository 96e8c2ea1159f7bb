"""How fast the serving planner answers "how many GPUs for this traffic", up to 100k GPUs.

Measures `phalanx.core.planner.plan` (capacity curves on cells of 8 replicas, see its
docstring) on the Azure 2023 conversation trace's lengths and an H100-class profile
(`--profile`, default: one written below, an 8B-class model on one H100 at 64 slots;
a made-up but plausible profile — the planner's speed does not depend on its numbers):

- `plan_seconds_*`: wall time of one plan for traffic sized to ~100, ~10,000 and ~100,000
  GPUs (the rate is the cell capacity × the GPUs wanted);
- the baseline: the naive search — simulate the WHOLE pool of n replicas for each probe,
  binary search on n — at the ~100-GPU rate only (at 100k GPUs it would simulate 100k
  replicas per probe); `speedup_100` = its time / the planner's at the same rate, and both
  answers side by side (the cells' answer is an approximation of the whole pool's: both
  come from finite simulations, so they differ by a few percent either way).

    .venv/bin/python bench/serve_plan.py            # ~1 minute on 2 shared cores

Prints one JSON object, with the host's CPU steal and load average over the run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

from phalanx.core import planner
from phalanx.serve.bench import traces
from phalanx.sim.serving import workload_from_trace

H100_8B = planner.LatencyProfile(
    name="h100-8b-class (assumed)",
    prefill_base_ms=15,
    prefill_per_token_ms=0.06,
    prefill_per_token2_ms=0.001,
    decode_base_ms=12,
    decode_per_seq_ms=0.15,
    decode_per_ctx_ms=0.00002,
    slots=64,
    gpus=1,
    kv_transfer_per_token_ms=0.001,
)


def steal() -> tuple[int, int]:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in fields]
    return (values[7] if len(values) > 7 else 0), sum(values)


def naive(
    profile: planner.LatencyProfile,
    workload: planner.Workload,
    slo: planner.Slo,
    cfg: planner.SearchConfig,
) -> int:
    """Whole-pool simulation per probe, binary search on the replica count."""

    def holds(n: int) -> bool:
        count = max(cfg.requests, cfg.per_slot * n * profile.slots)
        out = planner.simulate(profile, workload, replicas=n, requests=count, seed=cfg.seed)
        warm = min(len(out) // 4, n * profile.slots)
        return planner.joint_attainment(out[warm:], slo) >= slo.attainment

    hi = 1
    while not holds(hi):
        hi *= 2
    lo = hi // 2  # fails (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    return hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", type=Path, help="a profile JSON (serve calibrate's output)")
    ap.add_argument("--trace", default="azure-conv", choices=sorted(traces.TRACE_FILES))
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--ttft-ms", type=float, default=500.0)
    ap.add_argument("--tpot-ms", type=float, default=50.0)
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args()
    profile = H100_8B
    if args.profile:
        raw = json.loads(args.profile.read_text())
        profile = planner.profile_from_dict(raw.get("profile", raw))
    slo = planner.Slo(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms)
    cfg = planner.SearchConfig()
    base = workload_from_trace(traces.load(args.trace, limit=args.rows))
    s0, t0 = steal()
    curve = planner.capacity_curve(profile, base, slo, "aggregated", cfg)
    per_gpu = curve[-1][1] / (curve[-1][0] * profile.gpus)
    out: dict[str, object] = {
        "profile": planner.profile_to_dict(profile),
        "trace": args.trace,
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "attainment": slo.attainment},
    }
    for gpus in (100, 10_000, 100_000):
        rate = per_gpu * gpus * 0.97
        w = planner.Workload(
            rate=rate, lengths=base.lengths, arrivals=base.arrivals, gaps_s=base.gaps_s
        )
        t = time.perf_counter()
        result = planner.plan(profile, w, slo, max_gpus=150_000, config=cfg)
        plan_s = time.perf_counter() - t
        out[f"plan_seconds_{gpus}"] = round(plan_s, 3)
        out[f"plan_{gpus}"] = {
            "rate": round(rate, 2),
            "best": result.best,
            "gpus": result.gpus,
            "aggregated": result.aggregated_replicas,
            "prefill": result.prefill_replicas,
            "decode": result.decode_replicas,
        }
        if gpus == 100 and not args.skip_baseline:
            t = time.perf_counter()
            n = naive(profile, w, slo, cfg)
            base_s = time.perf_counter() - t
            out["baseline_seconds_100"] = round(base_s, 3)
            out["baseline_aggregated_100"] = n
            out["speedup_100"] = round(base_s / max(plan_s, 1e-9), 2)
    s1, t1 = steal()
    out["host_steal_pct"] = round(100.0 * (s1 - s0) / max(1, t1 - t0), 1)
    out["loadavg"] = list(os.getloadavg())
    out["cpus"] = os.cpu_count()
    assert not math.isnan(per_gpu)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
