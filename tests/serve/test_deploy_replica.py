"""The replica wrapper outside a job: one error line, no traceback; where it listens."""

from __future__ import annotations

import os
import subprocess
import sys

from phalanx.serve.replica import node_address


def test_outside_a_job_the_wrapper_says_so_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHALANX_")}
    argv = [sys.executable, "-m", "phalanx.serve.replica"]
    argv += ["--deployment", "chat", "--pool", "aggregated", "--generation", "1"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: not inside a Phalanx job (PHALANX_HEAD, PHALANX_STEP_TOKEN, PHALANX_JOB_ID unset)"
    ]


def test_it_listens_on_its_nodes_address() -> None:
    assert node_address({"MASTER_ADDR": "10.1.2.3"}) == "10.1.2.3"
    assert node_address({"PHALANX_NODE_ADDRESS": "10.9.9.9", "MASTER_ADDR": "10.1.2.3"}) == (
        "10.9.9.9"
    )
    assert node_address({}) == "127.0.0.1"
