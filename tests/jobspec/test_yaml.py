"""YAML job files: friendly forms, wire forms, and the errors a user sees."""

from __future__ import annotations

import pytest

from phalanx.api.models import ArraySpec, DependencySpec, JobSpec, SignalSpec
from phalanx.jobspec import JobSpecError, load_yaml


def _load(text: str) -> JobSpec:
    return load_yaml(text, cwd="/w", environ={"HOME": "/h"})[0]


def _fails(text: str) -> str:
    with pytest.raises(JobSpecError) as err:
        load_yaml(text, cwd="/w", environ={})
    return str(err.value)


def test_friendly_forms() -> None:
    spec = _load(
        """
name: pretrain
command: [python, train.py, --steps, 100]
time: 1-00:00:00
mem: 4G
gres: gpu:h100:4
dependency: afterok:12?afterany:13
array: 0-3%2
signal: USR1@90
partition: research
exclude: 127.0.0.[2-3]
chdir: sub
export: [NONE, A=1]
env: {OMP_NUM_THREADS: 4, B: two}
"""
    )
    assert spec.command == ["python", "train.py", "--steps", "100"]
    assert (spec.time_limit_s, spec.mem_mb) == (86400, 4096)
    assert (spec.gpus_per_node, spec.gpu_model) == (4, "h100")
    assert spec.dependencies == [
        DependencySpec(type="afterok", job_ids=[12]),
        DependencySpec(type="afterany", job_ids=[13]),
    ]
    assert spec.dependency_any is True
    assert spec.array == ArraySpec(indices=[0, 1, 2, 3], max_parallel=2)
    assert spec.signal == SignalSpec(signal="SIGUSR1", seconds_before=90)
    assert (spec.team, spec.workdir) == ("research", "/w/sub")
    assert spec.exclude_nodes == ["127.0.0.2", "127.0.0.3"]
    assert spec.env == {"A": "1", "OMP_NUM_THREADS": "4", "B": "two"}


@pytest.mark.parametrize(
    ("line", "seconds"),
    [
        ("time: 1:30:00", 5400),  # not YAML 1.1's base-60 number: the Slurm form
        ("time: 30:00", 1800),  # minutes:seconds
        ("time: 90", 5400),  # a bare number is minutes, as in Slurm
        ('time: "2-12"', 2 * 86400 + 12 * 3600),
        ("time_limit_s: 60", 60),
        ("time: UNLIMITED", None),
    ],
)
def test_time_keys(line: str, seconds: int | None) -> None:
    assert _load(f"command: x\n{line}\n").time_limit_s == seconds


def test_wire_forms_and_dashed_keys() -> None:
    spec = _load(
        """
command: "python -c 'print(1)'"
gpus-per-node: 2
array: [5, 1, 3]
preemptible: false
dependency_any: false
requeue: no
max-restarts: 0
"""
    )
    assert spec.command == ["python", "-c", "print(1)"]
    assert spec.gpus_per_node == 2
    assert spec.array == ArraySpec(indices=[1, 3, 5])
    assert (spec.preemptible, spec.requeue, spec.max_restarts) == (False, False, 0)


def test_fault_tolerance_keys() -> None:
    spec = _load(
        """
command: x
chdir: run
restart-on-failure: yes
checkpoint_dir: ckpt
preempt_signal: term
preempt_grace: 2:00
hang_timeout: 0
"""
    )
    assert (spec.restart_on_failure, spec.checkpoint_dir) == (True, "/w/run/ckpt")
    assert (spec.preempt_signal, spec.preempt_grace_s, spec.hang_timeout_s) == ("SIGTERM", 120, 0)
    # A number is seconds (a signal number for preempt_signal); `_s` keys take seconds only.
    spec = _load("command: x\npreempt_signal: 15\npreempt_grace: 90\nhang_timeout_s: 600\n")
    assert (spec.preempt_signal, spec.preempt_grace_s, spec.hang_timeout_s) == ("SIGTERM", 90, 600)
    spec = _load("command: x\npreempt_grace_s: 0\nrestart_on_failure: false\n")
    assert (spec.preempt_grace_s, spec.restart_on_failure) == (0, False)


def test_script_text_runs_with_the_batch_launcher() -> None:
    spec = _load("name: s\nscript: |\n  #!/bin/sh\n  echo hi\n")
    assert (spec.launcher, spec.script) == ("batch", "#!/bin/sh\necho hi\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("command: [x\nnodes: 2\n", "invalid YAML at line 2"),
        ("command: x\n  nodes: 2\n", "invalid YAML at line 2"),
        ("- command\n", "must be a mapping"),
        ("", "must be a mapping"),
        ("command: x\nnodes: 2\nnodes: 3\n", "YAML line 3: key 'nodes' is given twice"),
        (
            "command: x\ngpu: 4\nmemory: 3\n",
            "unknown key(s) in the YAML job file: gpu (did you mean gpus?), "
            "memory (did you mean mem?); allowed keys: ",
        ),
        ("command: x\nnodez: 2\n", "YAML job file: nodez (did you mean nodes?); allowed"),
        ("command: x\nfrobnicate: 2\n", "YAML job file: frobnicate; allowed keys: "),
        ("command: x\ntime: 10\ntime_limit_s: 600\n", "give only one of time and time_limit_s"),
        ("command: x\nteam: a\npartition: b\n", "give only one of partition and team"),
        ("command: x\nnodes: yes\n", "nodes: expected text or a whole number, got True"),
        ("command: x\nnodes: 1.5\n", "nodes: expected text or a whole number, got 1.5"),
        ("command: x\nrequeue: maybe\n", "requeue: expected true or false, got 'maybe'"),
        ("command: {a: 1}\n", "command: give a list of arguments or one string"),
        ('command: "it\'s"\n', "command: cannot split"),
        ("script: [a]\n", "script: give the script's text"),
        ("command: x\nenv: [A]\n", "env: give a mapping"),
        ("command: x\nenv: {A: [1]}\n", "env: the value of A must be text or a number"),
        ("command: x\nenv: {1A: b}\n", "--export / env (1A"),
        ("command: x\nmem_mb: 0\n", "--mem: must be at least 1 (got 0)"),
        ("command: x\ntime_limit_s: 1h\n", "-t/--time: must be a whole number (got '1h')"),
        ("command: x\ndependencies: [{type: before, job_ids: [1]}]\n", "-d/--dependency"),
        ("command: x\nscript: y\n", "not both"),
        ("nodes: 2\n", "give exactly one thing to run"),
        ("command: x\nrestart_on_failure: 1\n", "restart_on_failure: expected true or false"),
        ("command: x\ncheckpoint_dir: [a]\n", "checkpoint_dir: expected text"),
        ("command: x\ncheckpoint_dir: ~/c\n", "--checkpoint-dir=~/c: '~' is not expanded"),
        ("command: x\npreempt_signal: HUP@3\n", "--preempt-signal=HUP@3: unknown signal"),
        ("command: x\npreempt_signal: KILL\n", "SIGKILL cannot be caught"),
        ("command: x\npreempt_grace: 1.5\n", "preempt_grace: expected text or a whole number"),
        ("command: x\npreempt_grace: 1m\n", "--preempt-grace=1m: invalid duration"),
        ("command: x\nhang_timeout: -1\n", "--hang-timeout=-1: invalid duration"),
        ("command: x\nhang_timeout_s: 1:00\n", "--hang-timeout: must be a whole number"),
        ("command: x\npreempt_grace_s: 90000\n", "--preempt-grace: too large: at most 86400"),
        (
            "command: x\nhang_timeout: 60\nhang_timeout_s: 60\n",
            "give only one of hang_timeout and hang_timeout_s",
        ),
        (
            "command: x\npreempt_grace: 60\npreempt-grace-s: 60\n",
            "give only one of preempt_grace and preempt_grace_s",
        ),
    ],
)
def test_yaml_errors(text: str, message: str) -> None:
    assert message in _fails(text)


def test_unknown_key_error_lists_the_allowed_keys() -> None:
    message = _fails("command: x\nbogus: 1\n")
    assert "allowed keys:" in message
    for key in ("gpus_per_node", "time", "gres", "dependency", "array", "env"):
        assert key in message
