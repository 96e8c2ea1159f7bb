"""bench/serve_routing.py --smoke: both policies replay the same small Mooncake sample
through a real router in front of 2 real llama-server replicas, every request completes, and
the JSON carries the fields the benchmark reports (no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from phalanx.testing import engines

ROOT = Path(__file__).resolve().parents[2]


def test_serve_routing_smoke() -> None:
    engines.llama_server()  # EngineMissing ("run make engines") fails the test, never skips
    engines.smollm2()
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "serve_routing.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    requests = out["scale_down"]["requests"]
    assert requests == 8
    assert out["setup"]["replicas"] == 2
    for policy in ("round-robin", "kv-aware"):
        side = out[policy]
        assert side["completed"] == requests, side["errors"]
        assert side["failed"] == 0
        assert sum(side["requests_per_replica"]) >= requests  # + the warm-up requests
        assert side["input_tokens"] > 0 and side["output_tokens"] >= requests
        for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
            assert set(side[metric]) == {"mean", "median", "p99"}
        assert side["ttft_ms"]["mean"] > 0
        assert side["engine_cached_tokens"] is not None
        assert 0.0 <= side["engine_prefix_cache_hit_rate"] <= 1.0
        assert 0.0 <= side["router_predicted_hit_rate"] <= 1.0
        assert side["request_goodput"] >= 0.0
    assert set(out["ratio_rr_over_kv"]) == {"ttft_mean", "ttft_p99", "tpot_mean", "e2e_mean"}
    assert out["host"]["cpus"] >= 1 and len(out["host"]["loadavg"]) == 3
