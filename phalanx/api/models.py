"""Every type that crosses the wire (REST between CLI, head and agents): pydantic, strict.

This module is the contract between the head, the agents, the client and the CLI. Inside
each process, frozen dataclasses are used; pydantic lives only here, at the boundary.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints

MAX_NODES = 4096
MAX_GPUS_PER_NODE = 62  # the core's per-node bitmask limit
MAX_ARRAY_TASKS = 10_000
MAX_INT32 = 2**31 - 1  # ids and counts stored in 32-bit database columns
# A job whose rank exits with this code (EX_TEMPFAIL) asks to be requeued: it checkpointed
# (phalanx.train does so on a preemption notice) and wants to resume, up to max_restarts.
REQUEUE_EXIT_CODE = 75

Launcher = Literal["torchrun", "node", "batch"]
JobStateCode = Literal["PD", "R", "CG", "CD", "F", "CA", "TO", "NF", "PR"]
Role = Literal["user", "team_admin", "admin"]
NodeStateName = Literal["up", "down", "drain", "draining"]
DependencyType = Literal["after", "afterok", "afterany", "afternotok"]

SignalName = Annotated[str, StringConstraints(pattern=r"^SIG[A-Z0-9]+$")]
Name = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@+-]+$")
]


class Wire(BaseModel):
    """Base of every wire model: unknown fields are an error, types are not coerced. What
    a user writes (a JobSpec, an admin request) stays so: a misspelt field must be an
    error, not a setting silently left at its default."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Lenient(Wire):
    """Base of what programs send each other (head ↔ agent, srun ↔ agent, a job's
    progress) and of every answer: unknown fields are ignored, so a peer one minor API
    version ahead (phalanx.api.version) may add fields during a rolling upgrade. Types
    stay strict."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


# ----------------------------------------------------------------------------- job spec
class DependencySpec(Wire):
    type: DependencyType
    job_ids: list[Annotated[int, Field(ge=1, le=MAX_INT32)]] = Field(min_length=1)


class ArraySpec(Wire):
    """`--array=0-15%4`: the task indices, and how many may run at once (None: no limit)."""

    indices: list[Annotated[int, Field(ge=0, le=4_000_000)]] = Field(
        min_length=1, max_length=MAX_ARRAY_TASKS
    )
    max_parallel: Annotated[int, Field(ge=1)] | None = None


class SignalSpec(Wire):
    """`--signal=[{R|B}:]SIG[@secs]`: send SIG this many seconds before the time limit."""

    signal: SignalName = "SIGUSR1"
    seconds_before: Annotated[int, Field(ge=0, le=65535)] = 60
    batch_only: bool = False  # `B:`: only the batch shell gets it


class JobSpec(Wire):
    """One job as the user asked for it. YAML files, CLI flags and `#SBATCH` scripts all
    parse into this one type (phalanx.jobspec); the head validates it again on submit.

    Exactly one of `command` (argv, run by the torchrun or node launcher) and `script`
    (the text of a batch script, run once on the first node by the batch launcher).
    """

    name: Annotated[str, StringConstraints(min_length=1, max_length=200)] = "job"
    command: list[Annotated[str, StringConstraints(max_length=65536)]] | None = None
    script: Annotated[str, StringConstraints(max_length=1_000_000)] | None = None
    launcher: Launcher = "torchrun"
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] = 1
    gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)] = 1
    ntasks_per_node: Annotated[int, Field(ge=1, le=1024)] | None = None
    cpus_per_task: Annotated[int, Field(ge=1, le=4096)] | None = None
    mem_mb: Annotated[int, Field(ge=1)] | None = None
    time_limit_s: Annotated[int, Field(ge=1)] | None = None
    team: Name | None = None  # `-p/--partition`; None: the user's default team
    account: Name | None = None  # `-A/--account`: recorded (sacct), not enforced
    qos: Name = "normal"  # maps to a priority class on the head (low, normal, high)
    gpu_model: Name | None = None  # `--gres=gpu:h100:4` or `--constraint`
    workdir: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    output: Annotated[str, StringConstraints(max_length=4096)] | None = None  # `-o` pattern
    error: Annotated[str, StringConstraints(max_length=4096)] | None = None  # `-e` pattern
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = {}
    dependencies: list[DependencySpec] = []
    dependency_any: bool = False  # Slurm's `?` separator: any one dependency suffices
    array: ArraySpec | None = None
    requeue: bool = True
    signal: SignalSpec | None = None
    exclusive: bool = False
    preemptible: bool = True
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    exclude_nodes: list[Name] = []
    # Fault tolerance (docs/fault-tolerance.md). Restarts after a node failure, a hang, a
    # GPU fault or a preemption count against max_restarts; so does a rank's non-zero
    # exit when restart_on_failure is set (otherwise the job ends F).
    restart_on_failure: bool = False
    checkpoint_dir: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = None
    preempt_signal: SignalName = "SIGUSR1"  # the preemption notice
    preempt_grace_s: Annotated[int, Field(ge=0, le=86400)] | None = None  # None: the head's
    hang_timeout_s: Annotated[int, Field(ge=0, le=7 * 86400)] | None = None  # 0: off


class SubmitResponse(Lenient):
    job_ids: list[int]  # one id, or one per array task
    array_job_id: int | None = None
    warnings: list[str] = Field(default_factory=list)  # not `[]`: that is deep-copied each time


# ----------------------------------------------------------------------------- job views
class RankPlacement(Lenient):
    node: str
    address: str
    gpus: list[int]  # GPU indices on that node


class JobInfo(Lenient):
    id: int
    name: str
    user: str
    team: str
    account: str | None
    qos: str
    priority: int
    state: JobStateCode
    reason: str | None  # pending reason code (Slurm style), or why it ended
    reason_message: str | None  # the plain-language sentence
    nodes: int
    gpus_per_node: int
    launcher: Launcher
    time_limit_s: int | None
    submit_time: float  # unix seconds
    start_time: float | None
    end_time: float | None
    exit_code: str | None  # "exit:signal", as sacct
    restart_count: int
    epoch: int
    array_job_id: int | None
    array_task_id: int | None
    placement: list[RankPlacement]  # empty unless allocated
    workdir: str


class JobEvent(Lenient):
    time: float
    kind: str  # submitted, started, requeued, preempted, cancelled, ended, node_down, ...
    message: str
    node: str | None = None


class JobProgress(Lenient):
    """A training progress report a job posts (phalanx.train does, with its step token)."""

    rank: Annotated[int, Field(ge=0)]
    step: Annotated[int, Field(ge=0)]
    loss: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    time: float


class JobDetail(Lenient):
    job: JobInfo
    spec: JobSpec = Field(
        description="the spec as submitted (`team` empty: the submitter's default); "
        "`job.team` is the team the job runs under"
    )
    events: list[JobEvent]
    progress: list[JobProgress] = []  # the latest report of each reporting rank (live jobs)


class JobList(Lenient):
    jobs: list[JobInfo]


class JobTable(Lenient):
    """`GET /v1/jobs?format=table`: the same jobs as JobList, each a row of JobInfo's
    values in `columns`' order (half the bytes at 10,000 jobs; what `phalanx queue` reads)."""

    columns: list[str]
    rows: list[list[JsonValue]]


class CancelRequest(Wire):
    """`signal` set: deliver it to the job's processes instead of cancelling (scancel -s)."""

    signal: SignalName | None = None


class LogChunk(Lenient):
    job_id: int
    rank: int
    stream: Literal["stdout", "stderr"]
    offset: int  # byte offset of `data` in the file
    next_offset: int
    data: str  # decoded as UTF-8 with replacement
    eof: bool  # the rank has ended and everything was read


# ----------------------------------------------------------------------------- nodes
class GpuInfo(Lenient):
    index: int
    uuid: str
    model: str
    memory_mb: int


class GpuTelemetry(Lenient):
    index: int
    utilization_pct: float | None = None
    memory_used_mb: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None


class NodeInfo(Lenient):
    name: str
    address: str
    agent_url: str
    state: NodeStateName
    reason: str | None
    cpus: int
    memory_mb: int
    gpus: list[GpuInfo]
    gpus_used: int
    labels: dict[str, str]  # rack, block, …
    last_heartbeat: float | None
    heartbeat_age_s: float | None
    jobs: list[int]


class NodeList(Lenient):
    nodes: list[NodeInfo]


class DrainRequest(Wire):
    reason: Annotated[str, StringConstraints(min_length=1, max_length=500)]


# ----------------------------------------------------------------------------- agent wire
class RegisterRequest(Lenient):
    """An agent joins with a join token and gets back a per-node credential."""

    name: Name
    address: str
    agent_url: str  # where the agent's own API listens (logs, srun steps)
    agent_secret: Annotated[str, StringConstraints(min_length=16, max_length=256)]
    cpus: Annotated[int, Field(ge=1, le=MAX_INT32)]
    memory_mb: Annotated[int, Field(ge=1, le=MAX_INT32)]
    gpus: list[GpuInfo] = Field(max_length=MAX_GPUS_PER_NODE)
    labels: dict[Name, Name] = {}


class RegisterResponse(Lenient):
    node_token: str
    heartbeat_s: float
    lease_s: float


class ProcessStatus(Lenient):
    """One rank (or the batch script) the agent started, as the agent sees it now."""

    job_id: int
    epoch: int
    rank: int  # global rank; the batch script is rank 0
    local_rank: int
    pid: int | None
    running: bool
    exit_code: int | None = None  # set when exited normally
    signal: int | None = None  # set when killed by a signal
    started_at: float
    ended_at: float | None = None
    # The agent, not the job, ended it: fenced (no answer from the head for the lease) or
    # lost when the agent restarted. The head treats it as a node failure (requeue).
    lost: bool = False


class GpuHealthEvent(Lenient):
    """Something the agent saw go wrong with a GPU (NVML, or injected on fake GPUs). Sent in
    every heartbeat until the head acknowledges its `seq` (DesiredState.health_ack)."""

    seq: Annotated[int, Field(ge=1)]
    time: float
    gpu: int | None  # GPU index on the node; None: the node as a whole
    kind: Literal["xid", "ecc_uncorrectable", "row_remap_failure", "gpu_lost"]
    code: int | None = None  # the XID number
    message: str


class NodeHealth(Lenient):
    events: list[GpuHealthEvent] = []  # not yet acknowledged, oldest first
    # The first line of output of the first failing health-check script (NHC style:
    # exit 0 is healthy); None while every check passes.
    check_failure: str | None = None


class Heartbeat(Lenient):
    """The agent's report. `version` is the desired-state version it last applied; with
    `wait_s` > 0 the head holds the answer until that version changes (long poll)."""

    name: Name
    version: int
    wait_s: Annotated[float, Field(ge=0, le=30)] = 0.0
    processes: list[ProcessStatus] = []
    master_ports: dict[str, int] = {}  # job id → port picked by the rank-0 node
    gpus: list[GpuTelemetry] = []
    health: NodeHealth = NodeHealth()


class Notice(Lenient):
    """A signal the agent delivers once to a job's processes: a preemption notice, a time
    limit's `--signal`, or `phalanx cancel --signal`."""

    id: Annotated[int, Field(ge=1)]  # per job; the agent delivers each id once per epoch
    signal: SignalName
    batch_only: bool = False  # only the batch script's process, not srun steps
    reason: str


class Assignment(Lenient):
    """One job this node must run, with everything needed to launch its local ranks."""

    job_id: int
    epoch: int
    name: str
    user: str
    launcher: Launcher
    command: list[str] | None
    script: str | None
    workdir: str
    env: dict[str, str]
    gpus: list[int]  # local GPU indices for this job on this node
    node_rank: int
    nodes: list[str]  # node names, rank order
    addresses: list[str]  # their addresses, rank order
    agent_urls: list[str]  # their agent URLs, rank order (srun)
    gpus_per_node: int
    ntasks_per_node: int | None
    cpus_per_task: int | None
    master_addr: str
    master_port: int | None  # None until the rank-0 node picked a free port
    restart_count: int
    submit_dir: str
    output: str | None
    error: str | None
    array_job_id: int | None
    array_task_id: int | None
    time_limit_s: int | None
    step_token: str  # lets `srun` inside this job start tasks on its nodes
    account: str | None
    team: str
    checkpoint_dir: str  # PHALANX_CHECKPOINT_DIR: the same for every restart of the job
    preempt_signal: SignalName  # PHALANX_PREEMPT_SIGNAL
    preempt_grace_s: float  # PHALANX_PREEMPT_DEADLINE: seconds from a notice to the kill
    notices: list[Notice] = []


class DesiredState(Lenient):
    version: int
    jobs: list[Assignment]
    heartbeat_s: float
    lease_s: float  # the agent stops its jobs when the head has not answered for this long
    kill_grace_s: float
    health_ack: int = 0  # the highest GpuHealthEvent.seq of this node the head has handled


# ----------------------------------------------------------------------------- auth admin
class WhoAmI(Lenient):
    user: str
    role: Role
    teams: list[str]
    admin_of: list[str]


class UserCreate(Wire):
    name: Name
    admin: bool = False
    teams: list[Name] = []
    team_admin_of: list[Name] = []
    default_team: Name | None = None


class UserInfo(Lenient):
    name: str
    admin: bool
    teams: list[str]
    team_admin_of: list[str]
    default_team: str | None


class UserList(Lenient):
    users: list[UserInfo]


class TokenCreate(Wire):
    user: Name
    description: Annotated[str, StringConstraints(max_length=200)] = ""


class TokenIssued(Lenient):
    id: int
    token: str  # shown once; only its hash is stored
    user: str | None
    kind: Literal["api", "join"]


class TokenInfo(Lenient):
    id: int
    user: str | None
    kind: Literal["api", "join", "node"]
    description: str
    created: float
    last_used: float | None
    revoked: bool


class TokenList(Lenient):
    tokens: list[TokenInfo]


class TeamSpec(Wire):
    name: Name
    quota_gpus: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None  # None: unlimited
    cohort: Name | None = None
    borrowing_limit: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None
    weight: Annotated[float, Field(gt=0)] | None = None


class TeamInfo(Lenient):
    name: str
    quota_gpus: int | None
    cohort: str | None
    borrowing_limit: int | None
    weight: float | None
    gpus_in_use: int
    members: list[str]


class TeamList(Lenient):
    teams: list[TeamInfo]


class ErrorBody(Lenient):
    detail: str


class Health(Lenient):
    status: Literal["ok"]
    version: str
    # A standby head (PostgreSQL leader election, docs/high-availability.md) answers
    # /healthz only; every other endpoint answers 503 until it becomes the leader.
    role: Literal["leader", "standby"] = "leader"


# ----------------------------------------------------------------------------- srun steps
class StepTask(Lenient):
    task_id: int  # SLURM_PROCID within the step
    local_id: int  # SLURM_LOCALID
    node_id: int  # SLURM_NODEID
    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = {}  # srun's own environment, forwarded


class StepLaunch(Lenient):
    job_id: int
    step_id: int
    workdir: str
    tasks: list[StepTask] = Field(min_length=1)


class StepTaskStatus(Lenient):
    task_id: int
    pid: int | None
    running: bool
    exit_code: int | None = None
    signal: int | None = None


class StepStatus(Lenient):
    job_id: int
    step_id: int
    tasks: list[StepTaskStatus]


# ----------------------------------------------------------------------------- faults
class FaultInjection(Wire):
    """An admin injects a GPU fault on a node with fake GPUs (tests, chaos, drills): the
    agent reports it as if NVML had seen it. Refused (409) on a node with real GPUs."""

    gpu: Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)] | None = None
    kind: Literal["xid", "ecc_uncorrectable", "row_remap_failure", "gpu_lost"] = "xid"
    code: Annotated[int, Field(ge=0, le=1000)] | None = None  # the XID number (kind xid)
    message: Annotated[str, StringConstraints(max_length=500)] = "injected fault"
