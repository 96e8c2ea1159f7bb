"""The benchmark client and calibration against a real llama-server (SmolLM2-135M)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from phalanx.cli.main import app
from phalanx.core.planner import profile_from_dict
from phalanx.local.cluster import free_port
from phalanx.serve.bench import BenchConfig, Goodput, WorkloadSpec, run
from phalanx.serve.bench.calibrate import calibrate
from phalanx.testing import engines

KEY = "bench-test-key"
SLOTS = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(engines.llama_server()),
                "-m",
                str(engines.smollm2()),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-np",
                str(SLOTS),
                "-t",
                "1",
                "-c",
                "2048",
                "--api-key",
                KEY,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"llama-server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_run_measures_every_request(server: str) -> None:
    spec = WorkloadSpec(name="random", num=6, input_len=12, output_len=5, rate=20.0, seed=2)
    result = run(
        BenchConfig(
            url=server,
            model="smol",
            token=KEY,
            workload=spec,
            slo=Goodput(ttft_ms=600_000, tpot_ms=600_000),
        )
    )
    m = result.metrics
    assert (m.completed, m.failed) == (6, 0)
    assert m.total_output == 30  # ignore_eos: exactly max_tokens each, from usage
    for rec in result.records:
        assert rec.output_tokens == 5
        assert len(rec.chunk_times) == 5  # llama.cpp streams one token per chunk
        assert rec.start < rec.chunk_times[0] <= rec.chunk_times[-1]
        assert 10 <= rec.prompt_tokens <= 14  # usage's exact count: ~ one token a word
    # The summary is what the recorded times say (vLLM's definitions).
    ttfts = [(r.chunk_times[0] - r.start) * 1000 for r in result.records]
    assert m.ttft_ms.mean == pytest.approx(sum(ttfts) / 6)
    assert m.e2el_ms.mean >= m.ttft_ms.mean > 0
    assert m.tpot_ms.mean > 0 and m.itl_ms.mean > 0
    assert m.request_goodput == pytest.approx(m.request_throughput)  # generous SLO: all good
    assert 1 <= m.max_concurrent_requests <= 6
    out = json.loads(result.to_json())
    assert out["completed"] == 6 and out["workload"]["name"] == "random"


def test_chat_and_a_trace_workload(server: str) -> None:
    spec = WorkloadSpec(name="mooncake", num=3, scale=0.004, trace_time=True, time_scale=0.01)
    result = run(BenchConfig(url=server, model="smol", token=KEY, endpoint="chat", workload=spec))
    assert (result.metrics.completed, result.metrics.failed) == (3, 0)
    # Mooncake's first rows ask 500, 490, 794 tokens: × 0.004 → 2, 2, 3.
    assert [r.output_tokens for r in result.records] == [2, 2, 3]


def test_shared_prefixes_show_as_cached_tokens(server: str) -> None:
    """One after another, prompts sharing 24 of 30 words: the engine's slot keeps the
    prefix, and its usage says how much it did not compute again."""
    spec = WorkloadSpec(
        name="prefix", num=3, input_len=30, prefix_len=24, num_prefixes=1, output_len=2
    )
    result = run(BenchConfig(url=server, model="smol", token=KEY, workload=spec, max_concurrency=1))
    assert result.metrics.completed == 3
    later = result.records[1:]
    assert all(r.cached_tokens is not None and r.cached_tokens >= 20 for r in later), result.records
    rate = result.metrics.prefix_cache_hit_rate
    assert rate is not None and 0.4 < rate < 1


def test_refused_requests_are_failures_not_crashes(server: str) -> None:
    spec = WorkloadSpec(name="random", num=2, input_len=4, output_len=2)
    result = run(BenchConfig(url=server, model="smol", token="wrong", workload=spec))
    assert (result.metrics.completed, result.metrics.failed) == (0, 2)
    assert result.metrics.errors[0].startswith("HTTP 401")
    gone = run(BenchConfig(url=f"http://127.0.0.1:{free_port()}", model="m", workload=spec))
    assert gone.metrics.failed == 2 and "ConnectError" in gone.metrics.errors[0]


def test_serve_bench_cli_prints_one_json_object(server: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(KEY + "\n")
    args = [
        "serve",
        "bench",
        "--url",
        server,
        "--model",
        "smol",
        "--token-file",
        str(token),
        "--num",
        "2",
        "--input-len",
        "4",
        "--output-len",
        "2",
        "--slo-ttft-ms",
        "600000",
        "--json",
    ]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert (data["completed"], data["failed"], data["slo_attainment"]) == (2, 0, 1.0)
    assert set(data["ttft_ms"]) == {"mean", "median", "std", "p90", "p99"}
    bad = CliRunner().invoke(app, [*args[:-1], "--rate", "-2"])
    assert bad.exit_code == 2 and "--rate must be a positive number" in bad.output


def test_calibration_fits_a_profile_the_planner_takes(server: str, tmp_path: Path) -> None:
    import asyncio

    profile, prefill, decode = asyncio.run(
        calibrate(
            server,
            "smol",
            token=KEY,
            slots=SLOTS,
            lengths=(8, 48),
            batches=(1, 2),
            decode_tokens=4,
            repeats=1,
        )
    )
    assert [(p.batch, p.length) for p in prefill] == [(1, 8), (2, 8), (1, 48), (2, 48)]
    assert [d.batch for d in decode] == [1, 2]
    assert all(p.ms > 0 for p in prefill) and all(d.ms > 0 for d in decode)
    assert profile.slots == SLOTS
    # The fit reproduces its own points' scale (least squares: not exact, not absurd).
    biggest = max(prefill, key=lambda p: p.batch * p.length)
    assert profile.prefill_ms([biggest.length] * biggest.batch) > 0
    path = tmp_path / "profile.json"
    from phalanx.core.planner import profile_to_dict

    path.write_text(json.dumps({"profile": profile_to_dict(profile)}))
    assert profile_from_dict(json.loads(path.read_text())["profile"]) == profile
    with pytest.raises(ValueError, match="batch sizes"):
        asyncio.run(calibrate(server, "smol", token=KEY, slots=SLOTS, batches=(4,)))
