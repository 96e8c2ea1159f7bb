"""phalanx.train under Phalanx: the reference GPT trains over 2 nodes and reports progress."""

from __future__ import annotations

import sys
from pathlib import Path

from phalanx.api.models import JobSpec
from phalanx.client.api import PhalanxClient
from tests.e2e.helpers import wait_state

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"


def test_example_trains_on_two_nodes_and_reports_progress_to_the_head(
    api: PhalanxClient, workdir: Path
) -> None:
    argv = [sys.executable, str(EXAMPLE), "--preset", "tiny", "--steps", "6", "--log-every", "2"]
    argv += ["--checkpoint-dir", str(workdir / "ckpt"), "--checkpoint-every", "3"]
    spec = JobSpec(
        command=argv,
        workdir=str(workdir),
        nodes=2,
        gpus_per_node=1,
        env={"OMP_NUM_THREADS": "1"},
        name="gpt",
    )
    job_id = api.submit(spec).job_ids[0]
    wait_state(api, job_id, {"CD"}, timeout=180)
    detail = api.job(job_id)
    reports = [e.message for e in detail.events if e.kind == "progress"]
    assert reports and reports[0].startswith("last report: step 6"), detail.events
    out = api.logs(job_id, 0, "stdout", 0).data
    assert "done: step 6" in out, out
    assert (workdir / "ckpt").is_dir()


def test_exit_75_requeues_the_job_which_resumes_with_a_higher_restart_count(
    api: PhalanxClient, workdir: Path
) -> None:
    from phalanx.api.models import REQUEUE_EXIT_CODE
    from phalanx.train.preempt import REQUEUE_EXIT_CODE as TRAIN_CODE

    assert TRAIN_CODE == REQUEUE_EXIT_CODE  # what phalanx.train exits with is what the head reads
    script = (
        f'echo "restart $PHALANX_RESTART_COUNT/$SLURM_RESTART_COUNT"; '
        f'if [ "$PHALANX_RESTART_COUNT" = 0 ]; then exit {REQUEUE_EXIT_CODE}; fi'
    )
    spec = JobSpec(command=["bash", "-c", script], workdir=str(workdir), name="requeue")
    job_id = api.submit(spec).job_ids[0]
    info = wait_state(api, job_id, {"CD"}, timeout=60)
    assert info.restart_count == 1 and info.epoch == 2
    kinds = [e.kind for e in api.job(job_id).events]
    assert kinds.count("started") == 2 and "requeued" in kinds, kinds
    assert "restart 1/1" in api.logs(job_id, 0, "stdout", 0).data

    spec = JobSpec(
        command=["bash", "-c", f"exit {REQUEUE_EXIT_CODE}"],
        workdir=str(workdir),
        max_restarts=1,
        name="always75",
    )
    job_id = api.submit(spec).job_ids[0]
    info = wait_state(api, job_id, {"F"}, timeout=60)
    assert info.exit_code == f"{REQUEUE_EXIT_CODE}:0" and info.restart_count == 1
