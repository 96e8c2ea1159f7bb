"""KV-aware routing vs round-robin on the Mooncake conversation trace (issue 15).

    .venv/bin/python bench/serve_routing.py [--every 100] [--scale 0.02] [--compress 40]
        [--num 200] [--replicas 4] [--slots 4] [--ctx 8192] [--repeat 1]
        [--policies round-robin,kv-aware] [--smoke]

For each policy (`--policies`: round-robin, the baseline, first; e.g.
round-robin,kv-aware-simple,kv-aware compares the old kv-aware cost and the new one on the
same requests), on FRESH processes (nothing of the
first run's KV or prefix index reaches the second): `--replicas` real llama-server replicas
of SmolLM2-135M (phalanx.serve.engines' command line, `-t 1 -np SLOTS -c CTX`) behind
`phalanx serve router --replica … --no-auth --policy P` (its own process, no head), each
replica and the router warmed up with a short request of unrelated words (not measured),
then the SAME request list replayed open loop through the router with the bench client
(phalanx.serve.bench.run_async: streaming completions, greedy, ignore_eos). `--repeat N`
runs N rounds (one run per policy), the order reversed every other round (the shared
host's load drifts); each round is reported (`runs`) and each policy's figures pool every
request of its runs.

The trace, scaled down (each factor echoed in the JSON): 1 Mooncake conversation in
`--every` (all its turns: the trace's prefix sharing is kept — a whole-trace sample shares
~37% of its blocks, like the trace, where any ~100 s window of consecutive rows shares
< 10%, its conversations' later turns coming minutes later), token lengths × `--scale`
(each 512-token block becomes 512 × scale fixed words, as the bench client's mooncake
workload does; prompts cut at `--max-input`), arrival times ÷ `--compress`: the arrival
rate is the trace's × compress / every.

Reports per policy: mean/median/p99 TTFT, TPOT, ITL, E2E (ms), goodput under
`--slo-ttft-ms`/`--slo-tpot-ms`, the engines' prefix-cache hit rate (usage's
cached_tokens / prompt tokens) and the router's predicted one (its prefix index:
phalanx_router_cached_blocks_total / phalanx_router_prompt_blocks_total over the run),
requests per replica; then ratios round-robin / each other policy (`ratio_rr_over`;
`ratio_rr_over_kv` for kv-aware), and the host (CPUs, CPU steal,
load average). Everything — replicas, router, client — shares this machine's cores.

`--smoke`: 2 replicas, 8 requests, tiny lengths (tests/serve/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from dataclasses import dataclass
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

from phalanx.serve.bench import (
    BenchConfig,
    BenchRequest,
    Goodput,
    Metrics,
    Result,
    calculate_metrics,
    run_async,
)

POLICIES = ("round-robin", "kv-aware")
KNOWN = ("round-robin", "least-load", "power-of-two", "kv-aware", "kv-aware-simple")


@dataclass
class Run:
    """One policy's run: the client's records and the router's counters over it."""

    result: Result
    blocks: float  # prompt blocks the router hashed
    cached: float  # of which its prefix index predicted cached
    per_replica: list[int]


def stat(metrics: Metrics, name: str) -> dict[str, float]:
    s = getattr(metrics, name)
    return {"mean": round(s.mean, 1), "median": round(s.median, 1), "p99": round(s.p99, 1)}


def one_policy(args: argparse.Namespace, policy: str, requests: list[BenchRequest]) -> Run:
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-routing-") as tmp:
        folder = Path(tmp)
        procs: list[Proc] = []
        with running(procs):
            for i in range(args.replicas):
                procs.append(start_replica(folder, f"replica{i}", slots=args.slots, ctx=args.ctx))
            for proc in procs:
                wait_ready(proc)
                warm_up(proc.url)
            router = start_router(
                folder, "router", policy, replicas=[p.url for p in procs], slots=args.slots
            )
            procs.append(router)
            wait_ready(router)
            warm_up(router.url, count=args.replicas)
            before = prometheus(router.url)
            result = asyncio.run(run_async(config(args, router.url), requests))
            after = prometheus(router.url)
    per_replica = sorted(
        int(v - before.get(k, 0.0))
        for k, v in after.items()
        if k.startswith("phalanx_router_replica_requests")
    )
    return Run(
        result,
        delta(after, before, "phalanx_router_prompt_blocks_total"),
        delta(after, before, "phalanx_router_cached_blocks_total"),
        per_replica,
    )


def config(args: argparse.Namespace, url: str) -> BenchConfig:
    return BenchConfig(
        url=url,
        model=MODEL,
        slo=Goodput(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms),
        timeout_s=300.0,
    )


def summary(args: argparse.Namespace, runs: list[Run]) -> dict[str, Any]:
    """One policy over its runs (pooled: every request of every run)."""
    records = [r for run in runs for r in run.result.records]
    duration = sum(run.result.metrics.duration_s for run in runs)
    m = calculate_metrics(records, duration, Goodput(args.slo_ttft_ms, args.slo_tpot_ms))
    blocks = sum(run.blocks for run in runs)
    cached = sum(run.cached for run in runs)
    return {
        "runs": len(runs),
        "completed": m.completed,
        "failed": m.failed,
        "errors": list(m.errors)[:5],
        "duration_s": round(m.duration_s, 1),
        "ttft_ms": stat(m, "ttft_ms"),
        "tpot_ms": stat(m, "tpot_ms"),
        "itl_ms": stat(m, "itl_ms"),
        "e2e_ms": stat(m, "e2el_ms"),
        "request_throughput": round(m.request_throughput, 3),
        "request_goodput": round(m.request_goodput or 0.0, 3),
        "slo_attainment": round(m.slo_attainment or 0.0, 3),
        "max_concurrent_requests": m.max_concurrent_requests,
        "input_tokens": m.total_input,
        "output_tokens": m.total_output,
        "engine_cached_tokens": m.total_cached_input,
        "engine_prefix_cache_hit_rate": (
            None if m.prefix_cache_hit_rate is None else round(m.prefix_cache_hit_rate, 3)
        ),
        "router_predicted_hit_rate": round(cached / blocks, 3) if blocks else None,
        "requests_per_replica": [
            sum(x) for x in zip(*(run.per_replica for run in runs), strict=True)
        ],
    }


def ratios(rr: dict[str, Any], kv: dict[str, Any]) -> dict[str, float]:
    def ratio(metric: str, key: str = "mean") -> float:
        return round(float(rr[metric][key]) / max(float(kv[metric][key]), 1e-9), 2)

    return {
        "ttft_mean": ratio("ttft_ms"),
        "ttft_p99": ratio("ttft_ms", "p99"),
        "tpot_mean": ratio("tpot_ms"),
        "e2e_mean": ratio("e2e_ms"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, default=100, help="1 conversation in N")
    parser.add_argument("--scale", type=float, default=0.02, help="token lengths ×")
    parser.add_argument("--compress", type=float, default=40.0, help="arrival times ÷")
    parser.add_argument("--offset", type=int, default=0, help="skip the sample's first N")
    parser.add_argument("--num", type=int, default=200, help="requests (after sampling)")
    parser.add_argument("--max-input", type=int, default=2048)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4, help="-np of every replica")
    parser.add_argument("--ctx", type=int, default=8192, help="-c of every replica")
    parser.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=100.0)
    parser.add_argument("--repeat", type=int, default=1, help="rounds, order reversed every other")
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="comma-separated, round-robin first (the baseline); e.g. "
        "round-robin,kv-aware-simple,kv-aware",
    )
    parser.add_argument("--smoke", action="store_true", help="2 replicas, 8 requests (tests)")
    args = parser.parse_args()
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if (
        len(policies) < 2
        or policies[0] != "round-robin"
        or len(set(policies)) != len(policies)
        or not set(policies) <= set(KNOWN)
    ):
        parser.error(
            f"--policies: round-robin first, then one or more of {', '.join(KNOWN[1:])}, each once"
        )
    counts = (args.every, args.num, args.slots, args.repeat, args.replicas)
    if min(counts) < 1 or args.ctx < 256:
        parser.error("--every, --num, --slots (and --repeat, --replicas) must be ≥ 1, --ctx ≥ 256")
    if not (args.scale > 0 and args.compress > 0 and args.max_input >= 1):
        parser.error("--scale and --compress must be positive, --max-input ≥ 1")
    if args.smoke:
        args.replicas, args.num, args.scale, args.max_input = 2, 8, 0.005, 192
        args.slots, args.ctx, args.compress = 2, 2048, 400.0
    requests = sampled_trace(
        "mooncake",
        every=args.every,
        scale=args.scale,
        compress=args.compress,
        max_input=args.max_input,
        num=args.num,
        offset=args.offset,
    )
    before = cpu_times()
    out: dict[str, Any] = {
        "bench": "serve_routing",
        "trace": "mooncake_conversation_trace.jsonl",
        "scale_down": scale_down(requests, args, "conversations"),
        "setup": {
            "replicas": args.replicas,
            "engine": "llama-server (llama.cpp) SmolLM2-135M-Instruct Q4_1, -t 1",
            "slots_np": args.slots,
            "ctx": args.ctx,
            "router": "phalanx serve router --replica ... --no-auth (no head), own process",
            "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms},
            "fresh_processes_per_policy": True,
            "warm_up_excluded": True,
            "note": "replicas, router and client share this host's cores",
        },
    }
    out["policies"] = list(policies)
    others = policies[1:]
    runs: dict[str, list[Run]] = {p: [] for p in policies}
    out["runs"] = []
    for k in range(args.repeat):
        # Alternate the order: the host's load drifts between runs.
        order = policies if k % 2 == 0 else policies[::-1]
        for policy in order:
            runs[policy].append(one_policy(args, policy, requests))
        one = {p: summary(args, [runs[p][k]]) for p in policies}
        out["runs"].append(
            {
                "order": list(order),
                "ttft_mean_ms": {p: one[p]["ttft_ms"]["mean"] for p in policies},
                "ttft_p99_ms": {p: one[p]["ttft_ms"]["p99"] for p in policies},
                "engine_hit_rate": {p: one[p]["engine_prefix_cache_hit_rate"] for p in policies},
                "requests_per_replica": {p: one[p]["requests_per_replica"] for p in policies},
                "ratio_rr_over": {p: ratios(one["round-robin"], one[p]) for p in others},
                "loadavg_1m": round(os.getloadavg()[0], 2),
            }
        )
    for policy in policies:
        out[policy] = summary(args, runs[policy])
    # round-robin's figure / the policy's: > 1, the policy is better.
    out["ratio_rr_over"] = {p: ratios(out["round-robin"], out[p]) for p in others}
    if "kv-aware" in policies:
        out["ratio_rr_over_kv"] = out["ratio_rr_over"]["kv-aware"]
        out["target_2x_lower_mean_ttft_met"] = out["ratio_rr_over_kv"]["ttft_mean"] >= 2.0
    out["host"] = host(before)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
