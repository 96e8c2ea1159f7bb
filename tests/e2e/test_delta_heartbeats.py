"""Real agents heartbeat with delta reports (README.md#heartbeats-at-scale): jobs still
start, finish, fail with their exit status and requeue, and the head counts the deltas and
lease-only renewals it took."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from tests.e2e.helpers import job, sh, submit, wait_for, wait_state


def _heartbeats(client: PhalanxClient) -> dict[str, float]:
    for family in text_string_to_metric_families(client.metrics_text()):
        if family.name == "phalanx_heartbeats":
            return {s.labels["kind"]: s.value for s in family.samples if s.name.endswith("_total")}
    return {}


def test_jobs_start_finish_fail_and_requeue_over_delta_heartbeats(
    cluster: LocalCluster, api: PhalanxClient, workdir: Path
) -> None:
    before = _heartbeats(api)
    marker = workdir / "checkpointed"
    # A job that exits 75 (checkpointed, asks to be requeued) once, then completes.
    requeued = submit(
        api,
        job(workdir, sh(f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 75")),
    )
    ok = submit(api, job(workdir, sh("sleep 0.5")))
    failed = submit(api, job(workdir, sh("sleep 0.5; exit 3")))
    two_nodes = submit(api, job(workdir, sh("sleep 1"), nodes=2))
    assert wait_state(api, ok, "CD", timeout=60).exit_code == "0:0"
    info = wait_state(api, failed, "F", timeout=60)
    assert (info.exit_code, info.restart_count) == ("3:0", 0)
    info = wait_state(api, requeued, "CD", timeout=60)
    assert info.restart_count == 1 and marker.exists()
    wait_state(api, two_nodes, "CD", timeout=60)

    def more() -> dict[str, float] | None:
        now = _heartbeats(api)
        grown = all(now.get(k, 0) > before.get(k, 0) for k in ("delta", "lease"))
        return now if grown else None

    # The agents' reports came as deltas (the changes above) and lease renewals (the
    # quiet beats between them).
    counts = wait_for("delta and lease-only heartbeats", more, timeout=30)
    fulls = counts.get("full", 0) - before.get("full", 0)
    assert fulls < counts["delta"] - before.get("delta", 0)  # full only when asked
