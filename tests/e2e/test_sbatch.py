"""A multi-node `#SBATCH` script (srun + torchrun, c10d rendezvous) through the real CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from phalanx.local.cluster import free_port
from tests.e2e.helpers import ALLREDUCE_PY, JOB_ENV

SBATCH = """\
#!/bin/bash
#SBATCH --job-name=allreduce
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=2
#SBATCH -o %x-%j.out

MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
echo "master $MASTER_ADDR"
srun torchrun --nnodes 2 --nproc_per_node 2 --rdzv_id $SLURM_JOB_ID --rdzv_backend c10d \\
    --rdzv_endpoint $MASTER_ADDR:RDZV_PORT allreduce.py
"""


def test_an_sbatch_script_runs_torchrun_on_every_node_through_srun(
    cluster: LocalCluster, api: PhalanxClient, workdir: Path, tmp_path: Path
) -> None:
    # Not the usual 29500: the rendezvous store binds the wildcard address, so two of these
    # tests running at once (one per database, on two pytest workers) would meet on it,
    # with equal job ids as rendezvous ids. Everything else in the script is as users write it.
    port = free_port()
    (workdir / "train.sbatch").write_text(SBATCH.replace("RDZV_PORT", str(port)))
    (workdir / "allreduce.py").write_text(ALLREDUCE_PY)
    venv_bin = str(Path(sys.executable).parent)  # torchrun, as an activated venv has it
    env = {
        **os.environ,
        **JOB_ENV,
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        **cluster.client_env(),
        "PHALANX_CONFIG_DIR": str(tmp_path / "config"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "phalanx", "submit", "train.sbatch", "--wait"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )

    match = re.search(r"Submitted job (\d+)", done.stdout)
    assert match, (done.stdout, done.stderr)
    job_id = int(match.group(1))
    output = workdir / f"allreduce-{job_id}.out"
    assert done.returncode == 0, (done.stdout, done.stderr, output.read_text())
    info = api.job(job_id).job
    assert (info.state, info.exit_code, info.launcher) == ("CD", "0:0", "batch")
    assert (info.nodes, info.gpus_per_node) == (2, 2)
    text = output.read_text()
    assert f"master {info.placement[0].address}\n" in text
    ranks = sorted(int(r) for r in re.findall(r"rank (\d) of 4: allreduce sum 10\b", text))
    assert ranks == [0, 1, 2, 3], text
