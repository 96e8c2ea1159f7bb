"""dcgm-exporter's job-mapping files (agent/jobmap.py) and the agent's metrics settings:
the files dcgm-exporter reads (a file per GPU index, a job id per line), written
atomically and only on change; clear errors for an unusable directory or token file."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from phalanx.agent.jobmap import JobMapWriter, expand
from phalanx.agent.main import AgentConfig, AgentError, run_agent
from phalanx.api.gpumetrics import GpuRow, render

from .stubhead import JOIN


def read(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir()) if p.is_file()}


def test_prepare_writes_every_gpu_empty_and_drops_stale_files(tmp_path: Path) -> None:
    d = tmp_path / "map"
    d.mkdir()
    (d / "7").write_text("99\n")  # a GPU this node no longer has
    (d / ".phalanx-1.tmp").write_text("half")  # an earlier run died mid-write
    (d / "README").write_text("kept")  # not ours: dcgm-exporter skips it too
    (d / "3").mkdir()  # a directory: left alone
    writer = JobMapWriter(d, [0, 1])
    writer.prepare()
    assert read(d) == {"0": "", "1": "", "README": "kept"}
    assert not (d / "7").exists() and not (d / ".phalanx-1.tmp").exists()
    assert (d / "3").is_dir()


def test_update_lists_jobs_per_gpu_and_rewrites_only_what_changed(tmp_path: Path) -> None:
    old = os.umask(0o077)  # the agent's umask: the files are still world-readable
    try:
        writer = JobMapWriter(tmp_path / "map", [0, 1, 2])
        writer.prepare()
        assert writer.update({0: [12], 1: [12, 7]}) == [0, 1]
        assert read(tmp_path / "map") == {"0": "12\n", "1": "7\n12\n", "2": ""}
        before = (tmp_path / "map" / "1").stat().st_ino
        assert writer.update({0: [12], 1: [7, 12]}) == []  # nothing changed: nothing written
        assert (tmp_path / "map" / "1").stat().st_ino == before
        assert writer.update({}) == [0, 1]
        assert read(tmp_path / "map") == {"0": "", "1": "", "2": ""}
        for p in (tmp_path / "map").iterdir():
            assert p.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def test_percent_n_is_the_node_name() -> None:
    assert expand("/run/dcgm/%n", "gpu-07") == Path("/run/dcgm/gpu-07")
    assert expand("/run/dcgm", "gpu-07") == Path("/run/dcgm")


def _config(tmp_path: Path, **fields: object) -> AgentConfig:
    base = AgentConfig(
        head_url="http://127.0.0.1:9",  # never reached: the settings are refused first
        token=JOIN,
        address="127.0.0.2",
        name="n1",
        state_dir=tmp_path / "agent",
        fake_gpus=2,
        use_cgroups=False,
    )
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def test_an_unreadable_metrics_token_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AgentError, match="cannot read the metrics token file"):
        run_agent(_config(tmp_path, metrics_token_file=tmp_path / "missing"))
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(AgentError, match="holds no token"):
        run_agent(_config(tmp_path, metrics_token_file=tmp_path / "short"))


def test_an_unusable_mapping_dir_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    with pytest.raises(AgentError, match=r"--hpc-job-mapping-dir .*afile"):
        run_agent(_config(tmp_path, hpc_job_mapping_dir=str(tmp_path / "afile" / "%n")))


def test_label_values_are_escaped_and_promtool_accepts_them() -> None:
    row = GpuRow(
        node="n1",
        gpu=0,
        uuid="GPU-1",
        memory_mb=80,
        utilization_pct=50.0,
        memory_used_mb=40,
        temperature_c=40.5,
        power_w=300.0,
        age_s=1.25,
        job=3,
        user='we"ird\\user',
        team="line\nbreak",
    )
    text = render([row, GpuRow(node="n1", gpu=1, uuid="GPU-2")])
    assert 'user="we\\"ird\\\\user"' in text and 'team="line\\nbreak"' in text
    assert 'phalanx_gpu_utilization_ratio{node="n1",gpu="0"' in text
    assert "phalanx_gpu_memory_used_bytes" in text and str(40 * 1024 * 1024) in text
    assert 'gpu="1"' not in text  # a GPU without a reading has no samples
    tool = shutil.which("promtool")
    assert tool is not None, "promtool is missing: apt-get install prometheus"
    done = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout, done.stderr)
