"""`sbatch` and `phalanx slurm-shims` against a real local cluster, through the scripts the
installer writes: what submitit, dask-jobqueue, Nextflow and Snakemake pass, with the
output Slurm 22.05 prints (man sbatch: `Submitted batch job N`; `N` with --parsable) and
its error wording; hostile input gives a clean error, never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from phalanx.cli.slurmshims import MARKER
from phalanx.slurmcli import TOOLS
from tests.slurmcli.shimrun import (  # noqa: F401 - the fixtures
    Slurm,
    clean_env,
    cluster_fixture,
    shim_dir_fixture,
    slurm_fixture,
    write,
)

SUBMITTED = re.compile(r"Submitted batch job (\d+)\n")


def _id(out: str) -> int:
    match = SUBMITTED.fullmatch(out)
    assert match is not None, out
    return int(match[1])


def test_installer_writes_every_tool_and_never_shadows_a_real_slurm(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    write(real / "squeue", "#!/bin/sh\necho real\n").chmod(0o755)
    target = tmp_path / "shims"
    env = {**clean_env(), "PATH": f"{real}:/usr/bin:/bin"}

    def install(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "phalanx", "slurm-shims", str(target), *extra],
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )

    refused = install()
    if refused.returncode == 0:  # no real Slurm elsewhere on PATH: only ours is seen
        raise AssertionError(refused.stdout)
    assert refused.returncode == 2
    assert f"squeue ({real / 'squeue'})" in refused.stderr and "--force" in refused.stderr
    assert not target.exists()

    forced = install("--force")
    assert forced.returncode == 0, forced.stderr
    assert f"export PATH={target}:$PATH" in forced.stdout
    for tool in TOOLS:
        path = target / tool
        assert os.access(path, os.X_OK) and MARKER in path.read_text()
    # Installed shims are no "real Slurm" for the next run (PATH holding them elsewhere).
    again = subprocess.run(
        [sys.executable, "-m", "phalanx", "slurm-shims", str(tmp_path / "other")],
        capture_output=True,
        text=True,
        check=False,
        env={**clean_env(), "PATH": f"{target}:{tmp_path / 'nothing'}"},
    )
    assert again.returncode == 0, again.stderr
    help_text = install("--help").stdout
    assert "PATH" in help_text


def test_script_file_directives_and_command_line_overrides(slurm: Slurm) -> None:
    write(
        slurm.workdir / "job.sh",
        "#!/bin/bash\n"
        "#SBATCH --job-name=fromscript -t 10 --comment='a # b' # trailing comment\n"
        "#SBATCH --wckey=submitit --open-mode=append --export=ALL --requeue\n"
        "#SBATCH -o out-%x-%j.txt\n"
        "echo args=$1,$2 job=$SLURM_JOB_ID name=$SLURM_JOB_NAME pwd=$(pwd)\n",
    )
    done = slurm("sbatch -J fromcli --time=00:20:00 job.sh 'one two' three")
    assert done.stderr == ""  # harmless options are taken silently, as Slurm does
    job_id = _id(done.stdout)
    job = slurm.wait(job_id)
    assert (job.state, job.name, job.time_limit_s) == ("CD", "fromcli", 1200)
    assert job.workdir == str(slurm.workdir)  # the submit directory
    text = (slurm.workdir / f"out-fromcli-{job_id}.txt").read_text()
    assert text == f"args=one two,three job={job_id} name=fromcli pwd={slurm.workdir}\n"


def test_stdin_dev_stdin_wrap_and_default_output(slurm: Slurm) -> None:
    script = b"#!/bin/sh\n#SBATCH -J piped\necho from-stdin $SLURM_JOB_NAME\n"
    piped = _id(slurm("sbatch", stdin=script).stdout)
    named = _id(slurm("sbatch /dev/stdin", stdin=script).stdout)
    wrapped = slurm("sbatch --parsable --wrap='echo wrapped >&2; exit 3' -W")
    assert wrapped.returncode == 3  # --wait: the job's exit code
    wrap_id = int(wrapped.stdout)
    assert wrapped.stdout == f"{wrap_id}\n"
    for job_id in (piped, named):
        assert slurm.wait(job_id).state == "CD"
        assert (slurm.workdir / f"slurm-{job_id}.out").read_text() == "from-stdin piped\n"
    assert slurm.job(wrap_id).name == "wrap"
    assert (slurm.workdir / f"slurm-{wrap_id}.out").read_text() == "wrapped\n"
    # A script from stdin without -J is named "sbatch", as in Slurm.
    anonymous = _id(slurm("sbatch", stdin=b"#!/bin/sh\ntrue\n").stdout)
    assert slurm.job(anonymous).name == "sbatch"


def test_arrays_limits_patterns_chdir_signal_and_hold(slurm: Slurm) -> None:
    (slurm.workdir / "sub").mkdir()
    write(
        slurm.workdir / "arr.sh",
        "#!/bin/sh\n#SBATCH --array=1-7:3%2 -o %A_%a.out -e %x.%J.err\n"
        'echo "$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT '
        '$SLURM_ARRAY_TASK_MIN $SLURM_ARRAY_TASK_MAX $SLURM_ARRAY_TASK_STEP"\n'
        "echo oops >&2\n",
    )
    array = _id(slurm("sbatch -D sub --signal=B:USR1@30 arr.sh").stdout)
    tasks = [slurm.job(f"{array}_{index}") for index in (1, 4, 7)]
    assert [t.id for t in tasks] == [array, array + 1, array + 2]
    detail = slurm.client.job(array)
    assert detail.spec.array is not None and detail.spec.array.max_parallel == 2
    assert detail.spec.signal is not None
    assert (detail.spec.signal.signal, detail.spec.signal.seconds_before) == ("SIGUSR1", 30)
    assert detail.spec.signal.batch_only
    for task in tasks:
        assert slurm.wait(task.id).state == "CD"
        out = (slurm.workdir / "sub" / f"{array}_{task.array_task_id}.out").read_text()
        assert out == f"{array} {task.array_task_id} 3 1 7 3\n"
        assert (slurm.workdir / "sub" / f"arr.sh.{task.id}.err").read_text() == "oops\n"

    held = _id(slurm("sbatch -H --wrap=true").stdout)
    job = slurm.job(held)
    assert (job.state, job.reason) == ("PD", "JobHeldUser")  # held from the submit on
    assert slurm(f"scontrol release {held}").returncode == 0
    assert slurm.wait(held).state == "CD"


def test_input_variables_sit_between_script_and_command_line(slurm: Slurm) -> None:
    write(slurm.workdir / "v.sh", "#!/bin/sh\n#SBATCH -J script -t 5 -p default\ntrue\n")
    env = {"SBATCH_JOB_NAME": "fromenv", "SBATCH_TIMELIMIT": "7", "SBATCH_WAIT": "1"}
    job = slurm.job(_id(slurm("sbatch -t 9 v.sh", env=env).stdout))
    assert (job.name, job.time_limit_s) == ("fromenv", 540)


def test_slurm_errors_in_slurms_words(slurm: Slurm) -> None:
    cases = {
        "sbatch missing.sh": "sbatch: error: Unable to open file missing.sh\n",
        "sbatch --frobnicate x.sh": (
            "sbatch: unrecognized option '--frobnicate'\n"
            'Try "sbatch --help" for more information\n'
        ),
        "sbatch -N two --wrap=true": "sbatch: error: --nodes=two: expected a whole number\n",
        "sbatch --wrap=true extra": (
            "sbatch: error: Script arguments not permitted with --wrap option\n"
        ),
        "sbatch -N1 : -N2 --wrap=true": "sbatch: error: heterogeneous jobs",
        "sbatch --dependency=singleton --wrap=true": "'singleton' dependencies are not supported",
        "sbatch --array=0-20000000 --wrap=true": "--array=0-20000000: indices must be at most",
        "sbatch -p nosuchteam --wrap=true": "sbatch: error: Batch job submission failed: ",
    }
    for command, expected in cases.items():
        done = slurm(command)
        assert done.returncode == 1, command
        assert done.stdout == ""
        assert done.stderr.startswith(expected) or expected in done.stderr, (command, done.stderr)
        assert "Traceback" not in done.stderr


def test_hostile_scripts_are_refused_cleanly(slurm: Slurm) -> None:
    not_batch = (
        "sbatch: error: This does not look like a batch script.  The first\n"
        "sbatch: error: line must start with #! followed by the path to an interpreter.\n"
        "sbatch: error: For instance: #!/bin/sh\n"
    )
    binary = bytes(range(256)) * 64
    huge = b"#!/bin/sh\n" + b"# padding padding padding\n" * 60_000
    cases: dict[bytes, str] = {
        b"": "sbatch: error: Batch script is empty!\n",
        b"  \n\n": "sbatch: error: Batch script contains only whitespace!\n",
        b"echo no shebang\n": not_batch,
        binary: not_batch,
        b"#!/bin/sh\necho \x00\n": "sbatch: error: The Slurm controller does not allow scripts",
        b"#!/bin/sh\r\necho dos\r\n": "sbatch: error: Batch script contains DOS line breaks",
        b"#!/bin/sh\necho \xff\xfe\n": "sbatch: error: Batch script is not UTF-8 text",
        huge: "sbatch: error: Batch job submission failed: Pathname of a file, directory",
        b"#!/bin/sh\n#SBATCH -J 'unclosed\ntrue\n": "cannot read #SBATCH line",
    }
    for script, expected in cases.items():
        done = slurm("sbatch", stdin=script)
        assert (done.returncode, done.stdout) == (1, ""), script[:40]
        assert done.stderr.startswith(expected) or expected in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    # Script arguments need a shell: a Python batch script cannot take them on Phalanx.
    write(slurm.workdir / "p.py", "#!/usr/bin/env python3\nprint(1)\n")
    refused = slurm("sbatch p.py arg")
    assert refused.returncode == 1 and "need a shell script" in refused.stderr


def test_version_help_test_only_and_quiet(slurm: Slurm) -> None:
    assert slurm("sbatch --version").stdout.startswith("slurm 22.05")
    assert "--parsable" in slurm("sbatch --help").stdout
    checked = slurm("sbatch --test-only --wrap=true")
    assert checked.returncode == 0 and checked.stdout == "" and "test only" in checked.stderr
    assert slurm.client.jobs(active=True).jobs == []
    noisy = slurm("sbatch --mem-per-cpu=1G --wrap=true")
    assert "sbatch: warning: --mem-per-cpu is not supported by Phalanx; ignored" in noisy.stderr
    quiet = slurm("sbatch -Q --mem-per-cpu=1G --wrap=true")
    assert quiet.stderr == "" and SUBMITTED.fullmatch(quiet.stdout)
