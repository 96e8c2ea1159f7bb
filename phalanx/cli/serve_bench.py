"""`phalanx serve bench`, `serve calibrate` and `serve plan`: measure and size serving.

- serve bench: `vllm bench serve`'s metrics against a router or a replica.
- serve calibrate: a replica's latency profile (JSON), measured from the real engine.
- serve plan: how many replicas (GPUs) a traffic needs under an SLO, for a profile and a
  trace, up to 100,000-GPU clusters (core.planner's search).

Heavy imports (numpy, httpx) load inside the commands, so other commands stay quick.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Literal

import typer

from phalanx.cli.connect import read_token_file
from phalanx.cli.output import fail

WorkloadOpt = Literal["random", "prefix", "mooncake", "azure-conv", "azure-code"]
TraceOpt = Literal["mooncake", "mooncake-synthetic", "azure-conv", "azure-code"]


def _positive(value: float | None, flag: str) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        fail(f"{flag} must be a positive number, not {value}")


def serve_bench(
    url: Annotated[str, typer.Option("--url", help="Router or replica base URL.")],
    model: Annotated[str, typer.Option("--model", help="The OpenAI `model` field.")],
    token_file: Annotated[
        str | None,
        typer.Option(
            "--token-file", help="File holding the bearer token (router: a Phalanx token)."
        ),
    ] = None,
    workload: Annotated[WorkloadOpt, typer.Option("--workload")] = "random",
    num: Annotated[
        int, typer.Option("--num", help="Requests to send.", min=1, max=1_000_000)
    ] = 100,
    rate: Annotated[
        float | None,
        typer.Option("--rate", help="Poisson arrivals, requests/s (default: all at once)."),
    ] = None,
    trace_time: Annotated[
        bool, typer.Option("--trace-time", help="Send at the trace's own times (× --time-scale).")
    ] = False,
    time_scale: Annotated[float, typer.Option("--time-scale", help="Trace time × this.")] = 1.0,
    scale: Annotated[float, typer.Option("--scale", help="Trace token lengths × this.")] = 1.0,
    input_len: Annotated[int, typer.Option("--input-len", min=1, max=1_000_000)] = 128,
    output_len: Annotated[int, typer.Option("--output-len", min=1, max=1_000_000)] = 32,
    range_ratio: Annotated[float, typer.Option("--range-ratio")] = 0.0,
    prefix_len: Annotated[int, typer.Option("--prefix-len", min=1, max=1_000_000)] = 64,
    num_prefixes: Annotated[int, typer.Option("--num-prefixes", min=1, max=100_000)] = 4,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    endpoint: Annotated[Literal["completions", "chat"], typer.Option("--endpoint")] = "completions",
    max_concurrency: Annotated[
        int | None, typer.Option("--max-concurrency", min=1, max=100_000)
    ] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option("--slo-ttft-ms")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option("--slo-tpot-ms")] = None,
    slo_e2el_ms: Annotated[float | None, typer.Option("--slo-e2el-ms")] = None,
    ignore_eos: Annotated[
        bool, typer.Option("--ignore-eos/--no-ignore-eos", help="Generate every asked token.")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Benchmark a serving endpoint: TTFT, TPOT, ITL, E2E and goodput as `vllm bench serve`."""
    from phalanx.serve.bench import BenchConfig, Goodput, WorkloadSpec, run
    from phalanx.serve.bench.traces import TraceError

    for value, flag in (
        (rate, "--rate"),
        (slo_ttft_ms, "--slo-ttft-ms"),
        (slo_tpot_ms, "--slo-tpot-ms"),
        (slo_e2el_ms, "--slo-e2el-ms"),
    ):
        _positive(value, flag)
    token = read_token_file(token_file) if token_file else None
    try:
        config = BenchConfig(
            url=url,
            model=model,
            token=token,
            endpoint=endpoint,
            max_concurrency=max_concurrency,
            ignore_eos=ignore_eos,
            slo=Goodput(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms, e2el_ms=slo_e2el_ms),
            workload=WorkloadSpec(
                name=workload,
                num=num,
                seed=seed,
                rate=rate,
                trace_time=trace_time,
                time_scale=time_scale,
                scale=scale,
                input_len=input_len,
                output_len=output_len,
                range_ratio=range_ratio,
                prefix_len=prefix_len,
                num_prefixes=num_prefixes,
            ),
        )
        result = run(config)
    except (ValueError, TraceError) as exc:
        fail(str(exc))
    if as_json:
        typer.echo(result.to_json())
        return
    m = result.metrics
    lines = [
        f"requests: {m.completed} ok, {m.failed} failed in {m.duration_s:.2f} s",
        f"throughput: {m.request_throughput:.2f} req/s, {m.output_throughput:.1f} output tok/s",
    ]
    if m.request_goodput is not None:
        lines.append(f"goodput: {m.request_goodput:.2f} req/s ({m.slo_attainment:.0%} within SLO)")
    for name, stat in (
        ("TTFT", m.ttft_ms),
        ("TPOT", m.tpot_ms),
        ("ITL", m.itl_ms),
        ("E2E", m.e2el_ms),
    ):
        lines.append(
            f"{name:5} ms  mean {stat.mean:9.1f}  median {stat.median:9.1f}  "
            f"p90 {stat.p90:9.1f}  p99 {stat.p99:9.1f}"
        )
    for error in m.errors:
        lines.append(f"error: {error}")
    typer.echo("\n".join(lines))


def serve_calibrate(
    url: Annotated[str, typer.Option("--url", help="One replica's base URL (not a router).")],
    model: Annotated[str, typer.Option("--model")],
    token_file: Annotated[
        str | None, typer.Option("--token-file", help="File holding the engine's API key.")
    ] = None,
    slots: Annotated[
        int, typer.Option("--slots", help="The engine's -np / --max-num-seqs.", min=1, max=1024)
    ] = 4,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs per replica.", min=1, max=64)] = 1,
    lengths: Annotated[
        str, typer.Option("--lengths", help="Prompt lengths, comma-separated.")
    ] = "32,128,384",
    batches: Annotated[
        str, typer.Option("--batches", help="Batch sizes, comma-separated.")
    ] = "1,2,4",
    decode_tokens: Annotated[int, typer.Option("--decode-tokens", min=2, max=4096)] = 24,
    repeats: Annotated[int, typer.Option("--repeats", min=1, max=100)] = 2,
    name: Annotated[str, typer.Option("--name", help="The profile's name.")] = "replica",
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = True,
) -> None:
    """Measure a replica's latency profile (prefill by length × batch, decode by batch)."""
    import asyncio

    from phalanx.core.planner import profile_to_dict
    from phalanx.serve.bench.calibrate import calibrate

    token = read_token_file(token_file) if token_file else None
    # Parsed before the try: typer.Exit (from fail) is a RuntimeError too.
    length_list, batch_list = _ints(lengths, "--lengths"), _ints(batches, "--batches")
    try:
        profile, prefill, decode = asyncio.run(
            calibrate(
                url,
                model,
                token=token,
                slots=slots,
                gpus=gpus,
                lengths=length_list,
                batches=batch_list,
                decode_tokens=decode_tokens,
                repeats=repeats,
                name=name[:200],
            )
        )
    except (ValueError, RuntimeError) as exc:
        fail(str(exc))
    out = {
        "profile": profile_to_dict(profile),
        "prefill_points": [[p.batch, p.length, round(p.ms, 3)] for p in prefill],
        "decode_points": [[d.batch, d.context, round(d.ms, 3)] for d in decode],
    }
    typer.echo(json.dumps(out, sort_keys=True) if as_json else json.dumps(out, indent=2))


def serve_plan(
    profile_file: Annotated[
        Path,
        typer.Option(
            "--profile", help="A profile JSON (serve calibrate's output or its `profile`)."
        ),
    ],
    trace: Annotated[
        TraceOpt, typer.Option("--trace", help="Lengths (and arrivals) from this trace.")
    ] = "azure-conv",
    rate: Annotated[
        float | None,
        typer.Option("--rate", help="Requests/s to plan for (default: the trace's own)."),
    ] = None,
    rate_scale: Annotated[float, typer.Option("--rate-scale", help="The rate × this.")] = 1.0,
    sweep: Annotated[
        str | None,
        typer.Option("--sweep", help="More rates, comma-separated: GPUs for each (one search)."),
    ] = None,
    arrivals: Annotated[Literal["poisson", "trace"], typer.Option("--arrivals")] = "poisson",
    rows: Annotated[
        int, typer.Option("--rows", help="Trace rows to read.", min=2, max=1_000_000)
    ] = 5000,
    length_scale: Annotated[
        float, typer.Option("--length-scale", help="Trace lengths × this.")
    ] = 1.0,
    slo_ttft_ms: Annotated[float | None, typer.Option("--slo-ttft-ms")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option("--slo-tpot-ms")] = None,
    attainment: Annotated[float, typer.Option("--attainment", min=0.01, max=1.0)] = 0.9,
    max_gpus: Annotated[int, typer.Option("--max-gpus", min=1, max=10_000_000)] = 100_000,
    requests: Annotated[
        int, typer.Option("--requests", help="Simulated per probe.", min=10, max=100_000)
    ] = 600,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """How many replicas (GPUs) a traffic needs to hold an SLO: aggregated and prefill/decode."""
    from phalanx.core import planner
    from phalanx.serve.bench import traces
    from phalanx.sim.serving import plan_for_trace, workload_from_trace

    sweep_rates = _floats(sweep, "--sweep") if sweep else []
    for value, flag in (
        (rate, "--rate"),
        (rate_scale, "--rate-scale"),
        (length_scale, "--length-scale"),
        (slo_ttft_ms, "--slo-ttft-ms"),
        (slo_tpot_ms, "--slo-tpot-ms"),
    ):
        _positive(value, flag)
    try:
        raw = json.loads(profile_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"--profile {profile_file}: cannot read a JSON profile ({exc})")
    if isinstance(raw, dict) and isinstance(raw.get("profile"), dict):
        raw = raw["profile"]
    try:
        profile = planner.profile_from_dict(raw)
        target = planner.Slo(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms, attainment=attainment)
        workload = workload_from_trace(
            traces.load(trace, limit=rows), rate=rate, arrivals=arrivals, length_scale=length_scale
        )
        if rate_scale != 1.0:
            workload = planner.Workload(
                rate=workload.rate * rate_scale,
                lengths=workload.lengths,
                arrivals=workload.arrivals,
                gaps_s=workload.gaps_s,
            )
        report = plan_for_trace(
            profile,
            workload,
            target,
            max_gpus=max_gpus,
            config=planner.SearchConfig(requests=requests, seed=seed),
            sweep=sweep_rates,
        )
    except (ValueError, traces.TraceError) as exc:
        fail(str(exc))
    report["trace"] = {
        "name": trace,
        "rows": rows,
        "length_scale": length_scale,
        "arrivals": arrivals,
    }
    typer.echo(json.dumps(report, sort_keys=True))


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"{flag} must be comma-separated integers, not {text!r}")
    if not values or len(values) > 32 or any(v < 1 or v > 1_000_000 for v in values):
        fail(f"{flag} needs 1 to 32 integers in [1, 1000000]")
    return values


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"{flag} must be comma-separated numbers, not {text!r}")
    if not values or len(values) > 1000 or not all(math.isfinite(v) and v > 0 for v in values):
        fail(f"{flag} needs 1 to 1000 positive numbers")
    return values
