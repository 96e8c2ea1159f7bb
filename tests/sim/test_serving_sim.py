"""sim.serving: plans for real traces, the autoscaler replayed through a 3× load step, and
`phalanx serve plan`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phalanx.cli.main import app
from phalanx.core.planner import LatencyProfile, SearchConfig, Slo, profile_to_dict
from phalanx.serve.bench import traces
from phalanx.sim.serving import Phase, plan_for_trace, replay_autoscaler, workload_from_trace

H100ISH = LatencyProfile(
    name="h100-ish",
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
SMALL = LatencyProfile(
    prefill_base_ms=20,
    prefill_per_token_ms=0.05,
    decode_base_ms=15,
    decode_per_seq_ms=0.5,
    slots=16,
)


def test_trace_workload_keeps_lengths_and_rate() -> None:
    rows = traces.load("azure-conv", limit=1000)
    w = workload_from_trace(rows)
    assert w.lengths[:2] == ((374, 44), (396, 109))
    assert w.rate == pytest.approx(999 / rows[-1].time_s)
    assert len(w.gaps_s) == 999
    assert workload_from_trace(rows, rate=50.0, length_scale=0.5).lengths[0] == (187, 22)


def test_plan_for_a_trace_reports_both_layouts() -> None:
    w = workload_from_trace(traces.load("azure-conv", limit=2000), rate=2000.0, arrivals="trace")
    report = plan_for_trace(
        H100ISH,
        w,
        Slo(ttft_ms=500, tpot_ms=50),
        config=SearchConfig(requests=300, bisections=8, per_slot=2),
    )
    assert report["best"] in ("aggregated", "disaggregated")
    assert report["gpus"] == min(
        report["aggregated_replicas"], report["prefill_replicas"] + report["decode_replicas"]
    )
    assert [n for n, _ in report["capacity_req_per_s"]["aggregated"]] == [1, 2, 4, 8]
    assert report["planner_seconds"] > 0
    json.dumps(report)  # JSON-ready


def test_the_autoscaler_holds_the_slo_through_a_3x_step() -> None:
    lengths = [(r.input_tokens, r.output_tokens) for r in traces.load("azure-conv", limit=2000)]
    result = replay_autoscaler(
        SMALL,
        lengths,
        [Phase(rate=3.0, seconds=300), Phase(rate=9.0, seconds=300)],
        Slo(ttft_ms=1000, tpot_ms=60),
        min_replicas=1,
        max_replicas=32,
        start_replicas=2,
        seed=1,
    )
    assert result.attainment >= 0.9
    counts = [n for _, n in result.replicas]
    before_step = max(n for t, n in result.replicas if t < 300)
    after_step = max(n for t, n in result.replicas if t >= 300)
    assert after_step > before_step  # it grew for the step ...
    assert max(counts) <= 32  # ... within its bound
    assert all(reason.startswith(("scale up", "scale down")) for _, reason in result.decisions)


def test_a_fixed_pool_fails_the_same_step() -> None:
    """The baseline: the replicas that held the first phase, without the autoscaler."""
    lengths = [(r.input_tokens, r.output_tokens) for r in traces.load("azure-conv", limit=2000)]
    fixed = replay_autoscaler(
        SMALL,
        lengths,
        [Phase(rate=3.0, seconds=300), Phase(rate=9.0, seconds=300)],
        Slo(ttft_ms=1000, tpot_ms=60),
        min_replicas=2,
        max_replicas=2,
        start_replicas=2,
        seed=1,
    )
    assert fixed.attainment < 0.9
    assert [n for _, n in fixed.replicas] == [2]


def test_serve_plan_cli(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(profile_to_dict(SMALL)))
    out = CliRunner().invoke(
        app,
        [
            "serve",
            "plan",
            "--profile",
            str(profile),
            "--trace",
            "azure-code",
            "--rows",
            "500",
            "--rate",
            "500",
            "--slo-ttft-ms",
            "800",
            "--slo-tpot-ms",
            "60",
            "--requests",
            "200",
        ],
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["rate"] == 500.0 and data["trace"]["name"] == "azure-code" and data["gpus"] >= 1
    assert data["sweep"] == []
    sweep = CliRunner().invoke(
        app,
        [
            "serve",
            "plan",
            "--profile",
            str(profile),
            "--trace",
            "azure-code",
            "--rows",
            "500",
            "--slo-ttft-ms",
            "800",
            "--slo-tpot-ms",
            "60",
            "--requests",
            "200",
            "--sweep",
            "10,500,50000,1e9",
            "--max-gpus",
            "100000",
        ],
    )
    assert sweep.exit_code == 0, sweep.output
    rows = json.loads(sweep.stdout)["sweep"]
    assert [r["rate"] for r in rows] == [10, 500, 50000, 1e9]
    assert rows[1]["gpus"] == data["gpus"]  # the same answer as the single-rate plan
    assert rows[0]["gpus"] <= rows[1]["gpus"] <= rows[2]["gpus"] <= 100_000
    assert (rows[3]["best"], rows[3]["gpus"]) == ("none", None)  # beyond 100k GPUs
    bad_sweep = CliRunner().invoke(
        app, ["serve", "plan", "--profile", str(profile), "--sweep", "1,x"]
    )
    assert (
        bad_sweep.exit_code == 2 and "--sweep must be comma-separated numbers" in bad_sweep.output
    )
    profile.write_text('{"slots": 2}')
    bad = CliRunner().invoke(
        app, ["serve", "plan", "--profile", str(profile), "--slo-ttft-ms", "100"]
    )
    assert bad.exit_code == 2 and bad.output.startswith("error: ") and "Traceback" not in bad.output
    none = CliRunner().invoke(
        app, ["serve", "plan", "--profile", str(tmp_path / "nope.json"), "--slo-ttft-ms", "1"]
    )
    assert none.exit_code == 2 and "cannot read a JSON profile" in none.output
