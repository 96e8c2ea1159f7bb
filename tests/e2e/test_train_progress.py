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
