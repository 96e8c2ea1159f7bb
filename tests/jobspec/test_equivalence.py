"""One job written three ways (YAML, flags, #SBATCH) gives one JobSpec; CLI beats script."""

from __future__ import annotations

import json
import textwrap

import pytest

from phalanx.jobspec import (
    JobSpecError,
    SubmitOptions,
    build_spec,
    load_yaml,
    merge,
    parse_sbatch,
)

ENV = {"HOME": "/home/ada", "PATH": "/usr/bin", "HF_TOKEN": "x", "SLURM_JOB_ID": "4"}
CWD = "/home/ada/proj"

SCRIPT = """\
#!/bin/bash
#SBATCH -J llama-pretrain
#SBATCH --nodes=2 --ntasks-per-node=1
#SBATCH --gres=gpu:h100:8
#SBATCH -c 32 --mem=256G
#SBATCH -t 2-00:00:00
#SBATCH -p research -q high -A llm
#SBATCH -o logs/%x-%j.out -e logs/%x-%j.err
#SBATCH -d afterok:11:12
#SBATCH --array=0-3%2
#SBATCH --no-requeue
#SBATCH --signal=B:USR1@120
#SBATCH --exclusive
#SBATCH -D runs
#SBATCH --export=ALL,EXTRA=1
#SBATCH -x 127.0.0.[5-6]
#SBATCH --max-restarts=5
#SBATCH --restart-on-failure --checkpoint-dir=ckpt
#SBATCH --preempt-signal=USR2 --preempt-grace=2:00 --hang-timeout=0:15:00

srun python train.py
"""

YAML = """\
name: llama-pretrain
nodes: 2
ntasks-per-node: 1
gpus_per_node: 8
gpu_model: h100
cpus_per_task: 32
mem_mb: 262144
time_limit_s: 172800
team: research
qos: high
account: llm
output: logs/%x-%j.out
error: logs/%x-%j.err
dependencies:
  - {type: afterok, job_ids: [11, 12]}
array: {indices: [0, 1, 2, 3], max_parallel: 2}
requeue: false
signal: {signal: SIGUSR1, seconds_before: 120, batch_only: true}
exclusive: true
workdir: runs
export: ALL
env: {EXTRA: "1"}
exclude_nodes: [127.0.0.5, 127.0.0.6]
max_restarts: 5
restart_on_failure: true
checkpoint_dir: /home/ada/proj/runs/ckpt
preempt_signal: SIGUSR2
preempt_grace_s: 120
hang_timeout: 900
script: |
""" + textwrap.indent(SCRIPT, "  ")

FLAGS = SubmitOptions(
    job_name="llama-pretrain",
    nodes="2",
    ntasks="2",
    gpus="h100:16",
    cpus_per_task="32",
    mem="262144",
    time="48:00:00",
    partition="research",
    qos="high",
    account="llm",
    output="logs/%x-%j.out",
    error="logs/%x-%j.err",
    dependency="afterok:11:12",
    array="0,1,2-3%2",
    requeue=False,
    signal="B:SIGUSR1@120",
    exclusive=True,
    workdir="/home/ada/proj/runs",
    export="ALL,EXTRA=1",
    exclude="127.0.0.5,127.0.0.6",
    max_restarts="5",
    restart_on_failure=True,
    checkpoint_dir="../runs/./ckpt/",
    preempt_signal="sigusr2",
    preempt_grace="120",
    hang_timeout="15:00",
)


def test_yaml_flags_and_sbatch_give_the_same_spec() -> None:
    opts, warnings = parse_sbatch(SCRIPT)
    assert warnings == []
    from_sbatch, _ = build_spec(opts, command=None, script=SCRIPT, cwd=CWD, environ=ENV)
    from_flags, _ = build_spec(FLAGS, command=None, script=SCRIPT, cwd=CWD, environ=ENV)
    from_yaml, _ = load_yaml(YAML, cwd=CWD, environ=ENV)
    assert from_yaml == from_sbatch == from_flags
    assert from_sbatch.gpus_per_node == 8 and from_sbatch.gpu_model == "h100"
    assert from_sbatch.env == {"HOME": "/home/ada", "PATH": "/usr/bin", "EXTRA": "1"}
    assert from_sbatch.workdir == "/home/ada/proj/runs"
    assert (from_sbatch.restart_on_failure, from_sbatch.checkpoint_dir) == (
        True,
        "/home/ada/proj/runs/ckpt",  # relative to the job's workdir (-D runs)
    )
    assert (from_sbatch.preempt_signal, from_sbatch.preempt_grace_s) == ("SIGUSR2", 120)
    assert from_sbatch.hang_timeout_s == 900


def test_command_jobs_agree_between_yaml_and_flags() -> None:
    yaml_text = """\
command: torchrun --nproc-per-node 8 train.py --lr "3e-4"
nodes: 4
gres: gpu:8
time: "1:30:00"
mem: 64G
export: NONE
"""
    from_yaml, _ = load_yaml(yaml_text, cwd=CWD, environ=ENV)
    flags = SubmitOptions(
        nodes="4", gpus_per_node="8", time="90", mem="64G", export="NONE", job_name="torchrun"
    )
    argv = ["torchrun", "--nproc-per-node", "8", "train.py", "--lr", "3e-4"]
    from_flags, _ = build_spec(flags, command=argv, script=None, cwd=CWD, environ=ENV)
    assert from_yaml == from_flags
    assert from_yaml.launcher == "torchrun" and from_yaml.time_limit_s == 5400


def test_cli_overrides_script() -> None:
    opts, _ = parse_sbatch(SCRIPT)
    cli = SubmitOptions(
        nodes="4",
        gpus_per_node="4",
        time="30",
        requeue=True,
        job_name="short",
        restart_on_failure=False,
        checkpoint_dir="/fast/ckpt",
        preempt_signal="TERM",
        hang_timeout="0",
    )
    merged = merge(opts, cli)
    spec, _ = build_spec(merged, command=None, script=SCRIPT, cwd=CWD, environ=ENV)
    assert (spec.name, spec.nodes, spec.time_limit_s, spec.requeue) == ("short", 4, 1800, True)
    assert (spec.restart_on_failure, spec.checkpoint_dir) == (False, "/fast/ckpt")
    assert (spec.preempt_signal, spec.hang_timeout_s) == ("SIGTERM", 0)
    assert spec.preempt_grace_s == 120  # not given on the command line: the script's
    # The CLI's GPU option replaces the script's --gres (type included), not conflicts.
    assert (spec.gpus_per_node, spec.gpu_model) == (4, None)
    assert spec.team == "research" and spec.cpus_per_task == 32  # the rest stays
    assert opts.nodes == "2" and opts.gres == "gpu:h100:8"  # inputs are not changed


def test_cli_task_options_replace_the_scripts_together() -> None:
    script = SubmitOptions(ntasks="2", nodes="2", gpus_per_task="8")
    merged = merge(script, SubmitOptions(ntasks_per_node="8", gpus_per_node="8"))
    assert (merged.ntasks, merged.ntasks_per_node, merged.gpus_per_task) == (None, "8", None)
    spec, _ = build_spec(merged, command=["t"], script=None, cwd=CWD, environ={})
    assert (spec.nodes, spec.ntasks_per_node, spec.gpus_per_node) == (2, 8, 8)


def test_merge_keeps_script_values_the_cli_does_not_give() -> None:
    script = SubmitOptions(requeue=False, exclusive=True, qos="high")
    assert merge(script, SubmitOptions()) == script
    assert merge(script, SubmitOptions(requeue=True)).requeue is True


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("preempt_signal", "NOPE", "--preempt-signal=NOPE: unknown signal 'NOPE'"),
        ("preempt_signal", "STOP", "--preempt-signal=STOP: SIGSTOP cannot be caught"),
        ("preempt_grace", "soon", "--preempt-grace=soon: invalid duration"),
        ("preempt_grace", "1-00:00:01", "--preempt-grace=1-00:00:01: at most 86400 seconds"),
        ("hang_timeout", "1h", "--hang-timeout=1h: invalid duration"),
        ("checkpoint_dir", "~/c", "--checkpoint-dir=~/c: '~' is not expanded here"),
    ],
)
def test_a_bad_value_gives_one_error_from_every_source(
    field: str, value: str, message: str
) -> None:
    script = f"#!/bin/sh\n#SBATCH --{field.replace('_', '-')}={value}\nrun\n"
    yaml_text = f"command: run\n{field}: {json.dumps(value)}\n"
    errors = []
    with pytest.raises(JobSpecError) as err:
        opts, _ = parse_sbatch(script)
        build_spec(opts, command=None, script=script, cwd=CWD, environ=ENV)
    errors.append(str(err.value))
    with pytest.raises(JobSpecError) as err:
        flags = SubmitOptions()
        setattr(flags, field, value)
        build_spec(flags, command=["run"], script=None, cwd=CWD, environ=ENV)
    errors.append(str(err.value))
    with pytest.raises(JobSpecError) as err:
        load_yaml(yaml_text, cwd=CWD, environ=ENV)
    errors.append(str(err.value))
    assert errors[0].startswith(message)
    assert errors == [errors[0]] * 3
