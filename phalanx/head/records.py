"""The head's in-memory mirror of live jobs and nodes, and their wire views."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from phalanx.api.models import (
    GpuInfo,
    JobInfo,
    JobProgress,
    JobSpec,
    NodeInfo,
    Notice,
    ProcessStatus,
)
from phalanx.core import DrainCause, JobState, NodeState

QOS_PRIORITY: dict[str, int] = {"low": 0, "normal": 100, "high": 1000}
CANCELLED_BY = "cancelled by "  # how a cancelled job's reason message begins: then who


@dataclass(slots=True)
class JobRecord:
    """One job the head knows: its spec, where it runs and what its ranks reported."""

    id: int
    name: str
    user: str
    team: str
    account: str | None
    qos: str
    priority: int
    state: JobState  # changed only by head.lifecycle.move (a checked, recorded transition)
    spec: JobSpec
    submit_time: float
    reason: str | None = None
    reason_message: str | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: str | None = None
    restart_count: int = 0
    epoch: int = 0
    array_job_id: int | None = None
    array_task_id: int | None = None
    placement: list[tuple[str, list[int]]] = field(default_factory=list)
    master_port: int | None = None
    step_token: str | None = None
    stopping: str | None = None  # why it is being torn down: cancel, timeout, fail, complete…
    pending_exit: str | None = None
    avoid: list[str] = field(default_factory=list)  # nodes that failed it: placed elsewhere
    notices: list[Notice] = field(default_factory=list)  # this epoch's signals to deliver
    notice_deadline: float | None = None  # a preemption notice's kill time (state PR)
    client_token: str | None = None  # the submitter's idempotency key
    hold: str | None = None  # "user" or "admin": held pending (`phalanx hold`), by whom
    # Ephemeral (rebuilt from heartbeats): node → rank → latest status; node → version at
    # which the job left that node's desired state; when all ranks were first seen running.
    ranks: dict[str, dict[int, ProcessStatus]] = field(default_factory=dict)
    stop_version: dict[str, int] = field(default_factory=dict)
    all_running_at: float | None = None
    in_core: bool = False
    progress: dict[int, JobProgress] = field(default_factory=dict)  # rank → latest report
    progress_at: dict[int, float] = field(default_factory=dict)  # rank → when it arrived

    def expected_ranks(self, node_rank: int) -> list[int]:
        """Global ranks the agent of the `node_rank`-th node starts (batch: rank 0 only)."""
        launcher = self.spec.launcher
        if launcher == "batch":
            return [0] if node_rank == 0 else []
        if launcher == "node":
            return [node_rank]
        g = self.spec.gpus_per_node
        return list(range(node_rank * g, (node_rank + 1) * g))

    def info(
        self, addresses: dict[str, str], reason: tuple[str | None, str | None] | None = None
    ) -> JobInfo:
        """The wire view; `reason` overrides the stored one (pending jobs' live reason)."""
        return JobInfo.model_validate(self.wire(addresses, reason))

    def wire(
        self, addresses: dict[str, str], reason: tuple[str | None, str | None] | None = None
    ) -> dict[str, Any]:
        """`info()` as the plain dict of its JSON (listings serialize 10,000 of these
        without building a model each; tests hold it to JobInfo's schema)."""
        code, message = reason if reason is not None else (self.reason, self.reason_message)
        spec = self.spec
        return {
            "id": self.id,
            "name": self.name,
            "user": self.user,
            "team": self.team,
            "account": self.account,
            "qos": self.qos,
            "priority": self.priority,
            "state": self.state.value,
            "reason": code,
            "reason_message": message,
            "nodes": spec.nodes,
            "gpus_per_node": spec.gpus_per_node,
            "launcher": spec.launcher,
            "time_limit_s": spec.time_limit_s,
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "exit_code": self.exit_code,
            "restart_count": self.restart_count,
            "epoch": self.epoch,
            "array_job_id": self.array_job_id,
            "array_task_id": self.array_task_id,
            "placement": [
                {"node": n, "address": addresses.get(n, ""), "gpus": list(g)}
                for n, g in self.placement
            ],
            "workdir": spec.workdir,
            "hold": self.hold,
            "begin_time": spec.begin_time,
            "ntasks_per_node": spec.ntasks_per_node,
            "cpus_per_task": spec.cpus_per_task,
            "mem_mb": spec.mem_mb,
            "array_max_parallel": spec.array.max_parallel if spec.array else None,
            "cancelled_by": self.cancelled_by(),
        }

    def cancelled_by(self) -> str | None:
        """Who cancelled it (head.lifecycle.cancel writes `cancelled by WHO`), or None."""
        message = self.reason_message
        if self.state is not JobState.CANCELLED or message is None:
            return None
        if not message.startswith(CANCELLED_BY):
            return None
        return message[len(CANCELLED_BY) :] or None

    def row(self) -> dict[str, Any]:
        """The columns of the `jobs` table for this record."""
        return {
            "id": self.id,
            "name": self.name,
            "user": self.user,
            "team": self.team,
            "account": self.account,
            "qos": self.qos,
            "priority": self.priority,
            "state": self.state.value,
            "reason": self.reason,
            "reason_message": self.reason_message,
            "spec_json": self.spec.model_dump_json(),
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "exit_code": self.exit_code,
            "restart_count": self.restart_count,
            "epoch": self.epoch,
            "array_job_id": self.array_job_id,
            "array_task_id": self.array_task_id,
            "placement_json": json.dumps(self.placement) if self.placement else None,
            "master_port": self.master_port,
            "step_token": self.step_token,
            "stopping": self.stopping,
            "pending_exit": self.pending_exit,
            "avoid_json": json.dumps(self.avoid) if self.avoid else None,
            "notices_json": (
                json.dumps([n.model_dump() for n in self.notices]) if self.notices else None
            ),
            "notice_deadline": self.notice_deadline,
            "client_token": self.client_token,
            "hold": self.hold,
        }

    @classmethod
    def from_row(cls, row: Any, specs: dict[str, JobSpec] | None = None) -> JobRecord:
        """`specs`: specs already parsed, by their JSON (a JobSpec is frozen, so records
        may share one): an array's tasks, stored with the same spec, are parsed once."""
        placement = json.loads(row.placement_json) if row.placement_json else []
        spec = None if specs is None else specs.get(row.spec_json)
        if spec is None:
            spec = JobSpec.model_validate_json(row.spec_json)
            if specs is not None:
                specs[row.spec_json] = spec
        return cls(
            id=row.id,
            name=row.name,
            user=row.user,
            team=row.team,
            account=row.account,
            qos=row.qos,
            priority=row.priority,
            state=JobState(row.state),
            spec=spec,
            submit_time=row.submit_time,
            reason=row.reason,
            reason_message=row.reason_message,
            start_time=row.start_time,
            end_time=row.end_time,
            exit_code=row.exit_code,
            restart_count=row.restart_count,
            epoch=row.epoch,
            array_job_id=row.array_job_id,
            array_task_id=row.array_task_id,
            placement=[(str(n), [int(g) for g in gs]) for n, gs in placement],
            master_port=row.master_port,
            step_token=row.step_token,
            stopping=row.stopping,
            pending_exit=row.pending_exit,
            avoid=[str(n) for n in json.loads(row.avoid_json)] if row.avoid_json else [],
            notices=(
                [Notice.model_validate(n) for n in json.loads(row.notices_json)]
                if row.notices_json
                else []
            ),
            notice_deadline=row.notice_deadline,
            client_token=row.client_token,
            hold=row.hold,
        )


@dataclass(slots=True)
class NodeRecord:
    """One registered node; `last_heartbeat` lives only in memory (it changes every 2 s)."""

    name: str
    address: str
    agent_url: str
    agent_secret: str
    cpus: int
    memory_mb: int
    gpus: list[GpuInfo]
    labels: dict[str, str]
    state: NodeState  # changed only by head.nodestates.move (checked, recorded)
    down_reason: str | None = None  # why it is down (state DOWN only)
    # Why it is out of service, and who took it out; kept while it is down, so a drained
    # node that goes silent comes back drained.
    drain_cause: DrainCause | None = None
    drain_reason: str | None = None
    # The lease is counted from `last_heartbeat`, which a restarted or thawed head sets to
    # "now" for every node (a fresh lease); `heard_at` is when this head last really heard
    # from the node (None: not since it started), which is what `phalanx nodes` shows.
    last_heartbeat: float | None = None
    heard_at: float | None = None
    health_seq: int = 0  # the newest GPU health event handled (acknowledged to the agent)
    version: int = 0  # desired-state version; bumped whenever what it must run changes
    confinement: str = "unknown"  # how its agent confines jobs (cgroup-v1, …, none: why)

    @property
    def schedulable(self) -> bool:
        return self.state.schedulable

    @property
    def reason(self) -> str | None:
        """What `phalanx nodes` shows: why it is down (and drained), or drained."""
        if self.state is NodeState.DOWN:
            if self.drain_cause is not None:
                return f"{self.down_reason}; was drained: {self.drain_reason}"
            return self.down_reason
        return self.drain_reason if self.state is NodeState.DRAIN else None

    def row(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "agent_url": self.agent_url,
            "agent_secret": self.agent_secret,
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "gpus_json": json.dumps([g.model_dump() for g in self.gpus]),
            "labels_json": json.dumps(self.labels),
            "state": self.state.value,
            "reason": self.reason,
            "confinement": self.confinement,
            "drain_cause": None if self.drain_cause is None else self.drain_cause.value,
            "drain_reason": self.drain_reason,
        }

    @classmethod
    def from_row(cls, row: Any) -> NodeRecord:
        return cls(
            name=row.name,
            address=row.address,
            agent_url=row.agent_url,
            agent_secret=row.agent_secret,
            cpus=row.cpus,
            memory_mb=row.memory_mb,
            gpus=[GpuInfo.model_validate(g) for g in json.loads(row.gpus_json)],
            labels=dict(json.loads(row.labels_json)),
            state=NodeState(row.state),
            down_reason=row.reason if row.state == NodeState.DOWN.value else None,
            drain_cause=None if row.drain_cause is None else DrainCause(row.drain_cause),
            drain_reason=row.drain_reason,
            confinement=row.confinement or "unknown",
        )

    def info(self, jobs: list[int], gpus_used: int, now: float | None = None) -> NodeInfo:
        return NodeInfo.model_validate(self.wire(jobs, gpus_used, now))

    def wire(self, jobs: list[int], gpus_used: int, now: float | None = None) -> dict[str, Any]:
        """`info()` as the plain dict of its JSON (`GET /v1/nodes` serializes 10,000 of
        these without building a model each, and outside the control lock)."""
        now = time.time() if now is None else now
        state = self.state.value
        if self.state is NodeState.DRAIN and jobs:
            state = "draining"
        age = None if self.heard_at is None else max(0.0, now - self.heard_at)
        return {
            "name": self.name,
            "address": self.address,
            "agent_url": self.agent_url,
            "state": state,
            "reason": self.reason,
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "gpus": [g.model_dump() for g in self.gpus],
            "gpus_used": gpus_used,
            "labels": dict(self.labels),
            "last_heartbeat": self.heard_at,
            "heartbeat_age_s": age,
            "jobs": jobs,
            "confinement": self.confinement,
            "gpu_telemetry": [],
            "telemetry_age_s": None,
        }
