"""Aggregated vs disaggregated serving at equal CPU share on the Azure 2023 conversation
trace, through the router (issue 15).

    .venv/bin/python bench/serve_disagg.py [--every 20] [--scale 0.1] [--compress 6]
        [--num 60] [--slots 4] [--ctx 4096]

Both sides run two llama-server replicas of SmolLM2-135M with one thread each (`-t 1`,
the same `-np` and `-c`), so each side has the same CPU share:
- aggregated: 2 aggregated replicas behind `phalanx serve router --replica A --replica B
  --policy least-load --no-auth`;
- disaggregated: 1 prefill + 1 decode replica (a shared `--slot-save-path`) behind
  `phalanx serve router --prefill P --decode D --engine llama.cpp --no-auth`: the router
  prefills on P, moves the KV with disagg's llama.cpp slot save/restore hand-off
  (phalanx.serve.handoff) and decodes on D.
Each side starts fresh (new processes), is warmed up with a short request per replica and
one through the router (not measured), then replays the SAME request list open loop with
the bench client (streaming completions, greedy, ignore_eos). The aggregated side runs
first.

The trace, scaled down (each factor echoed in the JSON): 1 request in `--every`, token
lengths × `--scale`, arrival times ÷ `--compress` (rate = the trace's × compress / every),
the first `--num` of the sample.

Reports per side TTFT, TPOT, ITL, E2E (mean/median/p99 ms), goodput under the SLOs, and
for the disaggregated side the hand-off's mean time (the router's
phalanx_router_handoff_seconds: waiting for slots + the prefill request + save + restore,
everything before the decode replica is asked) and its share of the mean TTFT (the
transfer alone, save + restore, is what bench/serve_handoff.py measures at concurrency 1);
then ratios disaggregated / aggregated and the host (CPUs, CPU steal, load average).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from serve_common import (
    MODEL,
    Proc,
    cpu_times,
    delta,
    host,
    prometheus,
    running,
    sampled_trace,
    scale_down,
    start_replica,
    start_router,
    wait_ready,
    warm_up,
)

from phalanx.serve.bench import BenchConfig, BenchRequest, Goodput, Result, run_async


def stat(result: Result, name: str) -> dict[str, float]:
    s = getattr(result.metrics, name)
    return {"mean": round(s.mean, 1), "median": round(s.median, 1), "p99": round(s.p99, 1)}


def one_side(args: argparse.Namespace, side: str, requests: list[BenchRequest]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-disagg-") as tmp:
        folder = Path(tmp)
        handoff = folder / "handoff"
        handoff.mkdir()
        procs: list[Proc] = []
        with running(procs):
            if side == "aggregated":
                for i in range(2):
                    procs.append(start_replica(folder, f"agg{i}", slots=args.slots, ctx=args.ctx))
            else:
                for role in ("prefill", "decode"):
                    procs.append(
                        start_replica(
                            folder,
                            role,
                            slots=args.slots,
                            ctx=args.ctx,
                            role=role,
                            handoff=handoff,
                        )
                    )
            for proc in procs:
                wait_ready(proc)
                warm_up(proc.url)
            urls = [p.url for p in procs]
            if side == "aggregated":
                router = start_router(
                    folder, "router", "least-load", replicas=urls, slots=args.slots
                )
            else:
                router = start_router(
                    folder,
                    "router",
                    "least-load",
                    prefill=urls[:1],
                    decode=urls[1:],
                    slots=args.slots,
                )
            procs.append(router)
            wait_ready(router)
            warm_up(router.url)
            before = prometheus(router.url)
            config = BenchConfig(
                url=router.url,
                model=MODEL,
                slo=Goodput(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms),
                timeout_s=300.0,
            )
            result = asyncio.run(run_async(config, requests))
            after = prometheus(router.url)
    m = result.metrics
    out: dict[str, Any] = {
        "completed": m.completed,
        "failed": m.failed,
        "errors": list(m.errors)[:5],
        "duration_s": round(m.duration_s, 1),
        "ttft_ms": stat(result, "ttft_ms"),
        "tpot_ms": stat(result, "tpot_ms"),
        "itl_ms": stat(result, "itl_ms"),
        "e2e_ms": stat(result, "e2el_ms"),
        "request_throughput": round(m.request_throughput, 3),
        "output_throughput_tok_s": round(m.output_throughput, 1),
        "request_goodput": round(m.request_goodput or 0.0, 3),
        "slo_attainment": round(m.slo_attainment or 0.0, 3),
        "max_concurrent_requests": m.max_concurrent_requests,
    }
    count = delta(after, before, "phalanx_router_handoff_seconds_count")
    if count:
        mean_ms = 1000 * delta(after, before, "phalanx_router_handoff_seconds_sum") / count
        out["handoffs"] = int(count)
        out["handoff_ms_mean"] = round(mean_ms, 1)
        out["handoff_share_of_mean_ttft"] = round(mean_ms / max(m.ttft_ms.mean, 1e-9), 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, default=20, help="1 request in N")
    parser.add_argument("--scale", type=float, default=0.1, help="token lengths ×")
    parser.add_argument("--compress", type=float, default=6.0, help="arrival times ÷")
    parser.add_argument("--offset", type=int, default=0, help="skip the sample's first N")
    parser.add_argument("--num", type=int, default=60, help="requests (after sampling)")
    parser.add_argument("--max-input", type=int, default=1536)
    parser.add_argument("--slots", type=int, default=4, help="-np of every replica")
    parser.add_argument("--ctx", type=int, default=4096, help="-c of every replica")
    parser.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=100.0)
    args = parser.parse_args()
    if args.every < 1 or args.num < 1 or args.slots < 1 or args.ctx < 256:
        parser.error("--every, --num, --slots (and --repeat, --replicas) must be ≥ 1, --ctx ≥ 256")
    if not (args.scale > 0 and args.compress > 0 and args.max_input >= 1):
        parser.error("--scale and --compress must be positive, --max-input ≥ 1")
    requests = sampled_trace(
        "azure-conv",
        every=args.every,
        scale=args.scale,
        compress=args.compress,
        max_input=args.max_input,
        num=args.num,
        offset=args.offset,
    )
    before = cpu_times()
    out: dict[str, Any] = {
        "bench": "serve_disagg",
        "trace": "azure_llm_2023_conv.csv",
        "scale_down": scale_down(requests, args, "requests"),
        "setup": {
            "aggregated": "2 aggregated replicas, router --policy least-load",
            "disaggregated": "1 prefill + 1 decode replica, router --prefill/--decode "
            "(llama.cpp slot save/restore hand-off)",
            "engine": "llama-server (llama.cpp) SmolLM2-135M-Instruct Q4_1, -t 1 each",
            "slots_np": args.slots,
            "ctx": args.ctx,
            "equal_cpu_share": "2 engine processes of 1 thread on each side",
            "router": "phalanx serve router --no-auth (no head), own process",
            "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms},
            "fresh_processes_per_side": True,
            "warm_up_excluded": True,
            "note": "engines, router and client share this host's cores",
        },
    }
    for side in ("aggregated", "disaggregated"):
        out[side] = one_side(args, side, requests)
    agg, dis = out["aggregated"], out["disaggregated"]

    def ratio(metric: str, key: str = "mean") -> float:
        return round(float(dis[metric][key]) / max(float(agg[metric][key]), 1e-9), 2)

    out["ratio_disagg_over_agg"] = {
        "ttft_mean": ratio("ttft_ms"),
        "ttft_p99": ratio("ttft_ms", "p99"),
        "tpot_mean": ratio("tpot_ms"),
        "itl_p99": ratio("itl_ms", "p99"),
        "e2e_mean": ratio("e2e_ms"),
        "goodput": round(dis["request_goodput"] / max(agg["request_goodput"], 1e-9), 2),
    }
    out["host"] = host(before)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
