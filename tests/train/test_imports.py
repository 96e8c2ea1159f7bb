"""torch stays out of Phalanx's core: it is the `train` extra, imported only by phalanx.train."""

from __future__ import annotations

import subprocess
import sys

from tests.train import launch


def test_phalanx_and_its_core_import_without_torch() -> None:
    code = (
        "import sys, phalanx, phalanx.core\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        # What the agent and head may read from phalanx.train is torch-free too.
        "import phalanx.train, phalanx.train.env, phalanx.train.errors, phalanx.train.preempt\n"
        "assert phalanx.train.REQUEUE_EXIT_CODE == 75\n"
        "assert 'torch' not in sys.modules, 'phalanx.train helpers imported torch'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=launch.child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
