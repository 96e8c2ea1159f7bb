"""`phalanx submit --dry-run`: YAML, flags and `#SBATCH` scripts give the same spec; bad
input exits 2 with one line and no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import invoke, run_cli

YAML = """\
name: hello
nodes: 2
gpus_per_node: 2
time_limit_s: 600
team: ml
restart_on_failure: true
checkpoint_dir: ckpt
preempt_signal: USR2
preempt_grace: 90
hang_timeout: "10:00"
command: ["python", "-c", "print('hi')"]
"""
SCRIPT = """\
#!/bin/bash
#SBATCH -J hello
#SBATCH -N 2
#SBATCH --gpus-per-node=2
#SBATCH -t 10:00
#SBATCH -p ml
#SBATCH --restart-on-failure --checkpoint-dir ckpt
#SBATCH --preempt-signal=SIGUSR2 --preempt-grace=1:30 --hang-timeout=600
python -c "print('hi')"
"""
FLAGS = (
    *("-J", "hello", "-N", "2", "--gpus-per-node", "2", "-t", "10", "-p", "ml"),
    *("--restart-on-failure", "--checkpoint-dir", "ckpt", "--preempt-signal", "usr2"),
    *("--preempt-grace", "0:01:30", "--hang-timeout", "0-00:10"),
)


def _dry_run(*args: str) -> dict[str, Any]:
    result = invoke("submit", "--dry-run", "--json", *args)
    assert result.exit_code == 0, result.stderr
    spec: dict[str, Any] = json.loads(result.stdout)
    return spec


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "job.yaml").write_text(YAML)
    (tmp_path / "train.sbatch").write_text(SCRIPT)
    (tmp_path / "bin.dat").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00#SBATCH -N 1\n")
    (tmp_path / "run.sh").write_text("#SBATCH -N 2\npython train.py\n")
    (tmp_path / "typo.yaml").write_text("nodez: 2\ncommand: [true]\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_yaml_flags_and_script_give_the_same_spec(files: Path) -> None:
    from_yaml = _dry_run("job.yaml")
    from_flags = _dry_run(*FLAGS, "--", "python", "-c", "print('hi')")
    from_script = _dry_run("train.sbatch")
    assert from_yaml == from_flags
    assert from_yaml["nodes"] == 2 and from_yaml["gpus_per_node"] == 2
    assert from_yaml["time_limit_s"] == 600 and from_yaml["team"] == "ml"
    assert from_yaml["workdir"] == str(files)  # --workdir defaults to the current dir
    assert from_yaml["restart_on_failure"] is True
    assert from_yaml["checkpoint_dir"] == str(files / "ckpt")  # relative to the workdir
    assert (from_yaml["preempt_signal"], from_yaml["preempt_grace_s"]) == ("SIGUSR2", 90)
    assert from_yaml["hang_timeout_s"] == 600
    assert from_script["launcher"] == "batch" and from_script["script"] == SCRIPT
    assert from_script["command"] is None
    different = {"command", "script", "launcher"}
    assert {k: v for k, v in from_script.items() if k not in different} == {
        k: v for k, v in from_yaml.items() if k not in different
    }


def test_cli_flags_override_the_script(files: Path) -> None:
    spec = _dry_run("train.sbatch", "-N", "1", "--gres", "gpu:1", "-D", str(files / "w"))
    assert (spec["nodes"], spec["gpus_per_node"]) == (1, 1)
    assert spec["workdir"] == str(files / "w")
    assert spec["checkpoint_dir"] == str(files / "w" / "ckpt")  # the script's, in the new -D
    assert spec["name"] == "hello"
    spec = _dry_run(
        *("train.sbatch", "--no-restart-on-failure", "--preempt-signal", "TERM"),
        *("--preempt-grace", "0", "--hang-timeout", "0", "--checkpoint-dir", "/ck"),
    )
    assert (spec["restart_on_failure"], spec["checkpoint_dir"]) == (False, "/ck")
    assert (spec["preempt_signal"], spec["preempt_grace_s"], spec["hang_timeout_s"]) == (
        "SIGTERM",
        0,
        0,
    )


def test_json_shows_the_fault_tolerance_defaults(files: Path) -> None:
    spec = _dry_run("--", "python", "train.py")
    assert (spec["restart_on_failure"], spec["checkpoint_dir"]) == (False, None)
    assert (spec["preempt_signal"], spec["preempt_grace_s"], spec["hang_timeout_s"]) == (
        "SIGUSR1",
        None,
        None,
    )


def test_a_command_after_dashes_is_never_a_spec_file(files: Path) -> None:
    spec = _dry_run("--launcher", "node", "--", "train.sbatch", "--epochs", "3")
    assert spec["command"] == ["train.sbatch", "--epochs", "3"]
    assert spec["launcher"] == "node" and spec["script"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--dry-run",), "error: nothing to submit"),
        (("--dry-run", "missing.sbatch"), "error: missing.sbatch: no such file"),
        (("--dry-run", "-N", "two", "--", "true"), "error: --nodes=two"),
        (("--dry-run", "job.yaml", "-N", "3"), "error: --nodes: set these in job.yaml"),
        (("--dry-run", "job.yaml", "--", "ls"), "error: give either a spec file"),
        (("--dry-run", "--"), "error: no command after --"),
        (
            ("--dry-run", "--preempt-signal", "NOPE", "--", "true"),
            "error: --preempt-signal=NOPE: unknown signal 'NOPE'",
        ),
        (
            ("--dry-run", "--preempt-signal", "KILL", "--", "true"),
            "error: --preempt-signal=KILL: SIGKILL cannot be caught",
        ),
        (
            ("--dry-run", "--preempt-grace", "soon", "--", "true"),
            "error: --preempt-grace=soon: invalid duration",
        ),
        (
            ("--dry-run", "--hang-timeout", "8-00:00:00", "--", "true"),
            "error: --hang-timeout=8-00:00:00: at most 604800 seconds",
        ),
        (
            ("--dry-run", "--checkpoint-dir", "", "--", "true"),
            "error: --checkpoint-dir: the directory is empty",
        ),
        (
            ("--dry-run", "train.sbatch", "--hang-timeout", "forever"),
            "error: train.sbatch: --hang-timeout=forever: invalid duration",
        ),
        (
            ("--dry-run", "job.yaml", "--no-restart-on-failure"),
            "error: --restart-on-failure: set these in job.yaml",
        ),
        # As sbatch: a batch script starts with #! (review minor 1).
        (("--dry-run", "bin.dat"), "error: bin.dat: a binary file, not a batch script; "),
        (
            ("--dry-run", "run.sh"),
            "error: run.sh: not a batch script: its first line ('#SBATCH -N 2') must start "
            "with #! and an interpreter, e.g. #!/bin/bash",
        ),
        # Plain words, not pydantic's (review minor 4); too large is said so (minor 10).
        (
            ("--dry-run", "-J", "x" * 5000, "--", "true"),
            "error: -J/--job-name: too long: 5000 characters, at most 200\n",
        ),
        (
            ("--dry-run", "-t", "99999999999", "--", "true"),
            "error: time limit '99999999999' is too large (max 24855-03:14:07, about 68 years)",
        ),
        (
            ("--dry-run", "typo.yaml"),
            "error: typo.yaml: unknown key(s) in the YAML job file: nodez (did you mean nodes?)",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(files: Path, args: tuple[str, ...], message: str) -> None:
    result = invoke("submit", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_yaml_as_a_real_process_has_no_traceback(files: Path) -> None:
    (files / "bad.yaml").write_text("nodes: [1, 2\n")
    proc = run_cli("submit", "--dry-run", "bad.yaml", cwd=files)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: bad.yaml: ")
    assert "Traceback" not in proc.stderr and proc.stdout == ""
