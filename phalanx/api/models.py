"""Every type that crosses the wire (REST between CLI, head and agents): pydantic, strict.

This module is the contract between the head, the agents, the client and the CLI. Inside
each process, frozen dataclasses are used; pydantic lives only here, at the boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    model_validator,
)
from pydantic_core import ErrorDetails

from phalanx.api.states import JobStateCode

MAX_NODES = 4096
MAX_GPUS_PER_NODE = 62  # the core's per-node bitmask limit
MAX_ARRAY_TASKS = 10_000
MAX_INT32 = 2**31 - 1  # ids and counts stored in 32-bit database columns
MAX_INT64 = 2**63 - 1  # in-memory counters (desired-state versions, steps)
MAX_LIST = 65_536  # items in a list or dict a peer sends (argv, environment, ranks)
MAX_TEXT = 65_536  # characters in one argument, variable value or message
MAX_PATH = 4096  # characters in a path (Linux PATH_MAX)
MAX_CONFINEMENT = 200  # characters in a node's confinement description
MAX_PEM = 8192  # characters in a PEM certificate or certificate request
# A job whose rank exits with this code (EX_TEMPFAIL) asks to be requeued: it checkpointed
# (phalanx.train does so on a preemption notice) and wants to resume, up to max_restarts.
REQUEUE_EXIT_CODE = 75

Launcher = Literal["torchrun", "node", "batch"]
Role = Literal["user", "team_admin", "admin"]
NodeStateName = Literal["up", "down", "drain", "draining"]
DependencyType = Literal["after", "afterok", "afterany", "afternotok"]

SignalName = Annotated[str, StringConstraints(max_length=32, pattern=r"^SIG[A-Z0-9]+$")]
Name = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@+-]+$")
]


def _no_nul(value: str) -> str:
    """Refuse NUL: the kernel ends argv entries, variables and paths at one (Python raises)."""
    if "\x00" in value:
        raise ValueError(
            "contains a NUL byte (\\0), which no command, environment variable or path can hold"
        )
    return value


NoNul = AfterValidator(_no_nul)
# Strings that become a process's argv, environment or a path: bounded, and NUL-free.
Arg = Annotated[str, StringConstraints(max_length=MAX_TEXT), NoNul]
PathText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH), NoNul]
EnvKey = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^[^=\x00]+$")]
EnvValue = Annotated[str, StringConstraints(max_length=MAX_TEXT), NoNul]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]  # a message, shown only
# A message the head stores (PostgreSQL refuses NUL in text: the commit would fail).
Message = Annotated[str, StringConstraints(max_length=4096), NoNul]
ScriptText = Annotated[str, StringConstraints(max_length=1_000_000), NoNul]
JobName = Annotated[str, StringConstraints(min_length=1, max_length=200), NoNul]
Address = Annotated[str, StringConstraints(min_length=1, max_length=255), NoNul]
Url = Annotated[str, StringConstraints(min_length=1, max_length=512), NoNul]
Token = Annotated[str, StringConstraints(min_length=1, max_length=256), NoNul]


# A webhook the head POSTs a job's notifications to: http(s) only, no blanks; which hosts
# the head may reach is its admin's allow-list (head/notify.py), checked on submit.
def _web_url(value: str) -> str:
    scheme, sep, rest = value.partition("://")
    blank = any(c <= " " or c == "\x7f" for c in value)  # spaces and control characters
    if not sep or scheme.lower() not in ("http", "https") or not rest or blank:
        raise ValueError("must be an http:// or https:// URL, without blanks")
    return value


NotifyUrl = Annotated[str, StringConstraints(max_length=2048), AfterValidator(_web_url)]
# Slurm's --mail-type events a webhook can be told of (docs/jobspec.md#notifications).
NotifyEvent = Literal["BEGIN", "END", "FAIL", "REQUEUE"]
Pem = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PEM), NoNul]
# A user, team or account as the head knows it (it lands in the job's environment).
Label = Annotated[str, StringConstraints(min_length=1, max_length=128), NoNul]
# Integers as the database stores them (32-bit columns) and as the kernel knows them.
JobId = Annotated[int, Field(ge=1, le=MAX_INT32)]
Count = Annotated[int, Field(ge=0, le=MAX_INT32)]
Counter = Annotated[int, Field(ge=0, le=MAX_INT64)]
Port = Annotated[int, Field(ge=1, le=65535)]
Pid = Annotated[int, Field(ge=1, le=MAX_INT32)]
ExitCode = Annotated[int, Field(ge=0, le=255)]
SignalNumber = Annotated[int, Field(ge=1, le=255)]
GpuIndex = Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)]
# Floats: finite (JSON parsers take NaN and Infinity) and within sane bounds.
Seconds = Annotated[float, Field(ge=0, le=10 * 365 * 86400, allow_inf_nan=False)]
UnixTime = Annotated[float, Field(ge=0, le=1e11, allow_inf_nan=False)]
Measure = Annotated[float, Field(ge=-1e12, le=1e12, allow_inf_nan=False)]


def validation_detail(errors: Sequence[ErrorDetails], limit: int = 10) -> str:
    """Pydantic's errors as one sentence naming each field at fault (`a.b: msg; …`, at
    most `limit` of them): the `detail` of a 422, the reason of a refused assignment."""
    parts = []
    for err in errors[:limit]:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


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
    job_ids: list[JobId] = Field(min_length=1, max_length=MAX_ARRAY_TASKS)


class ArraySpec(Wire):
    """`--array=0-15%4`: the task indices, and how many may run at once (None: no limit)."""

    indices: list[Annotated[int, Field(ge=0, le=4_000_000)]] = Field(
        min_length=1, max_length=MAX_ARRAY_TASKS
    )
    max_parallel: Annotated[int, Field(ge=1, le=MAX_ARRAY_TASKS)] | None = None


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

    name: JobName = "job"
    command: Annotated[list[Arg], Field(max_length=MAX_LIST)] | None = None
    script: ScriptText | None = None
    launcher: Launcher = "torchrun"
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] = 1
    gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)] = 1
    ntasks_per_node: Annotated[int, Field(ge=1, le=1024)] | None = None
    cpus_per_task: Annotated[int, Field(ge=1, le=4096)] | None = None
    mem_mb: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    time_limit_s: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    team: Name | None = None  # `-p/--partition`; None: the user's default team
    account: Name | None = None  # `-A/--account`: recorded (sacct), not enforced
    qos: Name = "normal"  # maps to a priority class on the head (low, normal, high)
    gpu_model: Name | None = None  # `--gres=gpu:h100:4` or `--constraint`
    workdir: PathText
    output: PathText | None = None  # `-o` pattern
    error: PathText | None = None  # `-e` pattern
    env: Annotated[
        dict[
            Annotated[str, StringConstraints(max_length=1024, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")],
            EnvValue,
        ],
        Field(max_length=MAX_LIST),
    ] = {}
    dependencies: list[DependencySpec] = Field(default=[], max_length=64)
    dependency_any: bool = False  # Slurm's `?` separator: any one dependency suffices
    array: ArraySpec | None = None
    requeue: bool = True
    signal: SignalSpec | None = None
    exclusive: bool = False
    preemptible: bool = True
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    exclude_nodes: list[Name] = Field(default=[], max_length=MAX_NODES)
    # Fault tolerance (docs/fault-tolerance.md). Restarts after a node failure, a hang, a
    # GPU fault or a preemption count against max_restarts; so does a rank's non-zero
    # exit when restart_on_failure is set (otherwise the job ends F).
    restart_on_failure: bool = False
    checkpoint_dir: PathText | None = None
    preempt_signal: SignalName = "SIGUSR1"  # the preemption notice
    preempt_grace_s: Annotated[int, Field(ge=0, le=86400)] | None = None  # None: the head's
    hang_timeout_s: Annotated[int, Field(ge=0, le=7 * 86400)] | None = None  # 0: off
    begin_time: UnixTime | None = None  # `--begin`: pending (BeginTime) until then
    nodelist: list[Name] = Field(default=[], max_length=MAX_NODES)  # `-w`: only these nodes
    # Job notifications (Slurm's --mail-user/--mail-type, as a webhook): the head POSTs a
    # JobNotification to `notify_url` on each event of `notify_on` (None: END, which
    # covers every end, failures included).
    notify_url: NotifyUrl | None = None
    notify_on: list[NotifyEvent] | None = Field(default=None, max_length=4)
    hold: bool = False  # `sbatch -H/--hold`: submitted held (JobHeldUser) until released

    @model_validator(mode="after")
    def _notify_needs_url(self) -> JobSpec:
        if self.notify_on is not None and self.notify_url is None:
            raise ValueError("notify_on names events but notify_url is not set: where to post?")
        return self


class JobNotification(Lenient):
    """What the head POSTs to a job's `notify_url` (JSON) on an event it asked for."""

    event: NotifyEvent  # FAIL: it ended F, TO, NF or OOM; END: CD or CA
    job_id: int
    name: str
    user: str
    team: str
    state: JobStateCode  # the state it moved to
    exit_code: str | None  # "exit:signal" once it ended
    reason: str | None  # why it ended or was requeued (reason code)
    message: str  # the transition's sentence, as `phalanx show` prints it
    epoch: int
    restart_count: int
    time: float  # unix seconds of the move
    array_job_id: int | None = None
    array_task_id: int | None = None


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
    hold: Literal["user", "admin"] | None = None  # held (`phalanx hold`): who may release it
    begin_time: float | None = None  # `--begin`: not before this (unix seconds)
    # What Slurm's squeue/sacct report beside (phalanx.slurmcli): the request's tasks, CPUs
    # and memory, an array's `%N` throttle, and who cancelled it (sacct's `CANCELLED by`).
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    mem_mb: int | None = None
    array_max_parallel: int | None = None
    cancelled_by: str | None = None
    # A requeued job's start_time is its latest run's: these span every run (from the
    # typed job events). None: it never started.
    first_start_time: UnixTime | None = None
    run_time_s: Seconds | None = None  # time it held GPUs over all its runs, as of the answer


class JobEvent(Lenient):
    time: float
    kind: str  # submitted, started, requeued, preempted, cancelled, ended, node_down, ...
    message: str
    node: str | None = None
    # A state move (core.lifecycle.JobTransition): from → to, in allocation `epoch`.
    from_state: JobStateCode | None = None
    to_state: JobStateCode | None = None
    epoch: int | None = None


class JobProgress(Lenient):
    """A training progress report a job posts (phalanx.train does, with its step token)."""

    rank: Count
    step: Counter
    loss: Measure | None = None
    tokens_per_s: Measure | None = None
    mfu: Measure | None = None
    time: UnixTime
    # The last checkpoint's save time (its blocking part) and the step it saved; the head
    # observes each checkpoint once (phalanx_job_checkpoint_duration_seconds).
    checkpoint_s: Seconds | None = None
    checkpoint_step: Counter | None = None


class JobGpu(Lenient):
    """One GPU a running job holds, as its node's agent last reported it."""

    node: Annotated[str, StringConstraints(max_length=128)]
    index: GpuIndex
    utilization_pct: Measure | None = None
    memory_used_mb: Count | None = None
    memory_mb: Count | None = None  # the GPU's total memory
    age_s: Seconds | None = None  # how old the reading is


class JobDetail(Lenient):
    job: JobInfo
    spec: JobSpec = Field(
        description="the spec as submitted (`team` empty: the submitter's default); "
        "`job.team` is the team the job runs under"
    )
    events: list[JobEvent]
    progress: list[JobProgress] = []  # the latest report of each reporting rank (live jobs)
    # The latest telemetry of each GPU the job holds (running jobs whose agents report it).
    gpus: list[JobGpu] = Field(default=[], max_length=MAX_NODES * (MAX_GPUS_PER_NODE + 1))
    # The spec's `env` is shown only to the owner, team admins and admins (it may hold
    # secrets); a teammate gets `env` empty and this set.
    env_hidden: bool = False


class JobList(Lenient):
    jobs: list[JobInfo]


class JobTable(Lenient):
    """`GET /v1/jobs?format=table`: the same jobs as JobList, each a row of JobInfo's
    values in `columns`' order (half the bytes at 10,000 jobs; what `phalanx queue` reads)."""

    columns: list[str]
    rows: list[list[JsonValue]]


# A job as users name it (Slurm's forms): `123` (a job; an array's id: every task of the
# array), `123_4` (task 4 of array 123).
JOB_REF_PATTERN = r"^[1-9][0-9]{0,9}(_[0-9]{1,7})?$"
JobRef = Annotated[str, StringConstraints(max_length=18, pattern=JOB_REF_PATTERN)]


class JobUpdate(Wire):
    """`PATCH /v1/jobs/{job}` (`phalanx update`, like `scontrol update`): only the fields
    sent change. A pending job: all of them; a running one: `time_limit_s` only. Users may
    lower a time limit, only admins raise it (as Slurm); `qos` within the owner's
    allowance; `priority` is for admins. `dependencies` replaces the job's (empty: none)."""

    time_limit_s: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    qos: Name | None = None
    priority: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    dependencies: list[DependencySpec] | None = Field(default=None, max_length=64)
    dependency_any: bool | None = None


class CancelRequest(Wire):
    """`signal` set: deliver it to the job's processes instead of cancelling (scancel -s).
    `scope` (with a signal): `all` its processes (the default), a batch job's `steps`
    (srun's tasks: Slurm's scancel -s) or its `batch` script only (scancel -b)."""

    signal: SignalName | None = None
    scope: Literal["all", "steps", "batch"] | None = None


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
    index: GpuIndex
    uuid: Annotated[str, StringConstraints(max_length=256), NoNul]
    model: Annotated[str, StringConstraints(max_length=256), NoNul]
    memory_mb: Count


class GpuTelemetry(Lenient):
    index: GpuIndex
    utilization_pct: Measure | None = None
    memory_used_mb: Count | None = None
    temperature_c: Measure | None = None
    power_w: Measure | None = None
    # Energy since the driver loaded (NVML total energy; the fake provider's since it
    # started), and the job holding the GPU on this node (telemetry batches carry them).
    energy_j: Annotated[float, Field(ge=0, le=1e15, allow_inf_nan=False)] | None = None
    job_id: JobId | None = None


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
    # How the node confines jobs: "cgroup-v1", "cgroup-v2 (…)" or "none: <reason>".
    confinement: str = "unknown"
    # Each GPU's latest reading from the agent's heartbeats (empty until one arrives) and
    # how old it is; kept in memory only.
    gpu_telemetry: list[GpuTelemetry] = Field(default=[], max_length=MAX_GPUS_PER_NODE + 1)
    telemetry_age_s: Seconds | None = None


class NodeList(Lenient):
    nodes: list[NodeInfo]


class DrainRequest(Wire):
    reason: Annotated[str, StringConstraints(min_length=1, max_length=500), NoNul]


# ----------------------------------------------------------------------------- agent wire
class RegisterRequest(Lenient):
    """An agent joins with a join token and gets back a per-node credential."""

    name: Name
    address: Address
    agent_url: Url  # where the agent's own API listens (logs, srun steps)
    agent_secret: Annotated[str, StringConstraints(min_length=16, max_length=256)]
    cpus: Annotated[int, Field(ge=1, le=MAX_INT32)]
    memory_mb: Annotated[int, Field(ge=1, le=MAX_INT32)]
    gpus: list[GpuInfo] = Field(max_length=MAX_GPUS_PER_NODE)
    labels: Annotated[dict[Name, Name], Field(max_length=64)] = {}
    # How the agent confines jobs: "cgroup-v1", "cgroup-v2 (…)" or "none: <reason>".
    confinement: Annotated[str, StringConstraints(max_length=MAX_CONFINEMENT), NoNul] = "unknown"
    # A PEM certificate request for the agent's API key: the head signs it with its CA
    # (when it has one) so clients of the agent's API verify it as they verify the head.
    csr: Pem | None = None


class RegisterResponse(Lenient):
    node_token: Token
    heartbeat_s: Annotated[Seconds, Field(gt=0)]
    lease_s: Annotated[Seconds, Field(gt=0)]
    # The signed certificate for `csr` (PEM)
    agent_cert: Pem | None = None


class ProcessStatus(Lenient):
    """One rank (or the batch script) the agent started, as the agent sees it now."""

    job_id: JobId
    epoch: Count
    rank: Count  # global rank; the batch script is rank 0
    local_rank: Count
    pid: Pid | None
    running: bool
    exit_code: ExitCode | None = None  # set when exited normally
    signal: SignalNumber | None = None  # set when killed by a signal
    started_at: UnixTime
    ended_at: UnixTime | None = None
    # The agent, not the job, ended it: fenced (no answer from the head for the lease) or
    # lost when the agent restarted. The head treats it as a node failure (requeue).
    lost: bool = False
    # It ended (killed or failed) after the kernel's OOM killer killed a process of the job
    # for its --mem limit (the job's cgroup counted an OOM kill). The head ends it OOM.
    oom: bool = False
    # Set when the agent could not launch it at all ("LaunchFailed: …": an unusable `-o`
    # path, an assignment it cannot read). The head fails the job; no restart would help.
    launch_error: Message | None = None


class GpuHealthEvent(Lenient):
    """Something the agent saw go wrong with a GPU (NVML, or injected on fake GPUs). Sent in
    every heartbeat until the head acknowledges its `seq` (DesiredState.health_ack)."""

    seq: Annotated[int, Field(ge=1, le=MAX_INT64)]
    time: UnixTime
    gpu: GpuIndex | None  # GPU index on the node; None: the node as a whole
    kind: Literal["xid", "ecc_uncorrectable", "row_remap_failure", "gpu_lost"]
    code: Count | None = None  # the XID number
    message: Message


class NodeHealth(Lenient):
    events: list[GpuHealthEvent] = Field(default=[], max_length=1024)  # unacked, oldest first
    # The first line of output of the first failing health-check script (NHC style:
    # exit 0 is healthy); None while every check passes.
    check_failure: Message | None = None


class RankRef(Lenient):
    """One rank of one run of a job (a ProcessStatus's key)."""

    job_id: JobId
    epoch: Count
    rank: Count


MasterPorts = Annotated[
    dict[Annotated[str, StringConstraints(max_length=10, pattern=r"^[0-9]+$")], Port],
    Field(max_length=MAX_LIST),
]
PortKeys = Annotated[
    list[Annotated[str, StringConstraints(max_length=10, pattern=r"^[0-9]+$")]],
    Field(max_length=MAX_LIST),
]


class ReportDelta(Lenient):
    """What changed in an agent's report since the one numbered `base`, which the head
    acknowledged (DesiredState.report_ack): ranks new or changed, ranks no longer
    reported, master ports picked or dropped (docs/control-plane.md#heartbeats-at-scale)."""

    base: Counter
    processes: list[ProcessStatus] = Field(default=[], max_length=MAX_LIST)
    gone: list[RankRef] = Field(default=[], max_length=MAX_LIST)
    master_ports: MasterPorts = {}
    ports_gone: PortKeys = []


class Heartbeat(Lenient):
    """The agent's report. `version` is the desired-state version it last applied; with
    `wait_s` > 0 the head holds the answer until that version changes (long poll).

    A full report lists every rank (`processes`), port and GPU reading. A delta report
    (`delta` set) carries only what changed since the report the head acknowledged; its
    `processes` and `master_ports` are null, which a head that predates deltas refuses
    (422) rather than misreading as "nothing runs here", and `gpus` and `health` are null
    when unchanged. `seq` numbers the reports of one agent run (None: an agent that
    predates deltas; its reports are full and never acknowledged)."""

    name: Name
    version: Counter
    wait_s: Annotated[float, Field(ge=0, le=30, allow_inf_nan=False)] = 0.0
    processes: list[ProcessStatus] | None = Field(default=[], max_length=MAX_LIST)
    # job id → port picked by the rank-0 node
    master_ports: MasterPorts | None = {}
    gpus: list[GpuTelemetry] | None = Field(default=[], max_length=MAX_GPUS_PER_NODE + 1)
    health: NodeHealth | None = NodeHealth()
    seq: Annotated[int, Field(ge=1, le=MAX_INT64)] | None = None
    delta: ReportDelta | None = None

    @model_validator(mode="after")
    def _full_or_delta(self) -> Heartbeat:
        if self.delta is None:
            if self.processes is None or self.master_ports is None:
                raise ValueError("a full report (no `delta`) lists `processes` and `master_ports`")
            if self.gpus is None or self.health is None:
                raise ValueError("a full report (no `delta`) carries `gpus` and `health`")
        else:
            if self.seq is None:
                raise ValueError("a delta report is numbered (`seq`)")
            if self.processes is not None or self.master_ports is not None:
                raise ValueError("a delta report has null `processes` and `master_ports`")
            if self.delta.base >= self.seq:
                raise ValueError("a delta report's `delta.base` precedes its `seq`")
        return self


class Notice(Lenient):
    """A signal the agent delivers once to a job's processes: a preemption notice, a time
    limit's `--signal`, or `phalanx cancel --signal`."""

    id: Annotated[int, Field(ge=1, le=MAX_INT32)]  # per job; delivered once per epoch
    signal: SignalName
    batch_only: bool = False  # only the batch script's process, not srun steps
    steps_only: bool = False  # only srun's step tasks, not the batch script (scancel -s)
    reason: Text


class Assignment(Lenient):
    """One job this node must run, with everything needed to launch its local ranks."""

    job_id: JobId
    epoch: Count
    name: JobName
    user: Label
    launcher: Launcher
    command: Annotated[list[Arg], Field(max_length=MAX_LIST)] | None
    script: ScriptText | None
    workdir: PathText
    env: Annotated[dict[EnvKey, EnvValue], Field(max_length=MAX_LIST)]
    gpus: list[GpuIndex] = Field(max_length=MAX_GPUS_PER_NODE)  # local GPU indices, this node
    node_rank: Annotated[int, Field(ge=0, lt=MAX_NODES)]
    nodes: list[Name] = Field(min_length=1, max_length=MAX_NODES)  # node names, rank order
    addresses: list[Address] = Field(max_length=MAX_NODES)  # their addresses, rank order
    agent_urls: list[Url] = Field(max_length=MAX_NODES)  # their agent URLs, rank order (srun)
    gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)]
    ntasks_per_node: Annotated[int, Field(ge=1, le=1024)] | None
    cpus_per_task: Annotated[int, Field(ge=1, le=4096)] | None
    master_addr: Address
    master_port: Port | None  # None until the rank-0 node picked a free port
    restart_count: Count
    submit_dir: PathText
    output: PathText | None
    error: PathText | None
    array_job_id: JobId | None
    array_task_id: Count | None
    time_limit_s: Annotated[int, Field(ge=1, le=MAX_INT32)] | None
    step_token: Token  # lets `srun` inside this job start tasks on its nodes
    account: Label | None
    team: Label
    # PHALANX_CHECKPOINT_DIR: the same for every restart of the job ("": none)
    checkpoint_dir: Annotated[str, StringConstraints(max_length=MAX_PATH), NoNul]
    preempt_signal: SignalName  # PHALANX_PREEMPT_SIGNAL
    preempt_grace_s: Seconds  # PHALANX_PREEMPT_DEADLINE: seconds from a notice to the kill
    notices: list[Notice] = Field(default=[], max_length=1024)
    # The Unix account the job runs as on the node (docs/security.md): `user` by name
    # unless an admin set a uid (and gid) for that user.
    uid: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None
    gid: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None
    # --mem: the job's memory limit on this node (its cgroup)
    mem_mb: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    # An array task's SLURM_ARRAY_TASK_COUNT/_MIN/_MAX/_STEP (None: not an array task).
    array_task_count: Annotated[int, Field(ge=1, le=MAX_ARRAY_TASKS)] | None = None
    array_task_min: Annotated[int, Field(ge=0, le=4_000_000)] | None = None
    array_task_max: Annotated[int, Field(ge=0, le=4_000_000)] | None = None
    array_task_step: Annotated[int, Field(ge=1, le=4_000_000)] | None = None


MAX_PEERS = 16  # peers per node in a desired state (the head sends at most 8)


class Peer(Lenient):
    """Another node's agent, asked during a head outage (GET /v1/peer/head)."""

    name: Name
    agent_url: str


class PeerHeadView(Lenient):
    """An agent's answer to a peer: how long ago the head last answered it (None: never
    since it started), by its own monotonic clock."""

    name: Name
    head_age_s: float | None
    # The head's last answer to it said it was still catching up after a restart
    # (DesiredState.catching_up): a peer the head has not answered yet rides on.
    head_catching_up: bool = False


class DesiredState(Lenient):
    version: Counter
    jobs: list[Assignment] = Field(max_length=MAX_LIST)
    heartbeat_s: Annotated[Seconds, Field(gt=0)]
    lease_s: Annotated[Seconds, Field(gt=0)]  # the agent fences after this long unanswered
    kill_grace_s: Seconds
    health_ack: Counter = 0  # the highest GpuHealthEvent.seq of this node the head has handled
    # Head outages (docs/fault-tolerance.md#head-outages): the agents this node asks "did
    # you hear from the head?" when its lease runs out, the cluster-wide secret they accept
    # (never given to jobs), the head's requeue margin and the longest outage jobs outlive.
    # An empty `peers` keeps the old rule: fence when the lease runs out.
    peers: list[Peer] = Field(default=[], max_length=MAX_PEERS)
    peer_secret: Annotated[str, StringConstraints(max_length=256), NoNul] = ""
    requeue_margin_s: Seconds = 0.0
    max_outage_s: Seconds = 0.0
    # Delta reports (docs/control-plane.md#heartbeats-at-scale): the `seq` of this node's
    # report the head holds (None: a head that predates deltas, or no numbered report
    # yet), and whether the next report must be full (the head does not hold its base).
    report_ack: Counter | None = None
    full_report: bool = False
    # A restarted head still hearing its nodes back (head/rejoin.py): it judges no node's
    # silence meanwhile; agents pass this on to their peers (PeerHeadView).
    catching_up: bool = False


# ----------------------------------------------------------------------------- auth admin
class WhoAmI(Lenient):
    user: str
    role: Role
    teams: list[str]
    admin_of: list[str]
    default_team: str | None = None  # where a submit without a team goes (sinfo's `*`)


class UserCreate(Wire):
    name: Name
    admin: bool = False
    teams: list[Name] = Field(default=[], max_length=1024)
    team_admin_of: list[Name] = Field(default=[], max_length=1024)
    default_team: Name | None = None
    # The Unix account on the nodes (docs/security.md); None: the account named `name`.
    uid: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None
    gid: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None


class UserInfo(Lenient):
    name: str
    admin: bool
    teams: list[str]
    team_admin_of: list[str]
    default_team: str | None
    uid: int | None = None
    gid: int | None = None
    qos: list[str] | None = None  # QOS this user may use (None: the team's, else `normal`)
    disabled: bool = False  # its tokens are refused (`phalanx admin user disable`)


class UserUpdate(Wire):
    """`PATCH /v1/users/{name}` (`phalanx admin user set`): only the fields sent change.
    `uid`/`gid` map the user to a Unix account (`clear`: back to the account named like
    the user); `qos` is the QOS the user may use (`low` is always allowed; null clears the
    user's own allowance, so the team's, else the default, applies)."""

    uid: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None
    gid: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None
    clear: bool = False
    qos: list[Name] | None = Field(default=None, max_length=64)


class UserList(Lenient):
    users: list[UserInfo]


MAX_TOKEN_TTL_S = 10 * 366 * 86400  # ten years


class TokenCreate(Wire):
    user: Name
    description: Annotated[str, StringConstraints(max_length=200), NoNul] = ""
    # Seconds until it expires (None: the head's default, 90 days unless set). Never past
    # the expiry of the token that mints it.
    expires_s: Annotated[float, Field(gt=0, le=MAX_TOKEN_TTL_S)] | None = None


class JoinTokenCreate(Wire):
    """A join token: single use or reusable until it expires, optionally bound to node
    names (globs: `gpu-*`) and address ranges (CIDRs), checked against the registering
    name, its address and the TCP peer's address."""

    description: Annotated[str, StringConstraints(max_length=200), NoNul] = ""
    single_use: bool = False
    expires_s: Annotated[float, Field(gt=0, le=MAX_TOKEN_TTL_S)] | None = None  # None: 24 h
    nodes: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.@+*?\[\]-]{1,128}$")]] = (
        Field(default=[], max_length=100)
    )
    addresses: list[Annotated[str, StringConstraints(min_length=1, max_length=64)]] = Field(
        default=[], max_length=100
    )


class TokenIssued(Lenient):
    id: int
    token: str  # shown once; only its hash is stored
    user: str | None
    kind: Literal["api", "join", "metrics"]
    expires: float | None = None  # unix seconds; None: never


class TokenInfo(Lenient):
    id: int
    user: str | None
    kind: Literal["api", "join", "node", "metrics"]
    description: str
    created: float
    last_used: float | None
    revoked: bool
    expires: float | None = None  # unix seconds; None: never
    node: str | None = None  # a node credential's node
    single_use: bool = False
    nodes: list[str] = []  # a join token's name bindings
    addresses: list[str] = []  # a join token's address bindings


class TokenList(Lenient):
    tokens: list[TokenInfo]


class TeamSpec(Wire):
    name: Name
    quota_gpus: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None  # None: unlimited
    cohort: Name | None = None
    borrowing_limit: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = None
    weight: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] | None = None
    # QOS its members may use (None: `normal`; `low` always)
    qos: list[Name] | None = Field(default=None, max_length=64)


class TeamInfo(Lenient):
    name: str
    quota_gpus: int | None
    cohort: str | None
    borrowing_limit: int | None
    weight: float | None
    qos: list[str] | None = None
    gpus_in_use: int
    members: list[str]


class TeamList(Lenient):
    teams: list[TeamInfo]


# ----------------------------------------------------------------------------- standing
class PendingPriority(Lenient):
    """One queued job's place in the scheduler's order and the numbers that put it there
    (`phalanx priority`, like sprio)."""

    rank: Annotated[int, Field(ge=1, le=MAX_INT32)]  # 1: considered first by the next cycle
    job_id: JobId
    user: Annotated[str, StringConstraints(max_length=128)]
    team: Label
    qos: Label
    qos_priority: Annotated[int, Field(ge=0, le=MAX_INT32)]  # the QOS's class: higher first
    fairshare: Annotated[float, Field(ge=0, le=1e18, allow_inf_nan=False)]  # lower first
    age_s: Seconds  # since submission: older first among equals


class PriorityList(Lenient):
    policy: Label  # the ordering policy the head runs
    order: Text  # what the policy orders by, in words
    jobs: list[PendingPriority] = Field(max_length=1_000_000)


class TeamShare(Lenient):
    """A team's quota, use and fair-share standing as the scheduler sees them now
    (`phalanx share`, like sshare)."""

    team: Label
    quota_gpus: Count | None  # None: no quota
    cohort: Label | None
    borrowing_limit: Count | None
    share: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]  # fair-share weight
    gpus_in_use: Count
    borrowed_gpus: Count  # in use above its quota (lent by its cohort)
    usage_gpu_h: Annotated[float, Field(ge=0, le=1e15, allow_inf_nan=False)]  # decayed
    fairshare: Annotated[float, Field(ge=0, le=1e18, allow_inf_nan=False)]  # usage / share
    pending_jobs: Count
    pending_gpus: Count


class ShareList(Lenient):
    policy: Label
    uses_fairshare: bool  # whether the policy orders teams by fair share at all
    halflife_s: Seconds  # usage decays by half over this long
    teams: list[TeamShare] = Field(max_length=100_000)


class ErrorBody(Lenient):
    detail: str


class NotifyCounts(Lenient):
    """Webhook deliveries since the head started: posted (2xx), failed (every try, or a
    URL no longer allowed) and dropped (the queue was full)."""

    sent: Count = 0
    failed: Count = 0
    dropped: Count = 0
    queued: Count = 0


class Health(Lenient):
    status: Literal["ok"]
    version: str
    # A standby head (PostgreSQL leader election, docs/high-availability.md) answers
    # /healthz only; every other endpoint answers 503 until it becomes the leader.
    role: Literal["leader", "standby"] = "leader"
    # Unexpected exceptions the daemon's loops caught, logged and survived since it started
    # (agent: reconcile, heartbeat, health; head: the control loop).
    loop_errors: Count = 0
    # Job notifications (head only; docs/control-plane.md#job-notifications).
    notifications: NotifyCounts | None = None


# ----------------------------------------------------------------------------- exec
MAX_EXEC_ARGV_BYTES = 128 * 1024  # an exec's argv, all arguments together (UTF-8 bytes)
MAX_EXEC_TIMEOUT_S = 3600
DEFAULT_EXEC_TIMEOUT_S = 600
MAX_EXEC_OUTPUT_BYTES = 16 * 1024 * 1024  # stdout + stderr an exec streams back


def _argv_size(argv: list[str]) -> list[str]:
    size = sum(len(a.encode()) + 1 for a in argv)
    if size > MAX_EXEC_ARGV_BYTES:
        raise ValueError(f"the command is {size} bytes; at most {MAX_EXEC_ARGV_BYTES} may be sent")
    return argv


ExecArgv = Annotated[list[Arg], Field(min_length=1, max_length=4096), AfterValidator(_argv_size)]


class ExecRequest(Wire):
    """`POST /v1/jobs/{id}/exec` (`phalanx exec`): run `argv` beside rank `rank`, as the
    job's user, in its cgroup, with the rank's environment and working directory."""

    argv: ExecArgv
    rank: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    timeout_s: Annotated[int, Field(ge=1, le=MAX_EXEC_TIMEOUT_S)] = DEFAULT_EXEC_TIMEOUT_S


class ExecLaunch(Lenient):
    """The head asks the rank's agent to run an exec (`POST /v1/exec`, agent secret)."""

    job_id: JobId
    epoch: Count
    rank: Count
    argv: ExecArgv
    timeout_s: Annotated[int, Field(ge=1, le=MAX_EXEC_TIMEOUT_S)]
    max_output_bytes: Annotated[int, Field(ge=1, le=MAX_EXEC_OUTPUT_BYTES)] = MAX_EXEC_OUTPUT_BYTES


class ExecFrame(Lenient):
    """One line of an exec's answer (NDJSON, streamed agent → head → client): output as it
    comes, a keepalive while there is none, and last the exit."""

    kind: Literal["stdout", "stderr", "keepalive", "exit"]
    data: str = ""
    exit_code: int | None = None  # `exit`: the command's code (None: killed by `signal`)
    signal: int | None = None
    timed_out: bool = False  # `exit`: killed at the request's timeout_s
    truncated: bool = False  # `exit`: killed once its output passed the limit
    message: str | None = None  # `exit`: why it ended early, in words


# ----------------------------------------------------------------------------- srun steps
class StepTask(Lenient):
    task_id: Count  # SLURM_PROCID within the step
    local_id: Count  # SLURM_LOCALID
    node_id: Annotated[int, Field(ge=0, lt=MAX_NODES)]  # SLURM_NODEID
    argv: list[Arg] = Field(min_length=1, max_length=MAX_LIST)
    # srun's own environment, forwarded
    env: Annotated[dict[EnvKey, EnvValue], Field(max_length=MAX_LIST)] = {}


class StepLaunch(Lenient):
    job_id: JobId
    step_id: Count
    workdir: PathText
    tasks: list[StepTask] = Field(min_length=1, max_length=4096)


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
    message: Annotated[str, StringConstraints(max_length=500), NoNul] = "injected fault"
