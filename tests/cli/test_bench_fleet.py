"""bench/fleet.py's short form (`--smoke`: 200 simulated nodes, about a minute) runs end to
end against a real head and the load it claims really happened. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fleet.py"


def test_the_fleet_benchmark_drives_a_real_head_and_prints_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    run = result["runs"]["200"]
    assert run["nodes"] == 200 and run["queued_jobs"] == 2000
    # Every node joined and the head filled the fleet from the queue.
    assert run["joins_per_s"] > 0 and run["busy_gpus_after_fill"] > 0
    load = run["load"]
    # Jobs ended on command, the head started the next ones on the nodes that freed up, and
    # the start of each sampled one was seen by every node of it.
    assert load["jobs_ended"] > 0 and load["jobs_started_seen"] > 0
    assert load["start_sampled"] > 0 and load["start_p50_ms"] is not None
    # Submits went through during the load, heartbeats were answered, nodes died and were
    # found down, new nodes joined, and no running job was taken from a live node.
    assert load["submits"]["submitted"] > 0 and load["submits"]["failed"] == 0
    assert load["heartbeat_p99_ms"] is not None
    assert load["deaths"] >= 1 and load["death_detected_max_s"] is not None
    assert load["death_detected_max_s"] != float("inf")
    assert load["joined"] >= 2 and not load["errors"]
    assert load["killed_running_jobs"] == 0
    # The head was killed and restarted: every living node was answered again, and it told
    # none of them to stop a running job.
    restart = run["restart"]
    assert restart["reconciled"] == restart["alive"] > 0
    assert restart["killed_running_jobs"] == 0
    assert restart["running_after"] > 0
    idle = run["idle"]
    assert idle["probe_beats"] > 0 and idle["head_cpu_pct"] >= 0
    assert run["listings"]["nodes"]["bytes"] > 0 and run["head_peak_rss_mb"] > 0
    steal = run["cpu_steal_pct"]
    assert steal is None or 0 <= steal <= 100
    assert set(result["targets_at_largest"]) >= {"heartbeat_p99_le_100ms", "rss_le_4GB"}
