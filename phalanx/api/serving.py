"""Wire models of serving deployments (`/v1/serve/...`, `phalanx serve`, the router).

A deployment runs a real inference engine (llama.cpp's llama-server, vLLM, or any command
speaking the OpenAI API) as replica pools — one `aggregated` pool, or a `prefill` and a
`decode` pool — each replica a job to the core scheduler. The router (its own process)
reads the ready replicas from `GET /v1/serve/deployments/{name}/endpoints` and spreads
OpenAI requests over them (docs/serving.md).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from phalanx.api.models import (
    Arg,
    Count,
    JobId,
    Label,
    Lenient,
    Message,
    Name,
    NoNul,
    PathText,
    Token,
    UnixTime,
    Url,
    Wire,
)
from phalanx.api.states import JobStateCode

Engine = Literal["llama.cpp", "vllm", "custom"]
PoolRole = Literal["aggregated", "prefill", "decode"]
Policy = Literal["round-robin", "least-load", "power-of-two", "kv-aware", "kv-aware-simple"]

MAX_REPLICAS = 1024
MAX_ENGINE_ARGS = 256
MAX_SLOTS = 1024
# A deployment's name is part of URLs and job names: a DNS label.
DeploymentName = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z]([a-z0-9-]*[a-z0-9])?$")
]
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=256), NoNul]
Millis = Annotated[float, Field(gt=0, le=3_600_000, allow_inf_nan=False)]
# Who runs an autoscaler (e.g. "router@host:8000-1234"): one holder per deployment.
AutoscalerId = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@-]+$")
]


class SLO(Wire):
    """Latency targets a pool is scaled to hold (as `vllm bench serve` measures them):
    time to first token, and time per output token after the first."""

    ttft_ms: Millis | None = None
    tpot_ms: Millis | None = None
    # The share of requests that must meet both targets (goodput's attainment).
    attainment: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.9


class PoolSpec(Wire):
    """One pool of identical replicas."""

    role: PoolRole = "aggregated"
    replicas: Annotated[int, Field(ge=0, le=MAX_REPLICAS)] = 1
    # The autoscaler's bounds (None: the pool is not autoscaled, `replicas` holds).
    min_replicas: Annotated[int, Field(ge=0, le=MAX_REPLICAS)] | None = None
    max_replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] | None = None
    gpus_per_replica: Annotated[int, Field(ge=0, le=64)] = 1  # tensor-parallel size
    cpus_per_replica: Annotated[int, Field(ge=1, le=4096)] = 1
    mem_mb: Annotated[int, Field(ge=1, le=16 * 1024 * 1024)] | None = None
    # Concurrent sequences per replica (llama-server `-np`, vLLM `--max-num-seqs`).
    slots: Annotated[int, Field(ge=1, le=MAX_SLOTS)] = 4
    args: list[Arg] = Field(default_factory=list, max_length=MAX_ENGINE_ARGS)  # engine flags
    slo: SLO | None = None

    @model_validator(mode="after")
    def _bounds(self) -> PoolSpec:
        lo, hi = self.min_replicas, self.max_replicas
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_replicas {lo} is above max_replicas {hi}")
        return self


class RouterSpec(Wire):
    policy: Policy = "kv-aware"
    # The prefix index hashes the prompt in blocks of this many characters (the router
    # sees text, not the engine's tokens; ~4 characters make a token).
    block_chars: Annotated[int, Field(ge=16, le=65536)] = 256


class DeploymentSpec(Wire):
    """What `phalanx serve apply deploy.yaml` sends (YAML keys = these fields)."""

    name: DeploymentName
    engine: Engine
    # The model as the engine loads it: a GGUF file (llama.cpp), a folder or name (vLLM).
    model: PathText
    # What clients put in the OpenAI `model` field (default: the deployment's name).
    served_model_name: ModelName | None = None
    # The engine's program: llama.cpp → the llama-server binary; vLLM → the `python` of the
    # environment vLLM is installed in (never imported into Phalanx); custom → argv[0].
    engine_path: PathText
    # custom only: the rest of the command; `{port}`, `{host}`, `{model}` are filled in.
    command: list[Arg] = Field(default_factory=list, max_length=MAX_ENGINE_ARGS)
    # The `python` that runs the replica wrapper (`-m phalanx.serve.replica`) on the nodes
    # (default: the head's own interpreter, as on a cluster installed in one shared venv).
    runtime_python: PathText | None = None
    team: Name | None = None
    qos: Label | None = None
    pools: list[PoolSpec] = Field(min_length=1, max_length=2)
    router: RouterSpec = Field(default_factory=RouterSpec)
    # Shared storage for the prefill → decode hand-off of llama.cpp slots.
    handoff_dir: PathText | None = None

    @model_validator(mode="after")
    def _pools(self) -> DeploymentSpec:
        roles = sorted(p.role for p in self.pools)
        if roles not in (["aggregated"], ["decode", "prefill"]):
            raise ValueError(
                "pools must be one `aggregated` pool, or one `prefill` and one `decode` pool"
            )
        if self.engine == "custom" and roles != ["aggregated"]:
            raise ValueError("a custom engine serves one aggregated pool (no KV hand-off)")
        if roles == ["decode", "prefill"] and self.engine == "llama.cpp" and not self.handoff_dir:
            raise ValueError("a disaggregated llama.cpp deployment needs handoff_dir")
        # A saved slot restores only into a llama-server with as many slots (-np).
        split_llama = roles == ["decode", "prefill"] and self.engine == "llama.cpp"
        if split_llama and len({p.slots for p in self.pools}) > 1:
            raise ValueError("llama.cpp prefill and decode pools need the same slots (-np)")
        return self


class ReplicaInfo(Lenient):
    job_id: JobId
    pool: PoolRole
    generation: Count  # the deployment's spec generation the replica runs
    state: JobStateCode
    url: Url | None = None  # http://address:port once the engine listens
    ready: bool = False
    retiring: bool = False  # cancelled by the controller (scale down, update, delete)
    node: Name | None = None  # where its job runs (the first node of its placement)


class PoolStatus(Lenient):
    role: PoolRole
    desired: Count
    ready: Count
    # Replicas of this pool that ended on their own (failed, node lost, engine died) since
    # one was last ready; while it is above 0, replacements wait `backoff_until`.
    failures: Count = 0
    last_failure: Message | None = None  # why the last one ended, as `phalanx serve show` says
    backoff_until: UnixTime | None = None  # no replacement is submitted before then


MAX_ROUTERS = 16  # routers whose summaries the head keeps per deployment
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Latency = Annotated[float, Field(ge=0, le=3_600_000, allow_inf_nan=False)]  # milliseconds
Amount = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]


class PoolStats(Wire):
    """One pool as one router saw it over its last window: its own measurements (requests
    that ended in the window, TTFT/TPOT percentiles, errors, SLO attainment) and, now,
    requests in flight and queued, and the engines' own numbers (KV usage, engine queue,
    prefix-cache hit rate: the pool's replicas' latest /metrics, None where the engine does
    not export it)."""

    role: PoolRole
    requests: Count  # ended in the window
    requests_per_s: Amount
    errors: Count
    error_rate: Fraction
    ttft_p50_ms: Latency | None = None
    ttft_p90_ms: Latency | None = None
    tpot_p50_ms: Latency | None = None
    tpot_p90_ms: Latency | None = None
    in_flight: Count = 0
    queued: Count = 0  # waiting in the router (for a replica, a hand-off slot)
    replicas_ready: Count = 0
    engine_running: Amount | None = None  # summed over the pool's replicas
    engine_waiting: Amount | None = None  # summed: queued inside the engines
    kv_usage: Fraction | None = None  # mean over the pool's replicas
    cache_hit_rate: Fraction | None = None  # the engines' prefix-cache hits / lookups
    # Share of the window's requests within the pool's SLO (both targets); None: no SLO
    # or no request.
    slo_attainment: Fraction | None = None


class RouterStatsReport(Wire):
    """`POST /v1/serve/deployments/{name}/stats` (the router's token, every ~5 s)."""

    router: Label  # which router (its listen address, or --router-id)
    window_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)]
    pools: list[PoolStats] = Field(max_length=3)
    # Prompt blocks the router's prefix index predicted cached / routed, since it started.
    predicted_hit_rate: Fraction | None = None

    @model_validator(mode="after")
    def _one_per_pool(self) -> RouterStatsReport:
        roles = [p.role for p in self.pools]
        if len(set(roles)) != len(roles):
            raise ValueError("pools: one entry per pool role")
        return self


class RouterStatsInfo(Lenient):
    """A router's latest report as the head keeps it (in memory): stale past 30 s."""

    report: RouterStatsReport
    reported_at: UnixTime
    stale: bool = False


class DeploymentInfo(Lenient):
    spec: DeploymentSpec
    owner: Name
    generation: Count  # moves on every `apply` that changes the spec
    created_at: UnixTime
    pools: list[PoolStatus] = Field(max_length=2)
    replicas: list[ReplicaInfo] = Field(max_length=2 * MAX_REPLICAS * 2)
    # The team the replicas run under (spec.team, else the owner's default when applied):
    # the router lets its members call the deployment.
    team: Name | None = None
    # The latest summary of each router that reported in (docs/serving-metrics.md).
    stats: list[RouterStatsInfo] = Field(default_factory=list, max_length=MAX_ROUTERS)
    # Who holds the deployment's autoscaler lease now (None: no autoscaler acts).
    autoscaler: AutoscalerId | None = None


class DeploymentList(Lenient):
    deployments: list[DeploymentInfo] = Field(max_length=10_000)


class ScaleRequest(Wire):
    pool: PoolRole = "aggregated"
    replicas: Annotated[int, Field(ge=0, le=MAX_REPLICAS)]
    # Why (shown in the head's event log), e.g. the autoscaler's decision.
    reason: Annotated[str, StringConstraints(max_length=512), NoNul] | None = None
    # Set by an autoscaler: the head refuses (409) unless it holds the deployment's
    # autoscaler lease (POST /v1/serve/deployments/{name}/autoscaler).
    autoscaler: AutoscalerId | None = None


class AutoscalerClaim(Wire):
    """`POST /v1/serve/deployments/{name}/autoscaler`: take or renew the deployment's
    autoscaler lease for `ttl_s` seconds (409 while another holder's lease is live)."""

    holder: AutoscalerId
    ttl_s: Annotated[float, Field(ge=1, le=600, allow_inf_nan=False)] = 30.0


class AutoscalerLease(Lenient):
    deployment: DeploymentName
    holder: AutoscalerId
    expires_in_s: Annotated[float, Field(ge=0, le=600)]


class Endpoint(Lenient):
    """A ready replica, as the router sees it."""

    job_id: JobId
    pool: PoolRole
    url: Url
    slots: Annotated[int, Field(ge=1, le=MAX_SLOTS)]
    generation: Count


class Endpoints(Lenient):
    """`GET /v1/serve/deployments/{name}/endpoints`: what the router routes to."""

    name: DeploymentName
    served_model_name: ModelName
    engine: Engine
    policy: Policy
    block_chars: Annotated[int, Field(ge=16, le=65536)]
    generation: Count
    # The engine's API key (every replica of the deployment starts with it): the engines
    # listen on the nodes' network, and only the router may call them.
    engine_key: Token
    endpoints: list[Endpoint] = Field(max_length=2 * MAX_REPLICAS * 2)


class ReplicaReport(Wire):
    """What a replica's wrapper tells the head (with its job's step token): the engine
    listens at `url`, and is ready (its health endpoint answers) or not."""

    url: Url
    ready: bool
    # The replica's job (PHALANX_JOB_ID): the head then checks the token against that job
    # only; a step token reports for its own job, never another.
    job_id: JobId | None = None


class ReplicaConfig(Lenient):
    """`GET /v1/serve/replicas/self` (the replica job's step token): what its wrapper
    starts — the deployment's spec, its pool, generation, and the engine's API key (never
    on a command line: the wrapper hands it to the engine in a 0600 file or its env)."""

    name: DeploymentName
    job_id: JobId
    pool: PoolRole
    generation: Count
    spec: DeploymentSpec
    engine_key: Token
