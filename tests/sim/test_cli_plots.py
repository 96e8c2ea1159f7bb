"""`phalanx sim --plots`: a bad folder is refused before simulating, and a plotting error
never loses the results (real processes, synthetic workloads: no trace files needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def _phalanx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phalanx", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda tmp: tmp / "README.md", "it exists and is not a folder"),
        (lambda tmp: Path("/proc/nope"), "No such file or directory"),
    ],
    ids=["a-file", "an-impossible-folder"],
)
def test_a_bad_plots_folder_is_refused_before_simulating(
    tmp_path: Path, make: Any, why: str
) -> None:
    (tmp_path / "README.md").write_text("not a folder\n")
    target = make(tmp_path)
    proc = _phalanx("sim", "--synthetic", "200", "--nodes", "4", "--plots", str(target), "--json")
    assert proc.returncode == 2
    assert proc.stderr == f"error: --plots {target}: cannot write plots there ({why})\n"
    assert proc.stdout == ""  # refused before simulating, not after
    assert (tmp_path / "README.md").read_text() == "not a folder\n"


def test_a_plotting_error_keeps_the_results(tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    (plots / "queue_cdf.png").mkdir(parents=True)  # a folder where a plot must go
    proc = _phalanx(
        "sim", "--synthetic", "200", "--nodes", "4", "--policy", "fifo,las",
        "--plots", str(plots), "--json",
    )  # fmt: skip
    assert proc.returncode == 1
    data = json.loads(proc.stdout)  # the whole result, printed before plotting
    assert data["policies"]["fifo"]["jobs"] == data["policies"]["las"]["jobs"] == 200
    assert "error: plots not written (Is a directory" in proc.stderr
    assert "queue_cdf.png" in proc.stderr and "Traceback" not in proc.stderr
    assert (plots / "jct_cdf.png").read_bytes()[:4] == b"\x89PNG"  # the ones before it
