"""Delta heartbeats, the agent's side: number each report and send only what changed since
the one the head acknowledged (README.md#heartbeats-at-scale; the head's side is
head/deltas.py).

The base of a delta is always a report the head said it holds (`DesiredState.report_ack`),
never one merely sent: a delta the head did not acknowledge (a lost answer, a head that
went away) is not a base, so everything it carried is carried again by the next one, and
no exit status is lost. With no base (the first report, a head that predates deltas and
acknowledges nothing, a head that asks for it, another head) the report is full.

GPU readings ride along only when they changed materially since the ones the head holds
(a GPU's utilisation by 10 points, its memory by 1 GiB, its temperature by 5 °C, its power
by 50 W, the job holding it, the set of GPUs), otherwise once GPU_REFRESH_S have passed
since the readings the head holds were sent: the heartbeat's readings only feed the head's
live views (which call a reading older than 60 s stale); the telemetry pipeline
(agent/telemetry.py) carries every sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from phalanx.api.models import (
    GpuTelemetry,
    Heartbeat,
    NodeHealth,
    ProcessStatus,
    RankRef,
    ReportDelta,
)

GPU_REFRESH_S = 20.0  # a delta carries GPU readings at least this often (seconds)
_KEPT = 16  # reports kept until acknowledged (or older than the acknowledged one)
# What moves a reading "materially" (README: Heartbeats at scale).
UTIL_PP, MEMORY_MB, TEMPERATURE_C, POWER_W = 10.0, 1024, 5.0, 50.0

RankKey = tuple[int, int, int]  # (job id, epoch, rank)


@dataclass(frozen=True, slots=True)
class _Report:
    """A report as sent: what a delta against it must compare with."""

    seq: int
    processes: dict[RankKey, ProcessStatus]
    ports: dict[str, int]
    health: NodeHealth
    gpus: tuple[GpuTelemetry, ...]  # the readings the head holds once it holds this one
    gpus_at: float  # when those readings were sent (the stream's clock)


class ReportStream:
    """Numbers an agent's reports and makes each a delta against the acknowledged one."""

    def __init__(
        self, gpu_refresh_s: float = GPU_REFRESH_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.gpu_refresh_s = gpu_refresh_s
        self.clock = clock
        self._seq = 0
        self._sent: dict[int, _Report] = {}
        self._base: _Report | None = None
        self.full_reports = 0  # sent, for tests and benchmarks
        self.delta_reports = 0

    @property
    def base(self) -> int | None:
        """The seq of the acknowledged report the next delta builds on (None: full next)."""
        return self._base.seq if self._base is not None else None

    def report(
        self,
        *,
        name: str,
        version: int,
        wait_s: float,
        processes: Sequence[ProcessStatus],
        ports: dict[str, int],
        gpus: Sequence[GpuTelemetry],
        health: NodeHealth,
    ) -> Heartbeat:
        """The next report: a delta against the acknowledged one, or a full one if there
        is none. Raises pydantic's ValidationError if a value is out of bounds."""
        seq = self._seq + 1
        now = self.clock()
        procs = {(p.job_id, p.epoch, p.rank): p for p in processes}
        base = self._base
        if base is None:
            hb = Heartbeat(
                name=name,
                version=version,
                wait_s=wait_s,
                processes=list(processes),
                master_ports=dict(ports),
                gpus=list(gpus),
                health=health,
                seq=seq,
            )
            sent = _Report(seq, procs, dict(ports), health, tuple(gpus), now)
        else:
            stale = now - base.gpus_at >= self.gpu_refresh_s
            send_gpus = stale or _moved(base.gpus, gpus)
            # Unacknowledged GPU events are repeated until the head acknowledges them.
            send_health = bool(health.events) or health != base.health
            gone = sorted(base.processes.keys() - procs.keys())
            delta = ReportDelta(
                base=base.seq,
                processes=[p for k, p in procs.items() if base.processes.get(k) != p],
                gone=[RankRef(job_id=j, epoch=e, rank=r) for j, e, r in gone],
                master_ports={k: v for k, v in ports.items() if base.ports.get(k) != v},
                ports_gone=sorted(base.ports.keys() - ports.keys()),
            )
            hb = Heartbeat(
                name=name,
                version=version,
                wait_s=wait_s,
                processes=None,
                master_ports=None,
                gpus=list(gpus) if send_gpus else None,
                health=health if send_health else None,
                seq=seq,
                delta=delta,
            )
            readings = (tuple(gpus), now) if send_gpus else (base.gpus, base.gpus_at)
            sent = _Report(seq, procs, dict(ports), health, *readings)
        self._seq = seq
        self._sent[seq] = sent
        if len(self._sent) > _KEPT:
            del self._sent[min(self._sent)]
        if hb.delta is None:
            self.full_reports += 1
        else:
            self.delta_reports += 1
        return hb

    def answered(self, report_ack: int | None, full_report: bool) -> None:
        """The head answered: it holds report `report_ack` (None: none, or a head that
        predates deltas), and asks for a full report if `full_report`."""
        known = self._sent.get(report_ack) if report_ack is not None else None
        if full_report or known is None:
            self._base = None
            return
        self._base = known
        for seq in [s for s in self._sent if s < known.seq]:
            del self._sent[seq]

    def reset(self) -> None:
        """The next report is full: the agent registered anew, talks to another head, or a
        head refused a delta (one that predates deltas, 422)."""
        self._base = None


def _moved(held: Sequence[GpuTelemetry], now: Sequence[GpuTelemetry]) -> bool:
    """Whether readings `now` differ materially from those the head holds."""
    if len(held) != len(now):
        return True
    for a, b in zip(held, now, strict=True):
        if a.index != b.index or a.job_id != b.job_id:
            return True
        if _apart(a.utilization_pct, b.utilization_pct, UTIL_PP):
            return True
        if _apart(a.memory_used_mb, b.memory_used_mb, MEMORY_MB):
            return True
        if _apart(a.temperature_c, b.temperature_c, TEMPERATURE_C):
            return True
        if _apart(a.power_w, b.power_w, POWER_W):
            return True
    return False


def _apart(a: float | None, b: float | None, step: float) -> bool:
    if a is None or b is None:
        return (a is None) != (b is None)
    return abs(a - b) >= step
