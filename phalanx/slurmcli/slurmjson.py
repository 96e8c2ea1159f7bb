"""`--json` of squeue, sacct and sinfo: Slurm 22.05's openapi shapes (squeue/sinfo:
v0.0.38's job and node dicts; sacct: dbv0.0.38's job dicts), with the fields Phalanx has.
docs/slurm.md lists the fields given; others are left out rather than made up."""

from __future__ import annotations

import signal as signals
from typing import Any

from phalanx.slurmcli.fields import Job

SLURM_VERSION = (22, 5, 8)
SLURM_RELEASE = "22.05.8"
VERSION_LINE = f"slurm {SLURM_RELEASE}"


def _meta(plugin: str) -> dict[str, Any]:
    major, minor, micro = SLURM_VERSION
    return {
        "plugin": {"type": f"openapi/{plugin}", "name": f"Slurm OpenAPI {plugin}"},
        "Slurm": {
            "version": {"major": major, "micro": micro, "minor": minor},
            "release": SLURM_RELEASE,
        },
    }


def squeue(jobs: list[Job], now: float) -> dict[str, Any]:
    """`squeue --json`: openapi v0.0.38's `jobs[]` (times in Unix seconds, time_limit in
    minutes, null where Slurm writes null)."""
    return {"meta": _meta("v0.0.38"), "errors": [], "jobs": [_squeue_job(j, now) for j in jobs]}


def _squeue_job(job: Job, now: float) -> dict[str, Any]:
    code, sig = job.exit_pair
    end = job.end_time
    if end is None and job.start_time is not None and job.time_limit_s is not None:
        end = job.start_time + job.time_limit_s  # slurmctld's expected end
    return {
        "account": job.account,
        "array_job_id": job.array_job_id or 0,
        "array_task_id": None if job.tasks else job.array_task_id,
        "array_max_tasks": job.array_max_parallel or 0,
        "array_task_string": job.task_string or "",
        "batch_flag": True,
        "cpus": job.cpus,
        "cpus_per_task": job.cpus_per_task or 1,
        "current_working_directory": job.workdir,
        "end_time": int(end or 0),
        "exit_code": (code << 8) | sig,  # a wait status, as slurmctld reports it
        "job_id": job.id,
        "job_state": job.word,
        "memory_per_node": job.mem_mb,
        "name": job.name,
        "node_count": job.nodes,
        "nodes": job.hostlist,
        "partition": job.partition,
        "priority": job.priority,
        "qos": job.qos,
        "requeue": True,
        "restart_cnt": job.restart_count,
        "start_time": int(job.start_time or 0),
        "state_description": (job.reason_message or "") if job.pending else "",
        "state_reason": job.slurm_reason(),
        "submit_time": int(job.submit_time),
        "tasks": job.ntasks,
        "tasks_per_node": job.ntasks_per_node or 0,
        "time_limit": None if job.time_limit_s is None else -(-job.time_limit_s // 60),
        "tres_req_str": tres(job),
        "tres_alloc_str": tres(job) if job.nodelist else None,
        "user_name": job.user,
    }


def tres(job: Job) -> str:
    """Slurm's TRES string for what the job asked for: cpu, mem, node, billing, gres/gpu."""
    parts = [f"cpu={job.cpus}"]
    if job.mem_mb:
        parts.append(f"mem={_mem(job.mem_mb * job.nodes)}")
    parts.append(f"node={job.nodes}")
    parts.append(f"billing={job.cpus}")
    parts.append(f"gres/gpu={job.gpus}")
    return ",".join(parts)


def _mem(mb: int) -> str:
    for unit, size in (("T", 1024 * 1024), ("G", 1024)):
        if mb % size == 0:
            return f"{mb // size}{unit}"
    return f"{mb}M"


def sacct(jobs: list[Job], now: float) -> dict[str, Any]:
    """`sacct --json`: dbv0.0.38's `jobs[]`."""
    return {"meta": _meta("dbv0.0.38"), "errors": [], "jobs": [_sacct_job(j, now) for j in jobs]}


def _sacct_job(job: Job, now: float) -> dict[str, Any]:
    code, sig = job.exit_pair
    if job.end_time is None:
        exit_code: dict[str, Any] = {"status": "PENDING", "return_code": None}
    elif sig:
        exit_code = {
            "status": "SIGNALED",
            "return_code": None,
            "signal": {"signal_id": sig, "name": _signal_name(sig)},
        }
    else:
        exit_code = {"status": "SUCCESS" if code == 0 else "FAILED", "return_code": code}
    return {
        "account": job.account,
        "allocation_nodes": len(job.nodelist),
        "array": {
            "job_id": job.array_job_id or 0,
            "limits": {"max": {"running": {"tasks": job.array_max_parallel or 0}}},
            "task": job.task_string,
            "task_id": None if job.tasks else job.array_task_id,
        },
        "exit_code": exit_code,
        "derived_exit_code": exit_code,
        "job_id": job.id,
        "name": job.name,
        "nodes": job.hostlist or "None assigned",
        "partition": job.partition,
        "priority": job.priority,
        "qos": job.qos,
        "required": {"CPUs": job.cpus, "memory": job.mem_mb or 0},
        "kill_request_user": job.cancelled_by,
        "state": {"current": job.word, "reason": job.slurm_reason()},
        "steps": [],
        "time": {
            "elapsed": job.elapsed(now),
            "eligible": int(job.submit_time),
            "end": int(job.end_time or 0),
            "start": int(job.start_time or 0),
            "submission": int(job.submit_time),
            "suspended": 0,
            "limit": None if job.time_limit_s is None else -(-job.time_limit_s // 60),
        },
        "tres": {
            "requested": _tres_list(job),
            "allocated": _tres_list(job) if job.nodelist else [],
        },
        "user": job.user,
        "working_directory": job.workdir,
    }


def _tres_list(job: Job) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"type": "cpu", "name": None, "id": 1, "count": job.cpus}]
    if job.mem_mb:
        out.append({"type": "mem", "name": None, "id": 2, "count": job.mem_mb * job.nodes})
    out.append({"type": "node", "name": None, "id": 4, "count": job.nodes})
    out.append({"type": "gres", "name": "gpu", "id": 1001, "count": job.gpus})
    return out


def _signal_name(number: int) -> str:
    try:
        return signals.strsignal(signals.Signals(number)) or str(number)
    except ValueError:
        return str(number)
