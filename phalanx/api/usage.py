"""Wire types of idle-GPU policy and flags, and of usage reports (`/v1/reports/usage`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from phalanx.api.models import Count, GpuIndex, Lenient, UnixTime, Wire

IdleActionName = Literal["notify", "preempt", "cancel"]
MAX_WINDOW_S = 30 * 86400.0  # a month
GroupBy = Literal["user", "team", "qos"]
Period = Literal["day", "month"]
Hours = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]
Pct = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
Span = Annotated[float, Field(ge=0, le=10 * 365 * 86400, allow_inf_nan=False)]


class IdlePolicySpec(Wire):
    """A team's idle-GPU policy: a GPU at or below `threshold_pct` utilisation for
    `window_s` without a break is flagged (an event in its job's log); flagged for
    `grace_s` more, `action` applies to the job (notify: the event only)."""

    action: IdleActionName = "notify"
    window_s: Annotated[float, Field(ge=10, le=MAX_WINDOW_S, allow_inf_nan=False)] = 1800.0
    grace_s: Annotated[float, Field(ge=0, le=MAX_WINDOW_S, allow_inf_nan=False)] = 600.0
    threshold_pct: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 1.0


class IdlePolicyInfo(Lenient):
    team: str
    action: IdleActionName
    window_s: Span
    grace_s: Span
    threshold_pct: Pct
    default: bool  # the team set none: the default applies


class IdlePolicyList(Lenient):
    policies: list[IdlePolicyInfo]


class IdleGpu(Lenient):
    """A GPU flagged idle: allocated to `job_id`, idle since `idle_since`."""

    job_id: Annotated[int, Field(ge=1, le=2**31 - 1)]
    epoch: Count
    node: str
    index: GpuIndex
    user: str
    team: str
    idle_since: UnixTime
    flagged_at: UnixTime
    last_sample: UnixTime
    idle_s: Span  # from idle_since to the last sample
    action: IdleActionName
    action_at: UnixTime | None  # when the action applies (None: notify only)
    acted: bool  # the action was applied to this run of the job


class IdleGpuList(Lenient):
    gpus: list[IdleGpu]


class UsageRow(Lenient):
    """One group's usage in one period (or `total`)."""

    period: str  # YYYY-MM-DD or YYYY-MM (UTC), or `total`
    key: str  # the user, team or QOS
    alloc_gpu_hours: Hours  # GPUs held × hours
    util_gpu_hours: Hours  # ∑ utilisation × hours over the GPUs held
    idle_gpu_hours: Hours  # hours GPUs held were flagged idle
    utilization_pct: Pct | None  # util / alloc
    jobs: Count  # jobs that ended in the period
    failures: Count  # … as failed, node failure, out of memory or timeout
    preemptions: Count


class UsageReport(Lenient):
    by: GroupBy
    per: Period
    since: str  # the first day (UTC), inclusive
    until: str  # the day after the last, exclusive
    rows: list[UsageRow]
    total: UsageRow
