"""The SLO autoscaling policy through a 3× step in load, on the simulator's engine model.

Replays `core.slo` (phalanx.sim.serving.replay_autoscaler) with Poisson traffic on the
Azure 2023 conversation trace's lengths: `--low` req/s for `--seconds`, then 3× that for
as long, replicas starting `--startup-s` after the policy asks. Side by side, over the
same requests (same seed): the autoscaled pool, and two fixed pools as baselines — the
size the planner gives for the low phase, and for the high one. Reports SLO attainment
and replica-seconds (cost) for each, averaged over `--seeds` seeds, and the ratios.

    .venv/bin/python bench/serve_autoscale_sim.py     # a few seconds

The profile is an assumed small replica (16 slots); the real-engine version of this
benchmark (router + deployments) is bench work after the serving branches merge.
Prints one JSON object, with the host's CPU steal and load average.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from pathlib import Path

from phalanx.core import planner
from phalanx.serve.bench import traces
from phalanx.sim.serving import Phase, ReplayResult, replay_autoscaler

PROFILE = planner.LatencyProfile(
    name="small-16-slot (assumed)",
    prefill_base_ms=20,
    prefill_per_token_ms=0.05,
    decode_base_ms=15,
    decode_per_seq_ms=0.5,
    slots=16,
)


def replica_seconds(result: ReplayResult, end: float) -> float:
    points = [*result.replicas, (end, result.replicas[-1][1])]
    return sum((t1 - t0) * n for (t0, n), (t1, _) in itertools.pairwise(points))


def steal() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (values[7] if len(values) > 7 else 0), sum(values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--low", type=float, default=3.0, help="req/s before the step")
    ap.add_argument("--seconds", type=float, default=300.0, help="each phase's length")
    ap.add_argument("--startup-s", type=float, default=10.0)
    ap.add_argument("--ttft-ms", type=float, default=1000.0)
    ap.add_argument("--tpot-ms", type=float, default=60.0)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    s0, t0 = steal()
    wall = time.perf_counter()
    rows = traces.load("azure-conv", limit=2000)
    lengths = [(r.input_tokens, r.output_tokens) for r in rows]
    slo = planner.Slo(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms)
    phases = [Phase(args.low, args.seconds), Phase(3 * args.low, args.seconds)]
    end = 2 * args.seconds
    sized = {}
    for name, rate in (("low", args.low), ("high", 3 * args.low)):
        workload = planner.Workload(rate=rate, lengths=tuple(lengths))
        result = planner.plan(PROFILE, workload, slo)
        sized[name] = result.aggregated_replicas or 1
    runs: dict[str, list[ReplayResult]] = {"autoscaled": [], "fixed_low": [], "fixed_high": []}
    for seed in range(args.seeds):
        common = {"startup_s": args.startup_s, "seed": seed}
        runs["autoscaled"].append(
            replay_autoscaler(
                PROFILE,
                lengths,
                phases,
                slo,
                min_replicas=1,
                max_replicas=64,
                start_replicas=sized["low"],
                **common,
            )
        )
        for key, n in (("fixed_low", sized["low"]), ("fixed_high", sized["high"])):
            runs[key].append(
                replay_autoscaler(
                    PROFILE,
                    lengths,
                    phases,
                    slo,
                    min_replicas=n,
                    max_replicas=n,
                    start_replicas=n,
                    **common,
                )
            )
    out: dict[str, object] = {
        "profile": planner.profile_to_dict(PROFILE),
        "phases_req_per_s": [p.rate for p in phases],
        "phase_seconds": args.seconds,
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "attainment": slo.attainment},
        "planner_sized": sized,
        "seeds": args.seeds,
        "requests_per_run": statistics.mean(r.requests for r in runs["autoscaled"]),
    }
    for key, results in runs.items():
        out[f"{key}_attainment"] = round(statistics.mean(r.attainment for r in results), 4)
        out[f"{key}_replica_seconds"] = round(
            statistics.mean(replica_seconds(r, end) for r in results), 1
        )
        out[f"{key}_peak_replicas"] = max(max(n for _, n in r.replicas) for r in results)
    auto, high = out["autoscaled_replica_seconds"], out["fixed_high_replica_seconds"]
    assert isinstance(auto, float) and isinstance(high, float)
    out["cost_ratio_autoscaled_vs_fixed_high"] = round(auto / high, 3)
    out["meets_90pct_attainment"] = out["autoscaled_attainment"] >= 0.9  # type: ignore[operator]
    s1, t1 = steal()
    out["wall_seconds"] = round(time.perf_counter() - wall, 2)
    out["host_steal_pct"] = round(100.0 * (s1 - s0) / max(1, t1 - t0), 1)
    out["loadavg"] = list(os.getloadavg())
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
