"""`scontrol show job|node|partition|config` records, laid out as Slurm 22.05 prints them
(key=value pairs, a record's first line flush left and the rest indented three blanks)."""

from __future__ import annotations

import grp
import pwd
import sys
import time

from phalanx.api.models import MAX_ARRAY_TASKS, JobInfo, JobSpec, NodeInfo
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.jobspec import expand_pattern, hostlist
from phalanx.slurmcli.common import SlurmError

# Phalanx's job states → Slurm's words (man squeue, JOB STATE CODES).
STATE_NAMES = {
    "PD": "PENDING", "R": "RUNNING", "CG": "COMPLETING", "CD": "COMPLETED", "F": "FAILED",
    "CA": "CANCELLED", "TO": "TIMEOUT", "NF": "NODE_FAIL", "OOM": "OUT_OF_MEMORY",
    "PR": "PREEMPTED",
}  # fmt: skip
MIN_JOB_AGE_S = 300  # ended jobs `show job` still lists (Slurm's MinJobAge default)


Record = list[list[tuple[str, str]]]  # lines of key=value pairs


def layout(record: Record, oneliner: bool) -> str:
    lines = [" ".join(f"{key}={value}" for key, value in line) for line in record]
    return " ".join(lines) if oneliner else "\n   ".join(lines)


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "Unknown"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp))


def duration(seconds: float | None) -> str:
    """Slurm's `[D-]HH:MM:SS`; None is UNLIMITED."""
    if seconds is None:
        return "UNLIMITED"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _uid(user: str) -> str:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return f"{user}"
    return f"{user}({entry.pw_uid})"


def _gid(user: str) -> str:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return user
    try:
        return f"{grp.getgrgid(entry.pw_gid).gr_name}({entry.pw_gid})"
    except KeyError:
        return f"{user}({entry.pw_gid})"


def job_records(client: PhalanxClient, ref: str | None) -> list[Record] | None:
    """Each job `ref` names (an array's id: every task), or every visible job that is
    live or ended in the last MIN_JOB_AGE_S seconds; None after printing Slurm's error."""
    if ref is None:
        live = client.jobs(active=True).jobs
        recent = client.jobs(ended=True, since=time.time() - MIN_JOB_AGE_S).jobs
        jobs = sorted({job.id: job for job in [*live, *recent]}.values(), key=lambda j: j.id)
        if not jobs:
            print("No jobs in the system")
        return [job_record(job, None) for job in jobs]
    try:
        detail = client.job(ref)
    except ApiError as exc:
        if exc.status in (404, 422):
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return None
        raise SlurmError(str(exc)) from exc
    job = detail.job
    if job.array_job_id == job.id and "_" not in ref:
        tasks = client.jobs(array=job.id).jobs
        return [job_record(task, detail.spec) for task in sorted(tasks, key=lambda t: t.id)]
    return [job_record(job, detail.spec)]


def job_record(job: JobInfo, spec: JobSpec | None) -> Record:
    """One job as `scontrol show job` lays it out (Slurm 22.05's keys and order)."""
    nodes = [p.node for p in job.placement]
    unique_nodes = list(dict.fromkeys(nodes))
    tasks_per_node = (spec.ntasks_per_node if spec else None) or (
        job.gpus_per_node if job.launcher == "torchrun" else 1
    )
    cpus_per_task = (spec.cpus_per_task if spec else None) or 1
    ntasks = job.nodes * tasks_per_node
    cpus = ntasks * cpus_per_task
    mem = spec.mem_mb if spec and spec.mem_mb else 0
    gpus = job.nodes * job.gpus_per_node
    first: list[tuple[str, str]] = [("JobId", str(job.id))]
    if job.array_job_id is not None and job.array_task_id is not None:
        first += [("ArrayJobId", str(job.array_job_id)), ("ArrayTaskId", str(job.array_task_id))]
    first.append(("JobName", job.name))
    run_time = job.run_time_s
    if run_time is None and job.start_time is not None:
        run_time = (job.end_time or time.time()) - job.start_time
    deps = "(null)"
    if spec and spec.dependencies:
        joiner = "?" if spec.dependency_any else ","
        deps = joiner.join(
            f"{d.type}:" + ":".join(str(i) for i in d.job_ids) for d in spec.dependencies
        )
    exit_code = job.exit_code or "0:0"
    nodelist = hostlist.compress(unique_nodes) if unique_nodes else "(null)"

    def path(pattern: str | None) -> str:
        if pattern is None:
            return "(null)" if spec is None else f"{job.workdir}/slurm-{job.id}.out"
        name = expand_pattern(
            pattern,
            job_id=job.id,
            name=job.name,
            task=0,
            node=unique_nodes[0] if unique_nodes else "",
            user=job.user,
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
        )
        return name if name.startswith("/") else f"{job.workdir}/{name}"

    out = path(spec.output) if spec else "(null)"
    err = path(spec.error) if spec and spec.error else out
    record: Record = [
        first,
        [("UserId", _uid(job.user)), ("GroupId", _gid(job.user)), ("MCS_label", "N/A")],
        [
            ("Priority", str(job.priority)),
            ("Nice", "0"),
            ("Account", job.account or "(null)"),
            ("QOS", job.qos),
        ],
        [
            ("JobState", STATE_NAMES.get(job.state, job.state)),
            ("Reason", job.reason or "None"),
            ("Dependency", deps),
        ],
        [
            ("Requeue", "1" if spec is None or spec.requeue else "0"),
            ("Restarts", str(job.restart_count)),
            ("BatchFlag", "1" if job.launcher == "batch" else "0"),
            ("Reboot", "0"),
            ("ExitCode", exit_code),
        ],
        [
            ("RunTime", duration(run_time or 0)),
            ("TimeLimit", duration(job.time_limit_s)),
            ("TimeMin", "N/A"),
        ],
        [
            ("SubmitTime", _when(job.submit_time)),
            ("EligibleTime", _when(job.begin_time or job.submit_time)),
        ],
        [("AccrueTime", _when(job.submit_time))],
        [
            ("StartTime", _when(job.start_time)),
            ("EndTime", _when(job.end_time)),
            ("Deadline", "N/A"),
        ],
        [
            ("SuspendTime", "None"),
            ("SecsPreSuspend", "0"),
            ("LastSchedEval", _when(job.submit_time)),
        ],
        [("Partition", job.team), ("AllocNode:Sid", "(null):0")],
        [
            (
                "ReqNodeList",
                hostlist.compress(spec.nodelist) if spec and spec.nodelist else "(null)",
            ),
            (
                "ExcNodeList",
                hostlist.compress(spec.exclude_nodes) if spec and spec.exclude_nodes else "(null)",
            ),
        ],
        [("NodeList", nodelist)],
    ]
    if unique_nodes:
        record.append([("BatchHost", unique_nodes[0])])
    record += [
        [
            ("NumNodes", str(job.nodes)),
            ("NumCPUs", str(cpus)),
            ("NumTasks", str(ntasks)),
            ("CPUs/Task", str(cpus_per_task)),
            ("ReqB:S:C:T", "0:0:*:*"),
        ],
        [("TRES", tres(cpus, mem * job.nodes, job.nodes, gpus))],
        [
            ("Socks/Node", "*"),
            ("NtasksPerN:B:S:C", f"{tasks_per_node}:0:*:*"),
            ("CoreSpec", "*"),
        ],
        [
            ("MinCPUsNode", str(cpus_per_task)),
            ("MinMemoryNode", f"{mem}M" if mem else "0"),
            ("MinTmpDiskNode", "0"),
        ],
        [
            ("Features", (spec.gpu_model if spec else None) or "(null)"),
            ("DelayBoot", "00:00:00"),
        ],
        [
            ("OverSubscribe", "NO" if spec and spec.exclusive else "OK"),
            ("Contiguous", "0"),
            ("Licenses", "(null)"),
            ("Network", "(null)"),
        ],
        [("Command", _command(spec))],
        [("WorkDir", job.workdir)],
        [("StdErr", err)],
        [("StdIn", "/dev/null")],
        [("StdOut", out)],
        [("Power", "")],
        [("TresPerNode", f"gres:gpu:{job.gpus_per_node}")],
    ]
    return record


def tres(cpus: int, mem_mb: int, nodes: int, gpus: int) -> str:
    """Slurm's TRES string: `cpu=4,mem=8G,node=2,billing=4,gres/gpu=4`."""
    parts = [f"cpu={cpus}"]
    if mem_mb:
        parts.append(f"mem={mem_mb // 1024}G" if mem_mb % 1024 == 0 else f"mem={mem_mb}M")
    parts += [f"node={nodes}", f"billing={cpus}", f"gres/gpu={gpus}"]
    return ",".join(parts)


def _command(spec: JobSpec | None) -> str:
    if spec is None:
        return "(null)"
    if spec.command:
        return " ".join(spec.command)
    return f"{spec.workdir}/{spec.name}" if spec.script is not None else "(null)"


def node_state(node: NodeInfo) -> str:
    """Slurm's node state words: IDLE, MIXED, ALLOCATED, DOWN*, with +DRAIN when drained."""
    if node.state == "down":
        return "DOWN*"
    total = len(node.gpus)
    if node.gpus_used == 0 and not node.jobs:
        base = "IDLE"
    elif total and node.gpus_used >= total:
        base = "ALLOCATED"
    else:
        base = "MIXED"
    return f"{base}+DRAIN" if node.state in ("drain", "draining") else base


def gres(node: NodeInfo) -> str:
    """`gpu:h100:8` (the model in lower case, blanks as `_`), or `(null)` without GPUs."""
    if not node.gpus:
        return "(null)"
    models = {g.model for g in node.gpus}
    if len(models) == 1:
        model = next(iter(models)).lower().replace(" ", "_")
        return f"gpu:{model}:{len(node.gpus)}"
    return f"gpu:{len(node.gpus)}"


def node_records(client: PhalanxClient, name: str | None) -> list[Record] | None:
    nodes = client.nodes().nodes
    if name is not None:
        wanted = set(hostlist.expand(name)) if "[" in name or "," in name else {name}
        nodes = [node for node in nodes if node.name in wanted]
        if not nodes:
            print(f"Node {name} not found", file=sys.stderr)
            return None
    teams = ",".join(team.name for team in client.teams().teams) or "(null)"
    return [_node_record(node, teams) for node in sorted(nodes, key=lambda n: n.name)]


def _node_record(node: NodeInfo, partitions: str) -> Record:
    gpus = len(node.gpus)
    record: Record = [
        [("NodeName", node.name), ("Arch", "x86_64"), ("CoresPerSocket", "1")],
        [
            ("CPUAlloc", "0"),
            ("CPUEfctv", str(node.cpus)),
            ("CPUTot", str(node.cpus)),
            ("CPULoad", "N/A"),
        ],
        [("AvailableFeatures", _features(node))],
        [("ActiveFeatures", _features(node))],
        [("Gres", gres(node))],
        [("NodeAddr", node.address), ("NodeHostName", node.name), ("Version", "22.05")],
        [
            ("RealMemory", str(node.memory_mb)),
            ("AllocMem", "0"),
            ("FreeMem", "N/A"),
            ("Sockets", "1"),
            ("Boards", "1"),
        ],
        [
            ("State", node_state(node)),
            ("ThreadsPerCore", "1"),
            ("TmpDisk", "0"),
            ("Weight", "1"),
            ("Owner", "N/A"),
            ("MCS_label", "N/A"),
        ],
        [("Partitions", partitions)],
        [("BootTime", "None"), ("SlurmdStartTime", "None")],
        [("LastBusyTime", _when(node.last_heartbeat) if node.jobs else "None")],
        [("CfgTRES", f"cpu={node.cpus},mem={node.memory_mb}M,billing={node.cpus},gres/gpu={gpus}")],
        [("AllocTRES", f"gres/gpu={node.gpus_used}" if node.gpus_used else "")],
        [("CapWatts", "n/a")],
        [("CurrentWatts", "0"), ("AveWatts", "0")],
        [("ExtSensorsJoules", "n/s"), ("ExtSensorsWatts", "0"), ("ExtSensorsTemp", "n/s")],
    ]
    if node.reason:
        record.append([("Reason", node.reason)])
    return record


def _features(node: NodeInfo) -> str:
    models = sorted({g.model.lower().replace(" ", "_") for g in node.gpus})
    return ",".join(models) or "(null)"


def partition_records(client: PhalanxClient, name: str | None) -> list[Record] | None:
    """A partition per team (teams share every node: Phalanx's quotas, not node sets,
    divide the cluster)."""
    teams = client.teams().teams
    nodes = client.nodes().nodes
    if name is not None:
        teams = [team for team in teams if team.name == name]
        if not teams:
            print(f"Partition {name} not found", file=sys.stderr)
            return None
    names = hostlist.compress([n.name for n in nodes]) if nodes else "(null)"
    cpus = sum(n.cpus for n in nodes)
    mem = sum(n.memory_mb for n in nodes)
    gpus = sum(len(n.gpus) for n in nodes)
    records = []
    for team in sorted(teams, key=lambda t: t.name):
        records.append(
            [
                [("PartitionName", team.name)],
                [("AllowGroups", "ALL"), ("AllowAccounts", "ALL"), ("AllowQos", "ALL")],
                [("AllocNodes", "ALL"), ("Default", "NO"), ("QoS", "N/A")],
                [
                    ("DefaultTime", "NONE"),
                    ("DisableRootJobs", "NO"),
                    ("ExclusiveUser", "NO"),
                    ("GraceTime", "0"),
                    ("Hidden", "NO"),
                ],
                [
                    ("MaxNodes", "UNLIMITED"),
                    ("MaxTime", "UNLIMITED"),
                    ("MinNodes", "0"),
                    ("LLN", "NO"),
                    ("MaxCPUsPerNode", "UNLIMITED"),
                ],
                [("Nodes", names)],
                [
                    ("PriorityJobFactor", "1"),
                    ("PriorityTier", "1"),
                    ("RootOnly", "NO"),
                    ("ReqResv", "NO"),
                    ("OverSubscribe", "NO"),
                ],
                [("OverTimeLimit", "NONE"), ("PreemptMode", "REQUEUE")],
                [
                    ("State", "UP"),
                    ("TotalCPUs", str(cpus)),
                    ("TotalNodes", str(len(nodes))),
                    ("SelectTypeParameters", "NONE"),
                ],
                [("JobDefaults", "(null)")],
                [("DefMemPerNode", "UNLIMITED"), ("MaxMemPerNode", "UNLIMITED")],
                [("TRES", tres(cpus, mem, len(nodes), gpus))],
                [("TRESBillingWeights", "(null)")],
            ]
        )
    return records


def config(client: PhalanxClient) -> str:
    """A useful subset of `scontrol show config`: what tools read to learn the cluster."""
    health = client.health()
    rows = [
        ("AccountingStorageType", "accounting_storage/phalanx"),
        ("ClusterName", "phalanx"),
        ("GresTypes", "gpu"),
        ("JobRequeue", "1"),
        # Indices up to MaxArraySize-1 and as many tasks: Phalanx's bound on the count.
        ("MaxArraySize", str(MAX_ARRAY_TASKS + 1)),
        ("MinJobAge", f"{MIN_JOB_AGE_S} sec"),
        ("PreemptMode", "REQUEUE"),
        ("PreemptType", "preempt/phalanx"),
        ("PriorityType", "priority/multifactor"),
        ("ReturnToService", "2"),
        ("SchedulerType", "sched/phalanx"),
        ("SelectType", "select/phalanx"),
        ("SLURM_VERSION", "22.05"),
        ("SlurmctldHost[0]", client.url),
        ("PhalanxVersion", health.version),
    ]
    lines = [f"Configuration data as of {_when(time.time())}"]
    lines += [f"{key:<23} = {value}" for key, value in rows]
    lines += [
        "",
        f"Slurmctld(primary) at {client.url} is {'UP' if health.status == 'ok' else 'DOWN'}",
    ]
    return "\n".join(lines)
