"""srun's options and task layout inside an allocation (pure: argv + environment → plan)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from phalanx.api.models import StepTask
from phalanx.jobspec import JobSpecError, hostlist


class SrunError(Exception):
    """A problem the user of srun can fix; printed as `srun: error: …`."""


# Options Slurm's srun takes that make no difference here: accepted, noted on stderr.
_IGNORED_WITH_VALUE = (
    ("--gpus-per-task",),
    ("--cpu-bind",),
    ("--mpi",),
    ("--gpu-bind",),
    ("-G", "--gpus"),
    ("--gpus-per-node",),
    ("--gres",),
    ("--mem",),
    ("--mem-per-cpu",),
    ("--mem-per-gpu",),
    ("--cpus-per-gpu",),
    ("--ntasks-per-gpu",),
    ("-J", "--job-name"),
    ("-m", "--distribution"),
    ("-t", "--time"),
    ("-p", "--partition"),
    ("-A", "--account"),
    ("--hint",),
    ("--network",),
    ("--signal",),
    ("-W", "--wait"),
)
_IGNORED_FLAGS = (
    ("--exclusive",),
    ("--overlap",),
    ("-O", "--overcommit"),
    ("-Q", "--quiet"),
    ("-X", "--disable-status"),
    ("-v", "--verbose"),
)


@dataclass(frozen=True)
class SrunOptions:
    """What the user asked srun for."""

    command: list[str]
    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    nodelist: str | None = None
    label: bool = False
    kill_on_bad_exit: bool = False
    export: str | None = None
    cpus_per_task: int | None = None
    chdir: str | None = None
    output: str | None = None  # -o/--output: a Slurm filename pattern per task
    error: str | None = None  # -e/--error
    open_mode: str | None = None  # --open-mode=append|truncate
    ignored: tuple[str, ...] = ()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="srun",
        allow_abbrev=False,
        description="Run a parallel job step inside a Phalanx allocation (Slurm-compatible).",
    )
    p.add_argument("-N", "--nodes", help="nodes for the step (N or MIN-MAX: MIN is used)")
    p.add_argument("-n", "--ntasks", type=int, help="tasks in the step")
    p.add_argument("--ntasks-per-node", type=int, help="tasks on each node")
    p.add_argument("-w", "--nodelist", help="hostlist of nodes to use (within the allocation)")
    p.add_argument("-l", "--label", action="store_true", help="prefix output lines with task id")
    p.add_argument("-u", "--unbuffered", action="store_true", help="accepted (always unbuffered)")
    p.add_argument("-K", "--kill-on-bad-exit", action="store_true", help="kill on a failed task")
    p.add_argument("--export", help="ALL (default), NONE, or [ALL,]VAR[=VALUE],…")
    p.add_argument("-c", "--cpus-per-task", type=int, help="sets SLURM_CPUS_PER_TASK")
    p.add_argument("-D", "--chdir", help="working directory of the tasks")
    p.add_argument("-o", "--output", help="write each task's stdout to this file pattern")
    p.add_argument("-e", "--error", help="write each task's stderr to this file pattern")
    p.add_argument("--open-mode", help="append or truncate the -o/-e files")
    for names in _IGNORED_WITH_VALUE:
        p.add_argument(*names, dest="ignored", action=_Note, help=argparse.SUPPRESS)
    for names in _IGNORED_FLAGS:
        p.add_argument(*names, dest="ignored", action=_Note, nargs=0, help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


class _Note(argparse.Action):
    """Collect accepted-but-ignored options for a one-line note each."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        seen = list(getattr(namespace, "ignored", None) or [])
        seen.append(option_string or self.dest)
        namespace.ignored = seen


def parse_srun(argv: Sequence[str]) -> SrunOptions:
    """Parse srun's command line. `--kill-on-bad-exit=0|1` is accepted too."""
    args: list[str] = []
    for a in argv:
        if a.startswith("--kill-on-bad-exit="):
            if a.split("=", 1)[1] not in ("0", "1"):
                raise SrunError(f"{a}: expected 0 or 1")
            if a.endswith("=1"):
                args.append("--kill-on-bad-exit")
            continue
        args.append(a)
    ns = _parser().parse_args(args)
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SrunError("no command given (usage: srun [OPTIONS] [--] COMMAND [ARGS…])")
    nodes = None
    if ns.nodes is not None:
        text = str(ns.nodes).split("-", 1)[0]
        if not text.isdigit() or int(text) < 1:
            raise SrunError(f"-N/--nodes {ns.nodes!r}: expected a positive number")
        nodes = int(text)
    for flag, value in (("-n/--ntasks", ns.ntasks), ("--ntasks-per-node", ns.ntasks_per_node)):
        if value is not None and value < 1:
            raise SrunError(f"{flag} must be at least 1, got {value}")
    return SrunOptions(
        command=command,
        nodes=nodes,
        ntasks=ns.ntasks,
        ntasks_per_node=ns.ntasks_per_node,
        nodelist=ns.nodelist,
        label=ns.label,
        kill_on_bad_exit=ns.kill_on_bad_exit,
        export=ns.export,
        cpus_per_task=ns.cpus_per_task,
        chdir=ns.chdir,
        output=ns.output,
        error=ns.error,
        open_mode=ns.open_mode,
        ignored=tuple(dict.fromkeys(ns.ignored or [])),
    )


@dataclass(frozen=True)
class JobContext:
    """The allocation srun runs inside, from the job's environment."""

    job_id: int
    nodes: list[str]  # rank order
    agent_urls: list[str]  # same order
    step_token: str
    ntasks: int
    job_dir: str | None


def job_context(environ: Mapping[str, str]) -> JobContext:
    """Read the allocation from a job's environment, or explain why srun can't run here."""
    missing = [
        k
        for k in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "PHALANX_STEP_TOKEN", "PHALANX_AGENT_URLS")
        if not environ.get(k)
    ]
    if missing:
        raise SrunError(
            f"not inside a Phalanx job ({', '.join(missing)} not set); srun runs job steps "
            "inside an allocation: use it in a script submitted with `phalanx sbatch`"
        )
    try:
        if environ.get("PHALANX_NODELIST"):
            nodes = environ["PHALANX_NODELIST"].split(",")
        else:
            nodes = hostlist.expand(environ["SLURM_JOB_NODELIST"])
        job_id = int(environ["SLURM_JOB_ID"])
        ntasks = int(environ.get("SLURM_NTASKS") or len(nodes))
    except (JobSpecError, ValueError) as e:
        raise SrunError(f"the job's environment is malformed: {e}") from e
    urls = environ["PHALANX_AGENT_URLS"].split(",")
    if len(urls) != len(nodes):
        raise SrunError(f"PHALANX_AGENT_URLS has {len(urls)} entries for {len(nodes)} nodes")
    return JobContext(
        job_id=job_id,
        nodes=nodes,
        agent_urls=urls,
        step_token=environ["PHALANX_STEP_TOKEN"],
        ntasks=ntasks,
        job_dir=environ.get("PHALANX_JOB_DIR"),
    )


@dataclass(frozen=True)
class NodeTasks:
    """The tasks of a step on one node."""

    node: str
    agent_url: str
    tasks: list[StepTask]


def plan_step(opts: SrunOptions, job: JobContext, environ: Mapping[str, str]) -> list[NodeTasks]:
    """Lay the step's tasks out over the allocation: block distribution, node by node, as
    Slurm inside an allocation. Default: $SLURM_NTASKS tasks over all the job's nodes;
    `-N`/`-w` alone: one task per node."""
    index = {n: i for i, n in enumerate(job.nodes)}
    chosen: list[str] | None = None
    if opts.nodelist is not None:
        try:
            names = hostlist.expand(opts.nodelist)
        except JobSpecError as e:
            raise SrunError(f"-w/--nodelist: {e}") from e
        outside = [n for n in names if n not in index]
        if outside:
            raise SrunError(f"-w/--nodelist: {', '.join(outside)} not in this job's allocation")
        chosen = sorted(set(names), key=index.__getitem__)
        if opts.nodes is not None and opts.nodes != len(chosen):
            raise SrunError(f"-N {opts.nodes} does not match -w {opts.nodelist}")
    elif opts.nodes is not None:
        if opts.nodes > len(job.nodes):
            raise SrunError(f"-N {opts.nodes}: the allocation has only {len(job.nodes)} node(s)")
        chosen = job.nodes[: opts.nodes]
    if opts.ntasks is not None:
        ntasks = opts.ntasks
    elif opts.ntasks_per_node is not None:
        ntasks = len(chosen or job.nodes) * opts.ntasks_per_node
    elif chosen is not None:
        ntasks = len(chosen)
    else:
        ntasks = job.ntasks
    nodes = chosen if chosen is not None else job.nodes[: min(ntasks, len(job.nodes))]
    if ntasks < len(nodes):
        raise SrunError(f"{ntasks} task(s) cannot spread over {len(nodes)} nodes (-n < -N)")
    counts = _block(ntasks, len(nodes), opts.ntasks_per_node)
    env = step_environment(opts, environ, nodes, ntasks)
    argv = list(opts.command)
    out: list[NodeTasks] = []
    task_id = 0
    for node_id, (node, count) in enumerate(zip(nodes, counts, strict=True)):
        tasks = []
        for local_id in range(count):
            tasks.append(
                StepTask(task_id=task_id, local_id=local_id, node_id=node_id, argv=argv, env=env)
            )
            task_id += 1
        if tasks:
            out.append(NodeTasks(node, job.agent_urls[index[node]], tasks))
    return out


def _block(ntasks: int, nnodes: int, per_node: int | None) -> list[int]:
    """Tasks per node: up to `per_node` each in order, else as even as possible."""
    if per_node is not None:
        if ntasks > per_node * nnodes:
            raise SrunError(f"{ntasks} tasks do not fit {nnodes} node(s) × {per_node} per node")
        counts = []
        left = ntasks
        for _ in range(nnodes):
            counts.append(min(per_node, left))
            left -= counts[-1]
        return counts
    base, extra = divmod(ntasks, nnodes)
    return [base + (1 if i < extra else 0) for i in range(nnodes)]


def step_environment(
    opts: SrunOptions, environ: Mapping[str, str], nodes: list[str], ntasks: int
) -> dict[str, str]:
    """What srun forwards to every task (`--export`), plus the step-wide Slurm variables."""
    export = opts.export or "ALL"
    job_vars = {k: v for k, v in environ.items() if k.startswith(("SLURM_", "PHALANX_"))}
    items = [x for x in export.split(",") if x]
    env: dict[str, str] = {}
    if items and items[0].upper() == "NONE":
        env = dict(job_vars)
    else:
        env = dict(environ) if "ALL" in (x.upper() for x in items) else dict(job_vars)
        for item in items:
            if item.upper() == "ALL":
                continue
            name, eq, value = item.partition("=")
            if eq:
                env[name] = value
            elif name in environ:
                env[name] = environ[name]
    env["SLURM_STEP_NODELIST"] = hostlist.compress(nodes)
    env["SLURM_STEP_NUM_NODES"] = str(len(nodes))
    env["SLURM_STEP_NUM_TASKS"] = str(ntasks)
    if opts.cpus_per_task is not None:
        env["SLURM_CPUS_PER_TASK"] = str(opts.cpus_per_task)
    return env


def workdir(opts: SrunOptions) -> str:
    """The tasks' working directory: `-D`, else srun's own."""
    return os.path.abspath(opts.chdir) if opts.chdir else os.getcwd()
