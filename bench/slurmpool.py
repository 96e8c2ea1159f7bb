"""Phalanx on Slurm (`phalanx slurm-pool`): how fast the pool brings nodes up for a job,
and how a job gets through Slurm taking one of its nodes back.

    sudo .venv/bin/python bench/slurmpool.py            # ~2 min; root: it runs slurmd
    .venv/bin/python bench/slurmpool.py --help

A real slurmctld and two slurmd on this machine (phalanx.testing.slurmcluster, KillWait
60 s), a real head with its DEFAULT settings (heartbeat 2 s, lease 8 s, requeue margin
2 s), `phalanx slurm-pool` as a real process (--min 0 --max 2, a pass every 0.5 s). The
job: 2 nodes × 2 (fake) GPUs, the ledger job of the chaos tests (phalanx.testing.workload:
a step every --step-s, a checkpoint after every step, exits 75 on its notice). Run twice:

  leave (the pool's agents: `phalanx agent --on-sigterm leave`)
  stop  (baseline: the same agents with `--on-sigterm stop`, the agent's default)

Measured, per run:

  grow_s        the job submitted to an empty pool → RUNNING on two agents Slurm started.
  recover_s     `scancel` of one agent's Slurm job → the job RUNNING again (a new epoch,
                on the remaining node and the replacement the pool asked Slurm for).
  outcome       how the first run ended: "requeued" (preempted or node failure), or
                "failed" (the job is over: recover_s is null).
  steps_redone  per rank, the last step the first run logged − the step the second run
                resumed from; the most of any rank (0: nothing lost; the job checkpoints
                after every step and logs the step after its checkpoint).
  job_events    the job's events, for the story.

`recover_ratio` = stop's recover_s / leave's (> 1: leaving is faster). `steal_pct`: the
host's CPU steal during the whole benchmark (a shared VM's noise).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from phalanx.api.models import JobSpec
from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from phalanx.testing import workload
from phalanx.testing.slurmcluster import SlurmCluster
from phalanx.tls import CA_FILE_ENV

sys.path.insert(0, str(Path(__file__).resolve().parent))
from submit import cpu_steal, steal_pct  # bench/ is not a package


def log(message: str) -> None:
    print(f"[slurmpool] {message}", file=sys.stderr, flush=True)


def wait(what: str, probe: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def one_run(mode: str, root: Path, step_s: float) -> dict[str, Any]:
    root.mkdir(parents=True)
    ledger, hold, work = root / "ledger.jsonl", root / "hold", root / "work"
    work.mkdir()
    with (
        SlurmCluster(root / "slurm", nodes=2, gpus_per_node=2, kill_wait=60) as slurm,
        LocalCluster(root / "head", nodes=0) as head,
    ):
        secrets = root / "secrets"
        secrets.mkdir(mode=0o700)
        (secrets / "join").write_text(head.join_token)
        (secrets / "admin").write_text(head.admin_token)
        argv = [sys.executable, "-m", "phalanx", "slurm-pool", "--head", head.url]
        argv += ["--token-file", str(secrets / "admin")]
        argv += ["--join-token-file", str(secrets / "join"), "--name", mode]
        argv += ["--partition", "gpu", "--gpus-per-node", "2", "--min", "0", "--max", "2"]
        argv += ["--idle-timeout", "600", "--interval", "0.5", "--leave-grace", "30"]
        argv += ["--address", "127.0.0.1", "--agent-arg=--fake-gpus=2"]
        argv += ["--agent-ca-file", str(head.ca_file), "--state-root", str(root / "agents")]
        argv += ["--output", str(root / "slurm-%j.out"), f"--agent-arg=--on-sigterm={mode}"]
        env = {**slurm.env(), CA_FILE_ENV: str(head.ca_file)}
        with (root / "pool.log").open("wb") as out:
            pool = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                with head.client() as api:
                    return _story(api, slurm, mode, ledger, hold, work, step_s)
            finally:
                hold.touch()
                pool.send_signal(signal.SIGTERM)
                pool.wait(timeout=30)


def _story(
    api: PhalanxClient,
    slurm: SlurmCluster,
    mode: str,
    ledger: Path,
    hold: Path,
    work: Path,
    step_s: float,
) -> dict[str, Any]:
    spec = JobSpec(
        command=workload.command(10, step_s, "--exit-on-notice", "--hold", str(hold)),
        workdir=str(work),
        env={"LEDGER": str(ledger), "OMP_NUM_THREADS": "1"},
        nodes=2,
        gpus_per_node=2,
    )
    t0 = time.monotonic()
    job_id = api.submit(spec).job_ids[0]
    first = wait("the job running", lambda: _running(api, job_id, 0), 120)
    grow_s = time.monotonic() - t0
    log(f"{mode}: job running after {grow_s:.1f} s on {[p.node for p in first.placement]}")
    wait("a few steps", lambda: len(_steps(ledger, first.epoch)) >= 10, 60)
    victim = first.placement[1].node
    prefix = f"slurm-{mode}-"
    t1 = time.monotonic()
    slurm.run("scancel", victim.removeprefix(prefix))
    outcome, recover_s, redone = "failed", None, None
    try:
        again = wait(
            "the job running again or ended",
            lambda: _running(api, job_id, first.epoch) or _ended(api, job_id),
            180,
        )
    except TimeoutError:
        again = None
    if again is not None and again.state == "R":
        recover_s = time.monotonic() - t1
        outcome = "requeued"
        begins = wait(
            "the new run's begin lines",
            lambda: [
                e
                for e in workload.read_ledger(ledger)
                if e["epoch"] == again.epoch and e["event"] == "begin"
            ],
            60,
        )
        # Per rank (each checkpoints its own step): the most steps any rank does again.
        last: dict[int, int] = {}
        for e in _steps(ledger, first.epoch):
            last[int(e["rank"])] = max(last.get(int(e["rank"]), 0), int(e["step"]))
        redone = max(max(0, last.get(int(b["rank"]), 0) - int(b["step"])) for b in begins)
        log(f"{mode}: running again {recover_s:.1f} s after scancel; {redone} step(s) redone")
    else:
        log(f"{mode}: the job did not come back: {again.state if again else 'timeout'}")
    events = [f"{e.kind}: {e.message}" for e in api.job(job_id).events]
    return {
        "grow_s": round(grow_s, 2),
        "recover_s": None if recover_s is None else round(recover_s, 2),
        "outcome": outcome,
        "steps_redone": redone,
        "job_events": events,
    }


def _running(api: PhalanxClient, job_id: int, after_epoch: int) -> Any:
    info = api.job(job_id).job
    return info if info.state == "R" and info.epoch > after_epoch else None


def _ended(api: PhalanxClient, job_id: int) -> Any:
    info = api.job(job_id).job
    return info if info.state in ("CD", "F", "CA", "TO", "NF", "OOM") else None


def _steps(ledger: Path, epoch: int) -> list[dict[str, Any]]:
    return [e for e in workload.read_ledger(ledger) if e["epoch"] == epoch and e["event"] == "step"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds per job step")
    args = parser.parse_args()
    before = cpu_steal()
    results = {}
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-slurmpool-") as tmp:
        for mode in ("leave", "stop"):
            results[mode] = one_run(mode, Path(tmp) / mode, args.step_s)
    leave, stop = results["leave"]["recover_s"], results["stop"]["recover_s"]
    out = {
        "benchmark": "slurmpool",
        "leave": results["leave"],
        "stop": results["stop"],
        "recover_ratio": round(stop / leave, 2) if leave and stop else None,
        "grow_s": results["leave"]["grow_s"],
        "steal_pct": steal_pct(before, cpu_steal()),
        "head_settings": "defaults (heartbeat 2 s, lease 8 s, requeue margin 2 s)",
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
