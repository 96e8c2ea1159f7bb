"""`make demo`'s program, run as `make demo` runs it (without a terminal: it does not wait
for Enter): the training job completes, the dashboard's login link is printed, the busy and
idle side jobs run and the idle one's GPU is flagged, and the efficiency summary is shown."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_the_demo_trains_shows_the_dashboard_link_and_flags_the_idle_gpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "phalanx.local.demo", "--steps", "20", "--state-dir", str(tmp_path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"dashboard: https://127\.0\.0\.1:\d+/ui/login#token=phx_\S+", out), out
    assert "state CD, exit 0:0" in out
    assert re.search(r"efficiency \(phalanx jobstats \d+\): 4 GPUs, mean utilisation \d+%", out)
    assert re.search(r"idle GPU flagged: 127\.0\.0\.\d GPU \d of job 2 ", out), out
    assert "side job 1 (busy-sweep): R" in out
    assert "press Enter" not in out  # no terminal: it does not wait
