"""`phalanx exec`, `phalanx attach` and `submit --notify-url` as a user runs them: real
CLI processes against a real local cluster (head + two agents), a webhook receiver on
127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from phalanx.api.models import JobSpec
from phalanx.local import LocalCluster
from phalanx.testing.processes import pid_alive
from tests.cli.conftest import invoke, run_cli
from tests.e2e.helpers import read_log, submit, wait_for, wait_state
from tests.head.test_notify import Receiver


def _running(cluster: LocalCluster, workdir: Path, script: str, gpus: int = 1) -> int:
    """A job running `script` (bash) on one node with `gpus` ranks; its id once running."""
    with cluster.client() as client:
        spec = JobSpec(command=["bash", "-c", script], workdir=str(workdir), gpus_per_node=gpus)
        job_id = submit(client, spec)
        wait_state(client, job_id, "R")
    return job_id


def _cancel(cluster: LocalCluster, job_id: int) -> None:
    with cluster.client() as client:
        client.cancel(job_id)


def _popen(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def test_exec_streams_both_outputs_and_exits_with_the_commands_status(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    job_id = _running(cluster, tmp_path, "exec sleep 120", gpus=2)
    script = "echo out rank $RANK in $PWD; echo err >&2; exit 7"
    done = run_cli("exec", str(job_id), "--rank", "1", "--", "sh", "-c", script, env=admin_env)
    assert done.returncode == 7, done.stderr
    assert done.stdout == f"out rank 1 in {tmp_path}\n"
    assert done.stderr == "err\n"
    timed = run_cli("exec", str(job_id), "--timeout", "1", "--", "sleep", "30", env=admin_env)
    assert timed.returncode == 124
    assert timed.stderr == "error: it ran past its timeout of 1 s: killed\n"
    _cancel(cluster, job_id)


def test_ctrl_c_kills_the_command(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    job_id = _running(cluster, tmp_path, "exec sleep 120")
    proc = _popen(admin_env, "exec", str(job_id), "--", "bash", "-c", "echo $$; exec sleep 60")
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    assert pid_alive(pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert f"the command in job {job_id} was killed" in err
    wait_for("the command to be killed on its node", lambda: not pid_alive(pid) or None)
    _cancel(cluster, job_id)


def test_exec_refusals_are_one_line(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    no_command = run_cli("exec", "1", env=admin_env)
    assert (no_command.returncode, no_command.stderr) == (
        2,
        "error: no command: phalanx exec JOB [--rank R] -- CMD ARGS…\n",
    )
    with cluster.client() as client:
        ended = submit(client, JobSpec(command=["true"], workdir=str(tmp_path)))
        wait_state(client, ended, "CD", timeout=60)
    late = run_cli("exec", str(ended), "--", "true", env=admin_env)
    assert late.returncode == 2
    assert late.stderr == (f"error: job {ended} has ended (CD): nothing runs to exec into\n")
    huge = run_cli("exec", str(ended), "--", "echo", "x" * 70_000, env=admin_env)
    assert huge.returncode == 2 and huge.stderr.startswith("error: cannot run that command: argv")


def test_attach_follows_live_output_until_the_rank_ends(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    script = (
        "echo before; while [ ! -e go ]; do sleep 0.1; done; "
        "for i in 1 2 3; do echo line$i; echo warn$i >&2; done"
    )
    job_id = _running(cluster, tmp_path, script)
    with cluster.client() as client:
        wait_for("the first line", lambda: "before" in read_log(client, job_id)[0] or None)
    proc = _popen(admin_env, "attach", str(job_id))
    assert proc.stderr is not None
    assert proc.stderr.readline() == f"attached to job {job_id} rank 0; Ctrl-C detaches\n"
    (tmp_path / "go").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == "line1\nline2\nline3\n"  # live output only: not what came before
    assert err == "warn1\nwarn2\nwarn3\n"


def test_attach_from_the_start_and_to_an_ended_job(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    job_id = _running(cluster, tmp_path, "echo before; while [ ! -e go ]; do sleep 0.1; done")
    proc = _popen(admin_env, "attach", str(job_id), "--from-start")
    assert proc.stderr is not None
    proc.stderr.readline()  # attached
    (tmp_path / "go").touch()
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, "before\n")
    with cluster.client() as client:
        wait_state(client, job_id, "CD")
    late = run_cli("attach", str(job_id), env=admin_env)
    assert late.returncode == 1
    assert late.stderr == (
        f"error: job {job_id} has ended (CD): nothing runs to attach to; "
        f"`phalanx logs {job_id}` prints what it wrote\n"
    )


def test_submit_posts_the_events_asked_for(
    cluster: LocalCluster, admin_env: dict[str, str], tmp_path: Path
) -> None:
    receiver = Receiver()
    try:
        hook = f"{receiver.url}/job"
        args = ["submit", "--notify-url", hook, "--mail-type", "BEGIN,END", "--wait"]
        done = run_cli(*args, "--", "false", env=admin_env, cwd=tmp_path)
        assert done.returncode == 1, done.stderr
        job_id = int(done.stdout.split("Submitted job ")[1].split()[0])
        posts = wait_for(
            "two notifications", lambda: receiver.got("/job")[1:] and receiver.got("/job")
        )
        assert [(p["event"], p["state"], p["job_id"]) for p in posts] == [
            ("BEGIN", "R", job_id),
            ("FAIL", "F", job_id),  # END covers an end that failed, posted as FAIL
        ]
        refused = run_cli(
            "submit", "--notify-url", "http://10.0.0.1/x", "--", "true", env=admin_env, cwd=tmp_path
        )
        assert refused.returncode == 2
        assert refused.stderr.startswith(
            "error: the head may not post notifications to 'http://10.0.0.1/x' (allowed: "
            "127.0.0.1, localhost, [::1])"
        )
    finally:
        receiver.close()


def test_a_malformed_notify_allow_entry_stops_the_head_with_one_line(tmp_path: Path) -> None:
    result = invoke("head", "--state-dir", str(tmp_path / "head"), "--notify-allow", "a:80")
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --notify-allow 'a:80': give a host name or address (hooks.example.com, "
        "10.0.0.5, [::1]) or a URL prefix (https://hooks.example.com/phalanx)\n"
    )
    assert not (tmp_path / "head").exists()  # refused before anything was made
