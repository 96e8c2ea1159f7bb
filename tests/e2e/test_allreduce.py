"""A real torch.distributed all-reduce (gloo) across two nodes × two GPUs, both launchers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from phalanx.client.api import PhalanxClient
from tests.e2e.helpers import ALLREDUCE_PY, final_log, job, submit, wait_state

WORLD = 4
SUM = WORLD * (WORLD + 1) // 2  # ranks contribute 1, 2, 3, 4


def test_torchrun_launcher_runs_an_allreduce_on_every_rank(
    api: PhalanxClient, workdir: Path
) -> None:
    (workdir / "allreduce.py").write_text(ALLREDUCE_PY)
    spec = job(workdir, [sys.executable, "allreduce.py"], nodes=2, gpus_per_node=2)
    job_id = submit(api, spec)

    info = wait_state(api, job_id, "CD", timeout=90)

    assert info.exit_code == "0:0"
    assert len({p.node for p in info.placement}) == 2
    for rank in range(WORLD):
        out = final_log(api, job_id, rank)
        assert f"rank {rank} of {WORLD}: allreduce sum {SUM}" in out, out


def test_node_launcher_runs_torchrun_from_pet_variables(api: PhalanxClient, workdir: Path) -> None:
    (workdir / "allreduce.py").write_text(ALLREDUCE_PY)
    # Bare `torch.distributed.run`: nnodes, nproc_per_node, node_rank and the master
    # address and port all come from the PET_* variables the agent sets.
    command = [sys.executable, "-m", "torch.distributed.run", "allreduce.py"]
    job_id = submit(api, job(workdir, command, launcher="node", nodes=2, gpus_per_node=2))

    info = wait_state(api, job_id, "CD", timeout=90)

    assert info.exit_code == "0:0"
    # One process per node: each node's log holds its torchrun's two workers' lines.
    lines = "".join(final_log(api, job_id, node) for node in range(2))
    pattern = rf"rank (\d) of {WORLD}: allreduce sum {SUM}\b"
    found = sorted(int(r) for r in re.findall(pattern, lines))
    assert found == list(range(WORLD)), lines
