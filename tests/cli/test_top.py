"""`phalanx top` against a real local cluster (a head and two agents with two fake GPUs
each): one frame with --once, its filters, a clean Ctrl-C, and a clear error when the head
cannot be reached."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import ssl
import subprocess
import sys
import time

import httpx

from phalanx.local import LocalCluster
from tests.cli.conftest import invoke, run_cli

SLEEP = ("python", "-c", "import time; time.sleep(300)")


def _submit(env: dict[str, str], *args: str) -> int:
    result = invoke("submit", "--json", *args, env=env)
    assert result.exit_code == 0, result.stderr
    job_id: int = json.loads(result.stdout)["job_ids"][0]
    return job_id


def _frame_until(env: dict[str, str], wanted: str, *args: str, timeout: float = 60) -> str:
    """`phalanx top --once` until its frame contains `wanted` (the agents' next heartbeat)."""
    deadline = time.monotonic() + timeout
    while True:
        result = invoke("top", "--once", *args, env=env)
        assert result.exit_code == 0, result.stderr
        if wanted in result.stdout:
            return result.stdout
        assert time.monotonic() < deadline, f"no {wanted!r} in:\n{result.stdout}"
        time.sleep(0.2)


def test_once_shows_nodes_gpu_bars_and_jobs(admin_env: dict[str, str]) -> None:
    running = _submit(admin_env, "--gpus-per-node", "2", "--", *SLEEP)
    waiting = _submit(admin_env, "--nodes", "2", "--gpus-per-node", "2", "--", *SLEEP)
    try:
        # The running job's node shows two full bars (its fake GPUs are busy), the other two
        # idle dots; both jobs are listed, the pending one with its reason.
        frame = _frame_until(admin_env, "██")
        assert "127.0.0.2" in frame and "127.0.0.3" in frame
        assert "··" in frame
        assert "GPUs 2/4 allocated" in frame
        lines = {line.split()[0]: line for line in frame.splitlines() if line.split()}
        assert " R " in lines[str(running)] and " PD " in lines[str(waiting)]
        assert "127.0.0." in lines[str(running)]
        # The server filters: no job of a user that has none.
        other = invoke("top", "--once", "--user", "nobody", env=admin_env)
        assert other.exit_code == 0 and "no live jobs" in other.stdout
        rows = invoke("top", "--once", "--rows", "1", env=admin_env)
        assert "1 more nodes" in rows.stdout and "1 more jobs" in rows.stdout
    finally:
        invoke("cancel", str(running), str(waiting), env=admin_env)


def test_an_unreachable_head_is_one_clear_line(admin_env: dict[str, str]) -> None:
    env = {**admin_env, "PHALANX_HEAD": "http://127.0.0.1:9"}
    for args in (("top", "--once"), ("top", "--interval", "1")):
        done = run_cli(*args, env=env, timeout=60)
        assert done.returncode == 2, done
        assert "cannot reach head" in done.stderr and "Traceback" not in done.stderr
    bad = run_cli("top", "--interval", "0", env=admin_env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_ctrl_c_ends_the_live_view_cleanly(cluster: LocalCluster) -> None:
    """On a terminal (a pty) the view redraws; Ctrl-C ends it with status 0, no traceback."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "phalanx", "top", "--interval", "0.5"],
        stdin=secondary,
        stdout=secondary,
        stderr=subprocess.PIPE,
        env={**os.environ, **cluster.client_env(), "COLUMNS": "200", "LINES": "60"},
        start_new_session=True,
    )
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while seen.count(b"phalanx top") < 2:  # a first frame and a redraw
            assert proc.poll() is None and time.monotonic() < deadline, seen[-2000:]
            ready, _, _ = select.select([primary], [], [], 1.0)
            if ready:
                seen += os.read(primary, 65536)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C
        _, err = proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        os.close(primary)
    assert proc.returncode == 0, err
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err


def test_a_scrape_only_token_from_the_cli_scrapes_and_nothing_else(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    made = invoke("token", "create", "--scope", "metrics", "--description", "prom", env=admin_env)
    assert made.exit_code == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("phxm_") and "scrape-only" in made.stderr
    ca = cluster.ca_file
    verify = ssl.create_default_context(cafile=str(ca)) if ca is not None else True
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=cluster.url, headers=headers, verify=verify) as scraper:
        assert scraper.get("/metrics").status_code == 200
        assert scraper.get("/v1/metrics/gpus").status_code == 200
        assert scraper.get("/v1/jobs").status_code == 403
    as_scraper = {**admin_env, "PHALANX_TOKEN": token}
    refused = run_cli("top", "--once", env=as_scraper)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "user's API token" in refused.stderr
    listed = invoke("token", "list", "--json", env=admin_env)
    assert any(t["kind"] == "metrics" for t in json.loads(listed.stdout)["tokens"])
    wrong = invoke("token", "create", "--scope", "metrics", "bob", env=admin_env)
    assert wrong.exit_code == 2 and "no USER" in wrong.stderr
    bad = invoke("token", "create", "--scope", "nope", env=admin_env)
    assert bad.exit_code == 2 and "expected api or metrics" in bad.stderr


def test_a_failed_refresh_keeps_the_frame_and_says_why() -> None:
    from rich.console import Console

    from phalanx.api.models import GpuInfo, GpuTelemetry, NodeInfo
    from phalanx.cli.top import Frame, gpu_cell, render

    node = NodeInfo(
        name="gpu-01",
        address="10.0.0.1",
        agent_url="https://10.0.0.1:9000",
        state="up",
        reason=None,
        cpus=8,
        memory_mb=1024,
        gpus=[GpuInfo(index=i, uuid=f"GPU-{i}", model="H100", memory_mb=81920) for i in range(3)],
        gpus_used=1,
        labels={},
        last_heartbeat=None,
        heartbeat_age_s=None,
        jobs=[4],
        gpu_telemetry=[
            GpuTelemetry(index=0, utilization_pct=100.0, memory_used_mb=1024),
            GpuTelemetry(index=1, utilization_pct=0.0, memory_used_mb=0),
        ],
    )
    frame = Frame(nodes=[node], jobs=[], at=time.time(), more_jobs=False)
    console = Console(width=200, no_color=True, record=True)
    console.print(render(frame, 10, "cannot reach head at https://h:1 (retrying)"))
    text = console.export_text()
    assert "cannot reach head at https://h:1 (retrying)" in text
    assert "█·?" in text  # busy, idle, never read
    assert "GPUs 1/3 allocated, mean utilisation 50%" in text
    assert gpu_cell(None) == ("?", "dim") and gpu_cell(250.0)[0] == "█"
