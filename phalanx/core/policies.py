"""Queue-ordering policies, registered by name (`priority` is the default).

A policy orders jobs in two steps so a cycle never sorts the whole queue: `static_key` keeps
each team's queue sorted as jobs arrive (it may not change while a job waits), and
`merge_key` orders the heads of the team queues against each other (it may add per-team
values such as fair share that change between cycles, but must keep each team's own order).
A preemptive policy (`srtf`, `las`) also ranks jobs by a number, lower first: a pending job
outranks a running one when `pending_rank(p) · rank_margin < running_rank(v, now)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.core.model import JobRequest, RunningJob

StaticKey = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class OrderingPolicy:
    name: str
    description: str
    static_key: Callable[[JobRequest], StaticKey]
    uses_fairshare: bool = False
    needs_duration: bool = False
    pending_rank: Callable[[JobRequest], float] | None = None
    running_rank: Callable[[RunningJob, float], float] | None = None
    rank_margin: float = 1.0

    @property
    def preemptive(self) -> bool:
        return self.pending_rank is not None and self.running_rank is not None

    def outranks(self, p: JobRequest, v: RunningJob, now: float) -> bool:
        """Whether pending `p` may preempt running `v` under this policy's ranking."""
        if self.pending_rank is None or self.running_rank is None:
            return False
        return self.pending_rank(p) * self.rank_margin < self.running_rank(v, now)

    def merge_key(self, key: StaticKey, fairshare: float) -> StaticKey:
        if self.uses_fairshare:
            return (key[0], fairshare, *key[1:])
        return key

    def merge_bound(self, bound: StaticKey, fairshare: float) -> tuple[StaticKey]:
        """A probe into a team's queue of (static key, job id) entries: the entries below
        it are exactly those whose `merge_key` with the team's `fairshare` is below `bound`
        (another team's merged key), so one bisection finds how many of the team's jobs
        come next in the merge. Static keys are (class, …, job id) of finite numbers."""
        if not self.uses_fairshare:
            return (bound,)
        first, other = bound[0], bound[1]
        if fairshare < other:  # below iff its first element is at most the bound's
            return ((first, math.inf),)
        if fairshare > other:  # below iff its first element is below the bound's
            return ((first,),)
        return ((first, *bound[2:]),)  # equal shares: the rest decides


def _remaining(job: JobRequest) -> float:
    if job.duration_s is None:
        raise ValueError(f"job {job.id}: this policy needs a known duration")
    return max(0.0, job.duration_s - job.attained_s)


def _running_remaining(v: RunningJob, now: float) -> float:
    return _remaining(v.request) - (now - v.start_s)


# Tiresias-style discretised least-attained-service: attained GPU-seconds → queue level.
LAS_THRESHOLDS_GPU_S: tuple[float, ...] = (3600.0, 36000.0)


def las_level(attained_gpu_s: float) -> int:
    for level, bound in enumerate(LAS_THRESHOLDS_GPU_S):
        if attained_gpu_s < bound:
            return level
    return len(LAS_THRESHOLDS_GPU_S)


def _las_pending(p: JobRequest) -> float:
    return las_level(p.attained_s * p.gpus)


def _las_running(v: RunningJob, now: float) -> float:
    return las_level((v.request.attained_s + now - v.start_s) * v.request.gpus)


POLICIES: dict[str, OrderingPolicy] = {}


def register(policy: OrderingPolicy) -> OrderingPolicy:
    if policy.name in POLICIES:
        raise ValueError(f"policy {policy.name!r} is already registered")
    POLICIES[policy.name] = policy
    return policy


DEFAULT_POLICY = "priority"

register(
    OrderingPolicy(
        name="priority",
        description="priority class, then fair share (decayed team usage / share), then age",
        static_key=lambda j: (-j.priority, j.submit_s, j.id),
        uses_fairshare=True,
    )
)
register(
    OrderingPolicy(
        name="fifo",
        description="first come, first served by submit time",
        static_key=lambda j: (j.submit_s, j.id),
    )
)
register(
    OrderingPolicy(
        name="sjf",
        description="shortest job first (needs known durations; for simulation)",
        static_key=lambda j: (_remaining(j) + j.attained_s, j.submit_s, j.id),
        needs_duration=True,
    )
)
register(
    OrderingPolicy(
        name="srtf",
        description="shortest remaining time first, preemptive (needs known durations)",
        static_key=lambda j: (_remaining(j), j.submit_s, j.id),
        needs_duration=True,
        pending_rank=_remaining,
        running_rank=_running_remaining,
        rank_margin=2.0,  # preempt only for a clearly shorter job, to avoid thrashing
    )
)
register(
    OrderingPolicy(
        name="las",
        description=(
            "least attained service in discrete queues, as in Tiresias (no durations needed); "
            "FIFO inside a queue, preemptive across queues"
        ),
        static_key=lambda j: (_las_pending(j), j.submit_s, j.id),
        pending_rank=_las_pending,
        running_rank=_las_running,
    )
)


def get_policy(name: str) -> OrderingPolicy:
    try:
        return POLICIES[name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {name!r}; known policies: {known}") from None
