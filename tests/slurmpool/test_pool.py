"""`phalanx slurm-pool` against a real slurmctld and two real slurmd, and a real head.

The pool grows with Phalanx's pending demand (a 2-node job brings two agents up as Slurm
jobs); `scancel` of one agent's Slurm job makes Phalanx requeue the job, which resumes from
its checkpoint on the replacement the pool asks Slurm for; idle, the pool gives every
node back and forgets it. Then the failures: slurmctld down, sbatch refusing, a restart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.api.models import JobInfo, JobSpec, UserCreate
from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from phalanx.local.cluster import free_port
from phalanx.slurmpool.payload import AgentJob
from phalanx.slurmpool.policy import PoolLimits
from phalanx.slurmpool.pool import SlurmPool
from phalanx.slurmpool.slurm import Slurm
from phalanx.testing import workload
from phalanx.testing.invariants import check_never_twice
from phalanx.testing.processes import pid_alive
from phalanx.testing.slurmcluster import SlurmCluster
from phalanx.tls import CA_FILE_ENV
from tests.e2e.helpers import describe, submit, wait_for, wait_state

HEAD_ARGS = ["--heartbeat", "0.5", "--lease", "2", "--requeue-margin", "1"]
HEAD_ARGS += ["--kill-grace", "2", "--preempt-grace", "15"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Two Slurm nodes with two fake GPUs each; KillWait 20 s (the agents leave within
    10); a client gives up on a stopped slurmctld after about a second."""
    root = tmp_path_factory.mktemp("slurm")
    with SlurmCluster(root, nodes=2, gpus_per_node=2, kill_wait=20, message_timeout=2) as s:
        yield s


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A head alone: every node of the test comes from Slurm."""
    with LocalCluster(tmp_path_factory.mktemp("head"), nodes=0, head_args=HEAD_ARGS) as c:
        yield c


@pytest.fixture(autouse=True)
def no_slurm_job_left(slurm: SlurmCluster) -> Iterator[None]:
    """Each test starts with both Slurm nodes free, whatever the one before left."""
    yield
    slurm.cancel_all()


@pytest.fixture(scope="module")
def secrets(head: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("secrets")
    files = {"join": root / "join.token", "admin": root / "admin.token"}
    for kind, path in files.items():
        path.write_text(head.join_token if kind == "join" else head.admin_token)
        path.chmod(0o600)
    return files


def agent_job(
    head: LocalCluster, secrets: dict[str, Path], root: Path, pool: str, **fields: object
) -> AgentJob:
    base: dict[str, object] = {
        "pool": pool,
        "head_url": head.url,
        "token_file": str(secrets["join"]),
        "node_prefix": f"slurm-{pool}-",
        "state_root": str(root / "agents"),
        "phalanx": (sys.executable, "-m", "phalanx"),
        "partition": "gpu",
        "gpus_per_node": 2,
        "leave_grace_s": 10.0,
        "address": "127.0.0.1",
        "ca_file": str(head.ca_file),
        "output": str(root / "slurm-%j.out"),
        "agent_args": ("--fake-gpus=2",),
    }
    base.update(fields)
    return AgentJob(**base)  # type: ignore[arg-type]  # the fields above, as declared


def pool_jobs(slurm: SlurmCluster, pool: str) -> dict[str, str]:
    """The pool's Slurm jobs squeue lists: id -> state."""
    out = slurm.run("squeue", "-h", f"--name=phalanx-pool-{pool}", "-o", "%i %T").stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that name `text` (a test's folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and pid_alive(int(entry.name)):
            found.append(cmdline)
    return found


def environments_holding(secret: str) -> list[int]:
    """Pids of live processes whose environment holds `secret`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if secret.encode() in environ and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def ledger_steps(ledger: Path, epoch: int) -> list[dict[str, object]]:
    return [e for e in workload.read_ledger(ledger) if e["epoch"] == epoch]


def test_the_pool_grows_with_demand_replaces_a_cancelled_agent_and_shrinks_when_idle(
    slurm: SlurmCluster, head: LocalCluster, secrets: dict[str, Path], tmp_path: Path
) -> None:
    ledger, hold = tmp_path / "ledger.jsonl", tmp_path / "hold"
    work = tmp_path / "work"
    work.mkdir()
    argv = [sys.executable, "-m", "phalanx", "slurm-pool", "--head", head.url]
    argv += ["--token-file", str(secrets["admin"]), "--join-token-file", str(secrets["join"])]
    argv += ["--name", "accept", "--partition", "gpu", "--gpus-per-node", "2"]
    argv += ["--min", "0", "--max", "2", "--idle-timeout", "2", "--interval", "0.5"]
    argv += ["--leave-grace", "10", "--address", "127.0.0.1", "--agent-arg=--fake-gpus=2"]
    argv += ["--agent-ca-file", str(head.ca_file), "--state-root", str(tmp_path / "agents")]
    argv += ["--output", str(tmp_path / "slurm-%j.out")]
    # The admin token also in the pool's environment: sbatch must not pass it on.
    env = {**slurm.env(), CA_FILE_ENV: str(head.ca_file), "PHALANX_TOKEN": head.admin_token}
    log = (tmp_path / "pool.log").open("wb")
    pool = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        with head.client() as api:
            try:
                _run_the_story(slurm, api, ledger, hold, work, pool, head.admin_token)
            except AssertionError as e:
                raise AssertionError(_diagnose(e, slurm, api, tmp_path)) from None
    finally:
        pool.send_signal(signal.SIGTERM)
        pool.wait(timeout=30)
        log.close()
    assert pool.returncode == 0, (tmp_path / "pool.log").read_text()[-3000:]
    # Every agent the pool started has exited, and every process of the job with it.
    assert processes_mentioning(str(tmp_path)) == []
    text = (tmp_path / "pool.log").read_text()
    assert "submitted Slurm job(s)" in text and "released slurm-accept-" in text
    assert secrets["join"].read_text() not in text  # the join token is never logged


def _diagnose(e: AssertionError, slurm: SlurmCluster, api: PhalanxClient, root: Path) -> str:
    """What a failure needs to be understood: the jobs' events, the nodes, Slurm's queue,
    the pool's log and the agents' logs."""
    parts = [str(e)]
    for job in api.jobs().jobs:
        parts.append(describe(api, job.id))
    parts.append(f"nodes: {[(n.name, n.state, n.reason, n.jobs) for n in api.nodes().nodes]}")
    parts.append(f"squeue: {slurm.run('squeue', check=False).stdout}")
    for log in [root / "pool.log", *sorted(root.glob("slurm-*.out"))]:
        parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}")
    return "\n".join(parts)


def _run_the_story(
    slurm: SlurmCluster,
    api: PhalanxClient,
    ledger: Path,
    hold: Path,
    work: Path,
    pool: subprocess.Popen[bytes],
    admin_token: str,
) -> None:
    # No node at all: a 2-node job waits, and that demand makes the pool ask Slurm for two.
    spec = JobSpec(
        command=workload.command(5, 0.05, "--exit-on-notice", "--hold", str(hold)),
        workdir=str(work),
        env={"LEDGER": str(ledger), "OMP_NUM_THREADS": "1"},
        nodes=2,
        gpus_per_node=2,
    )
    job_id = submit(api, spec)
    first = wait_state(api, job_id, "R", timeout=60)
    nodes = [p.node for p in first.placement]
    assert all(n.startswith("slurm-accept-") for n in nodes), nodes
    assert environments_holding(admin_token) == [pool.pid]  # not the agents, nor the job
    started = pool_jobs(slurm, "accept")
    assert started == {n.removeprefix("slurm-accept-"): "RUNNING" for n in nodes}
    wait_for(
        "every rank stepping",  # 2 nodes x 2 GPUs: ranks 0-3, all stepping until `hold`
        lambda: (
            {0, 1, 2, 3}
            <= {e["rank"] for e in ledger_steps(ledger, first.epoch) if e["event"] == "step"}
            or None
        ),
    )

    # Slurm takes one node back: its agent leaves, the job requeues, the pool replaces it.
    victim = first.placement[1].node
    victim_slurm = victim.removeprefix("slurm-accept-")
    slurm.run("scancel", victim_slurm)

    def rerun() -> JobInfo | None:
        info = api.job(job_id).job
        return info if info.state == "R" and info.epoch > first.epoch else None

    again = wait_for("the job running again", rerun, timeout=60)
    assert again.restart_count == 1, describe(api, job_id)
    replacement = {p.node for p in again.placement} - set(nodes)
    assert len(replacement) == 1 and victim not in {p.node for p in again.placement}
    assert replacement.pop().removeprefix("slurm-accept-") not in started  # a new Slurm job
    assert slurm.job_state(victim_slurm) == "CANCELLED"
    events = [(e.kind, e.message) for e in api.job(job_id).events]
    assert any(k == "preempting" and f"node {victim} is leaving" in m for k, m in events), events
    begins = wait_for(
        "the new run's begin lines",
        lambda: [e for e in ledger_steps(ledger, again.epoch) if e["event"] == "begin"] or None,
    )
    assert all(int(str(b["step"])) > 0 for b in begins), begins  # resumed from its checkpoint

    hold.touch()
    done = wait_state(api, job_id, "CD", timeout=60)
    assert done.restart_count == 1
    verdict = check_never_twice(workload.lives(workload.read_ledger(ledger)))
    assert verdict.ok, verdict.violations

    # Idle: the pool gives both nodes back to Slurm and forgets them in Phalanx.
    wait_for(
        "the pool to give every node back",
        lambda: (not pool_jobs(slurm, "accept") and not api.nodes().nodes) or None,
        timeout=60,
    )
    assert pool.poll() is None  # still running, at --min 0


def test_slurmctld_down_changes_nothing_and_the_pool_carries_on(
    slurm: SlurmCluster, head: LocalCluster, secrets: dict[str, Path], tmp_path: Path
) -> None:
    # Held Slurm jobs: they count as the pool's (pending) nodes, but never start an agent.
    job = agent_job(head, secrets, tmp_path, "outage", sbatch_args=("--hold",))
    with head.client() as api:
        pool = SlurmPool(job, PoolLimits(1, 1, 2, 60.0), api, Slurm(env=slurm.env()))
        slurm.stop_controller()
        try:
            down = pool.step()
        finally:
            slurm.start_controller()
        assert not down.ok and down.submitted == []
        assert down.problem is not None and "Slurm unreachable" in down.problem
        assert "Unable to contact slurm controller" in down.problem

        back = pool.step()
        assert back.ok and len(back.submitted) == 1, back
        assert pool_jobs(slurm, "outage") == {back.submitted[0]: "PENDING"}

        # A restarted pool finds its Slurm jobs again (squeue, by name): no duplicate.
        restarted = SlurmPool(job, PoolLimits(1, 1, 2, 60.0), api, Slurm(env=slurm.env()))
        report = restarted.step()
        assert report.ok and report.submitted == [] and report.members == 1, report
        assert pool_jobs(slurm, "outage") == {back.submitted[0]: "PENDING"}
    slurm.run("scancel", back.submitted[0])


def test_sbatch_refusing_the_job_is_a_clear_error_and_nothing_is_submitted(
    slurm: SlurmCluster, head: LocalCluster, secrets: dict[str, Path], tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "phalanx", "slurm-pool", "--once", "--head", head.url]
    argv += ["--token-file", str(secrets["admin"]), "--join-token-file", str(secrets["join"])]
    argv += ["--name", "refuse", "--partition", "nosuch", "--gpus-per-node", "2", "--min", "1"]
    env = {**slurm.env(), CA_FILE_ENV: str(head.ca_file)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["submitted"] == [] and report["target"] == 1
    assert "sbatch refused the job" in report["problem"]
    assert "Invalid partition name specified" in report["problem"]
    assert "Traceback" not in done.stderr
    assert pool_jobs(slurm, "refuse") == {}
    assert os.environ.get("SLURM_CONF") is None  # the test's own env is untouched


def test_an_agent_that_cannot_join_is_reported_and_submitting_backs_off(
    slurm: SlurmCluster, head: LocalCluster, secrets: dict[str, Path], tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text("phx_join_this-token-was-never-issued")
    wrong.chmod(0o600)
    job = agent_job(head, secrets, tmp_path, "broken", token_file=str(wrong))
    with head.client() as api:
        pool = SlurmPool(job, PoolLimits(1, 1, 2, 60.0), api, Slurm(env=slurm.env()))
        first = pool.step()
        assert len(first.submitted) == 1, first
        wait_for("the agent's Slurm job to end", lambda: not pool_jobs(slurm, "broken") or None)

        after = pool.step()

    assert after.failed_starts == first.submitted and after.submitted == [], after
    assert "ended before their agent joined" in after.summary()
    assert after.problem is not None and "not submitting for" in after.problem
    output = (tmp_path / f"slurm-{first.submitted[0]}.out").read_text()
    assert "refused to register this agent" in output  # the agent said why …
    assert wrong.read_text() not in output  # … without printing the token


def test_a_head_that_does_not_answer_changes_nothing(
    slurm: SlurmCluster, head: LocalCluster, secrets: dict[str, Path], tmp_path: Path
) -> None:
    nobody = f"https://127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "phalanx", "slurm-pool", "--once", "--head", nobody]
    argv += ["--token-file", str(secrets["admin"]), "--join-token-file", str(secrets["join"])]
    argv += ["--name", "headless", "--gpus-per-node", "2", "--min", "1"]
    done = subprocess.run(argv, env=slurm.env(), capture_output=True, text=True, timeout=60)

    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert not report["ok"] and report["submitted"] == []
    assert "the head did not answer" in report["problem"] and nobody in report["problem"]
    assert pool_jobs(slurm, "headless") == {}


def test_the_pool_needs_an_admin_token(
    slurm: SlurmCluster, head: LocalCluster, secrets: dict[str, Path], tmp_path: Path
) -> None:
    with head.client() as api:
        api.create_user(UserCreate(name="pooluser"))
        user_token = tmp_path / "user.token"
        user_token.write_text(api.create_token("pooluser").token)
    argv = [sys.executable, "-m", "phalanx", "slurm-pool", "--once", "--head", head.url]
    argv += ["--token-file", str(user_token), "--join-token-file", str(secrets["join"])]
    argv += ["--gpus-per-node", "2"]
    env = {**slurm.env(), CA_FILE_ENV: str(head.ca_file)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 2 and done.stdout == ""
    assert "needs an admin token (this one is pooluser's, a user)" in done.stderr
