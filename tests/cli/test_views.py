"""What users see, against a real local cluster (a head and two agents with two fake GPUs
each): every rank's logs, `logs -f` on a job that never runs, tables that survive odd
names, compressed node lists, requeued jobs' times, GPU utilisation, priority and share."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from phalanx.api.models import JobDetail, JobList, NodeList, PriorityList, ShareList
from phalanx.local import LocalCluster
from tests.cli.conftest import invoke, run_cli

HELLO = ("python", "-c", "import os; print('hi from rank', os.environ['RANK'])")
SLEEP = ("python", "-c", "import time; time.sleep(300)")


def _submit(env: dict[str, str], *args: str) -> int:
    result = invoke("submit", "--json", *args, env=env)
    assert result.exit_code == 0, result.stderr
    job_id: int = json.loads(result.stdout)["job_ids"][0]
    return job_id


def _detail(env: dict[str, str], job_id: int) -> JobDetail:
    result = invoke("show", str(job_id), "--json", env=env)
    assert result.exit_code == 0, result.stderr
    return JobDetail.model_validate_json(result.stdout)


def _wait(env: dict[str, str], job_id: int, states: set[str], timeout: float = 60) -> JobDetail:
    deadline = time.monotonic() + timeout
    while True:
        detail = _detail(env, job_id)
        if detail.job.state in states or time.monotonic() > deadline:
            return detail
        time.sleep(0.2)


def _cancel(env: dict[str, str], *job_ids: int) -> None:
    invoke("cancel", *map(str, job_ids), env=env)
    for job_id in job_ids:
        _wait(env, job_id, {"CA", "CD", "F"})


def test_logs_prints_every_rank_with_a_prefix(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    job_id = _submit(
        admin_env, "-N", "2", "--gpus-per-node", "1", "-D", str(tmp_path), "--", *HELLO
    )
    assert _wait(admin_env, job_id, {"CD"}).job.state == "CD"
    every = invoke("logs", str(job_id), env=admin_env)
    assert every.stdout == "[rank 0] hi from rank 0\n[rank 1] hi from rank 1\n"
    followed = invoke("logs", str(job_id), "-f", env=admin_env)
    assert sorted(followed.stdout.splitlines()) == sorted(every.stdout.splitlines())
    one = invoke("logs", str(job_id), "--rank", "1", env=admin_env)
    assert one.stdout == "hi from rank 1\n"


def test_logs_follow_ends_when_a_pending_job_is_cancelled(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    blocker = _submit(admin_env, "--", *SLEEP)
    waiting = _submit(admin_env, "-d", f"afterok:{blocker}", "--", *HELLO)
    follow = subprocess.Popen(
        [sys.executable, "-m", "phalanx", "logs", str(waiting), "-f"],
        env={**admin_env, **_os_env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)  # it is waiting for the job to start
        assert follow.poll() is None
        _cancel(admin_env, waiting)
        _, err = follow.communicate(timeout=30)  # it used to wait forever
    finally:
        follow.kill()
        _cancel(admin_env, blocker)
    assert follow.returncode == 2
    assert err == f"error: job {waiting} ended (CA) without ever running, so it has no logs\n"


def _os_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("PHALANX_TOKEN", "PHALANX_HEAD")}


def test_queue_escapes_cuts_and_compresses(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    odd = "tab\there\nnewline"
    long = "x" * 200
    gang = _submit(admin_env, "-J", odd, "-N", "2", "--gpus-per-node", "1", "--", *SLEEP)
    wide = _submit(admin_env, "-J", long, "--gpus-per-node", "1", "--", *SLEEP)
    try:
        _wait(admin_env, gang, {"R"})
        _wait(admin_env, wide, {"R"})
        lines = invoke("queue", env=admin_env).stdout.splitlines()
        row = next(line for line in lines if line.startswith(f"{gang} "))
        assert "tab\\there\\nnewline" in row  # escaped: one row, one line
        assert row.endswith("127.0.0.[2-3]")  # compressed, as squeue prints it
        cut = next(line for line in lines if line.startswith(f"{wide} "))
        assert "x" * 23 + "…" in cut and "x" * 25 not in cut
        assert max(len(line) for line in lines) < 120  # the long name widens nothing
        full = invoke("queue", "-l", env=admin_env).stdout
        assert long in full and "TIME_LIMIT" in full
        picked = invoke(
            "queue", "--format", "jobid,name:5,nodelist", "--sort", "-jobid", env=admin_env
        ).stdout.splitlines()
        assert picked[0].split() == ["JOBID", "NAME", "NODELIST"]
        ids = [line.split()[0] for line in picked[1:]]
        assert ids == sorted(ids, key=int, reverse=True) and str(wide) in ids
        assert re.search(rf"^{wide} +xxxx… +127\.0\.0\.", "\n".join(picked), re.M), picked
        assert re.search(rf"^{gang} +tab\\… +127\.0\.0\.\[2-3\]$", "\n".join(picked), re.M)
        bad = invoke("queue", "--format", "jobid,colour", env=admin_env)
        assert bad.exit_code == 2 and bad.stderr.startswith("error: --format: unknown field")
    finally:
        _cancel(admin_env, gang, wide)


def test_queue_watch_prints_again_until_its_count(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    proc = run_cli("queue", "--watch", "0.5", "--count", "3", env=admin_env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(re.findall(r"\(every 0\.5s\)", proc.stdout)) == 3
    assert proc.stdout.count("JOBID") == 3
    lonely = invoke("queue", "--count", "2", env=admin_env)
    assert lonely.exit_code == 2 and "--count goes with --watch" in lonely.stderr


def test_a_requeued_job_shows_its_first_start_and_its_whole_run_time(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    # Exit 75 asks to be requeued: the first run does, the second completes.
    script = (
        "import os, sys, time; time.sleep(1.5); "
        "sys.exit(0) if os.path.exists('ran') else (open('ran', 'w').close(), sys.exit(75))"
    )
    job_id = _submit(admin_env, "-D", str(tmp_path), "--", "python", "-c", script)
    detail = _wait(admin_env, job_id, {"CD", "F"})
    job = detail.job
    assert (job.state, job.restart_count) == ("CD", 1)
    starts = [e.time for e in detail.events if e.to_state == "R"]
    assert len(starts) == 2 and job.start_time == starts[1]
    assert job.first_start_time == starts[0]
    assert job.run_time_s is not None and job.run_time_s >= 3.0  # both runs, not the last
    assert job.end_time is not None and job.end_time - job.start_time < job.run_time_s
    ended = JobList.model_validate_json(invoke("history", "--json", env=admin_env).stdout)
    assert next(j for j in ended.jobs if j.id == job_id).first_start_time == starts[0]
    row = next(
        line
        for line in invoke("history", env=admin_env).stdout.splitlines()
        if line.startswith(f"{job_id} ")
    )
    first = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(starts[0]))
    assert first in row
    shown = invoke("show", str(job_id), env=admin_env).stdout
    assert re.search(rf"StartTime\s+{first}", shown)


def test_gpu_utilisation_of_nodes_and_of_a_running_job(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    # The job declares its fake GPUs' utilisation (agent/fakeload.py): exactly 100%.
    job_id = _submit(
        admin_env,
        "-N", "2", "--gpus-per-node", "2", "--export=ALL,PHALANX_FAKE_GPU_UTIL=100",
        "--", *SLEEP,
    )  # fmt: skip
    try:
        _wait(admin_env, job_id, {"R"})
        deadline = time.monotonic() + 30
        while True:  # the next heartbeats carry the held GPUs' readings
            detail = _detail(admin_env, job_id)
            if [g.utilization_pct for g in detail.gpus] == [100.0] * 4:
                break
            assert time.monotonic() < deadline, detail.gpus
            time.sleep(0.3)
        assert {(g.node, g.index) for g in detail.gpus} == {
            (n, i) for n in ("127.0.0.2", "127.0.0.3") for i in (0, 1)
        }
        listed = NodeList.model_validate_json(invoke("nodes", "--json", env=admin_env).stdout)
        for node in listed.nodes:
            assert [g.utilization_pct for g in node.gpu_telemetry] == [100.0, 100.0]
            assert node.telemetry_age_s is not None
        long = invoke("nodes", "-l", env=admin_env).stdout.splitlines()
        assert long[0].split()[:5] == ["NODE", "STATE", "GPU", "MODEL", "UTIL"]
        assert sum(1 for line in long[1:] if " 100%" in line) == 4
        shown = invoke("show", str(job_id), env=admin_env).stdout
        assert "NODE_RANK" in shown and "GPU-UTIL" in shown
        placement = shown.split("Placement")[1].split("Events")[0].splitlines()
        assert re.search(r"^0\s+127\.0\.0\.2\s+127\.0\.0\.2\s+0-1\s+0,1\s+100%,100%", placement[2])
        assert re.search(r"^1\s+127\.0\.0\.3\s+127\.0\.0\.3\s+2-3\s+0,1", placement[3])
    finally:
        _cancel(admin_env, job_id)


def test_priority_and_share_show_the_schedulers_numbers(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    full = _submit(admin_env, "-N", "2", "--gpus-per-node", "2", "--", *SLEEP)
    low = _submit(admin_env, "-q", "low", "--", *HELLO)
    normal = _submit(admin_env, "--", *HELLO)
    try:
        _wait(admin_env, full, {"R"})
        listed = PriorityList.model_validate_json(
            invoke("priority", "--json", env=admin_env).stdout
        )
        order = [(j.job_id, j.qos, j.qos_priority) for j in listed.jobs]
        assert order == [(normal, "normal", 100), (low, "low", 0)]
        assert [j.rank for j in listed.jobs] == [1, 2] and listed.policy == "priority"
        table = invoke("priority", env=admin_env)
        assert table.stdout.splitlines()[0].split() == [
            "RANK", "JOBID", "USER", "TEAM", "QOS", "PRIORITY", "FAIRSHARE", "AGE",
        ]  # fmt: skip
        assert "fair share" in table.stderr
        # As Slurm: the job next in line for busy GPUs waits on Resources (not "Reserved").
        queue = invoke("queue", "--state", "PD", env=admin_env).stdout
        assert re.search(rf"^{normal} .*\(Resources\)$", queue, re.M), queue
        reason = _detail(admin_env, normal).job.reason_message or ""
        assert "GPUs reserved when jobs without a time limit end" in reason
        shares = ShareList.model_validate_json(invoke("share", "--json", env=admin_env).stdout)
        default = next(t for t in shares.teams if t.team == "default")
        assert (default.gpus_in_use, default.pending_jobs, default.pending_gpus) == (4, 2, 2)
        assert default.usage_gpu_h > 0 and default.fairshare > 0
        rows = invoke("share", env=admin_env).stdout.splitlines()
        assert rows[0].split()[:5] == ["TEAM", "QUOTA", "COHORT", "SHARE", "IN-USE"]
        assert any(line.split()[0] == "default" and line.split()[4] == "4" for line in rows)
    finally:
        _cancel(admin_env, low, normal, full)
