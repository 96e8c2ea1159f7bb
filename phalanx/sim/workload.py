"""Simulator workloads: the Philly and Pollux trace readers and a seeded synthetic generator."""

from __future__ import annotations

import csv
import gc
import io
import math
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np


class WorkloadError(ValueError):
    """A workload file or generator argument is unusable; the message names file and line."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a workload. Times in seconds; `duration_s` is the run time on an ideal
    placement (fewest nodes, one rack), before any slowdown the step-time model adds."""

    id: int
    submit_s: float  # seconds since the workload's origin
    duration_s: float  # > 0
    gpus: int  # total GPUs of the gang, ≥ 1
    team: str  # team, or the Philly virtual cluster (VC)
    priority: int = 0
    name: str = ""
    model: str = ""  # model / application name, where the trace says


JobFields = tuple[int, float, float, int, str, int, str, str]  # TraceJob's fields in order


def _make_jobs(rows: Iterable[JobFields]) -> tuple[TraceJob, ...]:
    """TraceJobs from tuples of all their fields, twice as fast as calling TraceJob(...).

    The frozen dataclass __init__ spends one object.__setattr__ call per field; writing the
    slot descriptors directly skips that, which halves construction time. The result is
    identical because TraceJob has no __post_init__ (a test checks both).
    """
    new = object.__new__
    s_id, s_submit, s_duration, s_gpus, s_team, s_priority, s_name, s_model = (
        TraceJob.__dict__[f.name].__set__ for f in fields(TraceJob)
    )
    out = []
    for i, submit, duration, gpus, team, priority, name, model in rows:
        job = new(TraceJob)
        s_id(job, i)
        s_submit(job, submit)
        s_duration(job, duration)
        s_gpus(job, gpus)
        s_team(job, team)
        s_priority(job, priority)
        s_name(job, name)
        s_model(job, model)
        out.append(job)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Workload:
    """Jobs sorted by (submit_s, id), a human description of where they came from, the
    wall-clock instant that submit_s = 0 stands for (None when the source has none), and the
    number of rows dropped as unusable (duration or GPU count ≤ 0)."""

    jobs: tuple[TraceJob, ...]
    source: str
    origin: datetime | None = None
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def gpu_seconds(self) -> float:
        """Total work: Σ gpus × duration_s, in GPU-seconds."""
        return math.fsum(j.gpus * j.duration_s for j in self.jobs)

    @property
    def span_s(self) -> float:
        """Seconds from the first submission to the last (0 for fewer than two jobs)."""
        return self.jobs[-1].submit_s - self.jobs[0].submit_s if self.jobs else 0.0

    def offered_load(self, gpus: int) -> float:
        """Σ gpus × duration / (cluster GPUs × submission span): the fraction of a `gpus`-GPU
        cluster the workload asks for while it arrives (≥ 1 means it cannot keep up)."""
        span = self.span_s
        if gpus <= 0 or span <= 0:
            raise WorkloadError(f"offered load needs gpus > 0 and a span > 0 ({self.source})")
        return self.gpu_seconds / (gpus * span)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many small acyclic objects: otherwise each young
    collection promotes them and the full collections rescan all of them (≈ 20–25 % of the
    time for 10⁵–10⁶ jobs)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _row_error(path: Path, row_no: int, row: list[str], e: Exception) -> WorkloadError:
    """A WorkloadError for a bad data row (`row_no` counts data rows from 0)."""
    if isinstance(e, IndexError):
        return WorkloadError(f"{path}:{row_no + 2}: too few columns ({len(row)}): {row}")
    return WorkloadError(f"{path}:{row_no + 2}: {e}")


def _open_csv(path: Path, required: tuple[str, ...]) -> tuple[Iterator[list[str]], list[int]]:
    """Open a CSV, check its header and return (rows, column index of each required name)."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: tolerate a spreadsheet's BOM
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{path}: not UTF-8 text: {e}") from None
    rows = csv.reader(io.StringIO(text, newline=""))
    header = [h.strip() for h in next(rows, [])]
    missing = [c for c in required if c not in header]
    if missing:
        raise WorkloadError(
            f"{path}:1: missing column(s) {', '.join(missing)}; header is {','.join(header)!r}"
        )
    return rows, [header.index(c) for c in required]


PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")


def read_philly(
    path: Path,
    start: datetime | None = None,
    end: datetime | None = None,
    vcs: Collection[str] | None = None,
) -> Workload:
    """Read the Philly job CSV (timestamp,duration,num_gpus,gpu_time,cluster; any row order).

    Keeps rows whose submit time lies in [start, end) and, if `vcs` is given, whose VC
    (the `cluster` column, used as the team) is listed. submit_s counts from `start`, or
    from the earliest kept timestamp when no start is given; ids are 0..n-1 in (submit
    time, file row) order. Rows with duration ≤ 0 or num_gpus ≤ 0 inside the selection
    are dropped and counted in `Workload.skipped`. Timestamps are naive (the trace has no
    zone), so `start` and `end` must be naive too. Each job's name is `philly-<row>`, its
    0-based data row in the file.
    """
    path = Path(path)
    for label, bound in (("start", start), ("end", end)):
        if bound is not None and bound.tzinfo is not None:
            raise WorkloadError(f"{path}: Philly timestamps are naive; pass a naive {label}")
    if start is not None and end is not None and end <= start:
        raise WorkloadError(f"{path}: empty window: end {end} is not after start {start}")
    wanted = None if vcs is None else frozenset(vcs)
    rows, (i_ts, i_dur, i_gpus, i_vc) = _open_csv(path, PHILLY_COLUMNS)
    parse = datetime.fromisoformat  # fixed 'YYYY-MM-DD HH:MM:SS': C-fast, no strptime
    with gc_paused():
        kept: list[tuple[datetime, int, float, int, str]] = []
        skipped = 0
        row_no, row = -1, list[str]()  # for the error message
        try:
            for row_no, row in enumerate(rows):
                if not row:
                    continue  # the file ends with a blank line
                vc = row[i_vc]
                if wanted is not None and vc not in wanted:
                    continue
                ts = parse(row[i_ts])
                if (start is not None and ts < start) or (end is not None and ts >= end):
                    continue
                duration = float(row[i_dur])
                gpus = int(row[i_gpus])
                if not 0.0 < duration < math.inf or gpus <= 0:
                    skipped += 1
                    continue
                kept.append((ts, row_no, duration, gpus, vc))
        except (ValueError, IndexError, csv.Error) as e:
            raise _row_error(path, row_no, row, e) from None
        kept.sort()  # (timestamp, row): rows are unique, so later fields are never compared
        origin = start if start is not None else kept[0][0] if kept else None
        jobs: tuple[TraceJob, ...] = ()
        window = ""
        if origin is not None:
            jobs = _make_jobs(
                (i, (ts - origin).total_seconds(), d, g, vc, 0, f"philly-{r}", "")
                for i, (ts, r, d, g, vc) in enumerate(kept)
            )
            # `end` is exclusive: name the last second it admits, as "10-01..11-30" reads.
            last = (
                end - timedelta(seconds=1) if end is not None else kept[-1][0] if kept else origin
            )
            window = f" {origin:%Y-%m-%d}..{last:%Y-%m-%d}"
    vc_note = f" VCs {','.join(sorted(wanted))}" if wanted is not None else ""
    return Workload(
        jobs, f"{path.name}{window}{vc_note} ({len(jobs):,} jobs)", origin, skipped=skipped
    )


@dataclass(frozen=True, slots=True)
class AppModel:
    """A modelled application: ideal run time on one GPU and a scaling overhead.

    Run time on n GPUs = single_gpu_h × 3600 / (n × efficiency(n)) seconds, with
    efficiency(n) = 1 / (1 + overhead × log₂ n): each doubling of a data-parallel gang adds
    roughly the same synchronisation cost (all-reduce latency, stragglers), and a model that
    communicates more per unit of compute has a larger overhead.
    """

    single_gpu_h: float
    overhead: float

    def efficiency(self, gpus: int) -> float:
        return 1.0 / (1.0 + self.overhead * math.log2(gpus))

    def duration_s(self, gpus: int) -> float:
        return self.single_gpu_h * 3600.0 / (gpus * self.efficiency(gpus))


# MODELLED, not measured. Pollux (Qiao et al., OSDI'21) derives run times from measured
# per-application throughput and convergence curves that are not part of this repository.
# Each single-GPU time here sits inside the GPU-time class Pollux's workload generator
# mapped the application to (cifar10/ncf < 1 GPU-h, deepspeech2/bert 1–10, yolov3 10–100,
# imagenet 100–1000), and each overhead gives 50–80 % efficiency at the replica counts the
# workloads use, the range Pollux picked its configurations from. Batch size is ignored.
POLLUX_APPS: dict[str, AppModel] = {
    "cifar10": AppModel(single_gpu_h=0.5, overhead=0.10),  # ResNet-18, CIFAR-10
    "ncf": AppModel(single_gpu_h=0.2, overhead=0.25),  # NeuMF, MovieLens: sync-bound
    "deepspeech2": AppModel(single_gpu_h=5.0, overhead=0.10),  # CMU-ARCTIC
    "bert": AppModel(single_gpu_h=2.0, overhead=0.08),  # fine-tuning on SQuAD
    "yolov3": AppModel(single_gpu_h=30.0, overhead=0.10),  # PASCAL VOC
    "imagenet": AppModel(single_gpu_h=200.0, overhead=0.06),  # ResNet-50, 90 epochs
}

POLLUX_COLUMNS = ("name", "time", "application", "num_replicas")
POLLUX_TEAM = "pollux"


def read_pollux(path: Path) -> Workload:
    """Read one Pollux workload CSV (name,time,application,num_replicas,batch_size).

    `time` is the arrival in seconds and `num_replicas` the GPU count. The files carry no
    durations: each is MODELLED from `POLLUX_APPS` (see `AppModel`) for the job's
    application and GPU count. All jobs belong to one team, "pollux" (the Pollux setting
    has no teams); the application is kept in `TraceJob.model`.
    """
    path = Path(path)
    rows, (i_name, i_time, i_app, i_reps) = _open_csv(path, POLLUX_COLUMNS)
    parsed: list[tuple[float, int, str, str, int]] = []
    row_no, row = -1, list[str]()  # for the error message
    try:
        for row_no, row in enumerate(rows):
            if not row:
                continue
            app, gpus, submit = row[i_app], int(row[i_reps]), float(row[i_time])
            if app not in POLLUX_APPS:
                known = ", ".join(sorted(POLLUX_APPS))
                raise ValueError(f"unknown application {app!r} (modelled: {known})")
            if gpus <= 0 or not submit >= 0:
                raise ValueError(f"num_replicas must be ≥ 1 and time ≥ 0, got {gpus}, {submit}")
            parsed.append((submit, row_no, row[i_name], app, gpus))
    except (ValueError, IndexError, csv.Error) as e:
        raise _row_error(path, row_no, row, e) from None
    parsed.sort()  # (time, row): rows are unique, so later fields are never compared
    jobs = tuple(
        TraceJob(i, t, POLLUX_APPS[app].duration_s(g), g, POLLUX_TEAM, name=name, model=app)
        for i, (t, _, name, app, g) in enumerate(parsed)
    )
    label = f"{path.parent.name}/{path.name}"
    return Workload(jobs, f"Pollux {label} ({len(jobs):,} jobs, modelled durations)")


def _size_mix(max_gpus: int, gpus_per_node: int) -> tuple[list[int], list[float]]:
    """Philly-like job sizes and their probabilities.

    ~90 % single-GPU jobs; 7.5 % split evenly over the multi-GPU single-node sizes
    (powers of two below `gpus_per_node`, and the full node); 2.5 % over multi-node gangs of
    gpus_per_node × 2, 4, 8 … up to `max_gpus`, each half as likely as the one below.
    Philly itself: 93.2 % 1 GPU, 2.2 / 2.3 / 2.0 % for 2 / 4 / 8, 0.35 % larger.
    """
    node = min(gpus_per_node, max_gpus)
    small = sorted({2**k for k in range(1, node.bit_length()) if 2**k < node} | {node} - {1})
    large = []
    size = gpus_per_node * 2
    while size <= max_gpus:
        large.append(size)
        size *= 2
    halves = [0.5**k for k in range(len(large))]
    weights = [0.90]
    weights += [0.075 / len(small) for _ in small]
    weights += [0.025 * h / sum(halves) for h in halves]
    total = sum(weights)  # renormalise when a class is empty (e.g. one-GPU nodes)
    return [1, *small, *large], [w / total for w in weights]


SYNTH_MEDIAN_S = 1200.0  # 20 min; Philly's median is 1,144 s
SYNTH_SIGMA = 2.2  # lognormal shape: mean/median = e^(σ²/2) ≈ 11, Philly's is 11.5
SYNTH_MIN_S = 60.0
SYNTH_MAX_S = 7 * 86400.0


def synthetic(
    jobs: int,
    gpus: int,
    load: float = 0.9,
    teams: int = 8,
    seed: int = 0,
    max_gpus_per_job: int = 64,
    gpus_per_node: int = 8,
) -> Workload:
    """A seeded Philly-shaped workload for a `gpus`-GPU cluster with offered load `load`.

    Sizes follow `_size_mix` (capped at min(max_gpus_per_job, gpus)); durations are
    lognormal (median 20 min, σ = 2.2, clipped to [60 s, 7 days]); teams team0… are drawn
    with Zipf weights 1/(k+1). Arrivals are Poisson: exponential gaps, rescaled so the
    submission span equals Σ gpus × duration / (load × gpus), which makes
    `Workload.offered_load(gpus)` equal `load` exactly (a Poisson process conditioned on
    its span). The first job arrives at 0; durations are whole seconds. Vectorised with
    numpy: 1M jobs take a few seconds, mostly building the TraceJob objects.
    """
    checks = (
        (jobs >= 0, f"jobs must be ≥ 0, got {jobs}"),
        (gpus >= 1, f"gpus must be ≥ 1, got {gpus}"),
        (load > 0, f"load must be > 0, got {load}"),
        (teams >= 1, f"teams must be ≥ 1, got {teams}"),
        (gpus_per_node >= 1, f"gpus_per_node must be ≥ 1, got {gpus_per_node}"),
        (max_gpus_per_job >= 1, f"max_gpus_per_job must be ≥ 1, got {max_gpus_per_job}"),
    )
    for ok, message in checks:
        if not ok:
            raise WorkloadError(f"synthetic: {message}")
    rng = np.random.default_rng(seed)
    sizes, probs = _size_mix(min(max_gpus_per_job, gpus), gpus_per_node)
    size = rng.choice(np.array(sizes, dtype=np.int64), size=jobs, p=probs)
    duration = np.clip(
        np.round(rng.lognormal(math.log(SYNTH_MEDIAN_S), SYNTH_SIGMA, size=jobs)),
        SYNTH_MIN_S,
        SYNTH_MAX_S,
    )
    zipf = 1.0 / np.arange(1, teams + 1)
    team = rng.choice(teams, size=jobs, p=zipf / zipf.sum())
    gaps = rng.exponential(1.0, size=max(jobs - 1, 0))
    span = float(np.dot(size, duration)) / (load * gpus)
    submit = np.zeros(jobs)
    if jobs > 1:
        np.cumsum(gaps * (span / gaps.sum()), out=submit[1:])
    names = [f"team{k}" for k in range(teams)]
    with gc_paused():
        jobs_out = _make_jobs(
            (i, s, d, g, names[t], 0, "", "")
            for i, (s, d, g, t) in enumerate(
                zip(submit.tolist(), duration.tolist(), size.tolist(), team.tolist(), strict=True)
            )
        )
    source = (
        f"synthetic(jobs={jobs:,}, gpus={gpus:,}, load={load:g}, teams={teams}, seed={seed}, "
        f"max_gpus_per_job={max_gpus_per_job}, gpus_per_node={gpus_per_node})"
    )
    return Workload(jobs_out, source)


SYNTH_KEYS = ("jobs", "gpus", "load", "teams", "seed", "max_gpus_per_job", "gpus_per_node")


def _synthetic_spec(spec: str, body: str) -> Workload:
    """`jobs=1000,gpus=512,load=0.9` → synthetic(jobs=1000, gpus=512, load=0.9)."""
    args: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq or key not in SYNTH_KEYS:
            raise WorkloadError(f"{spec!r}: {item!r} is not key=value with key in {SYNTH_KEYS}")
        args[key] = value
    if "jobs" not in args or "gpus" not in args:
        raise WorkloadError(f"{spec!r}: synthetic needs jobs=N and gpus=N")

    def num(key: str, kind: type[int] | type[float], default: float) -> float:
        try:
            return kind(args[key]) if key in args else default
        except ValueError:
            raise WorkloadError(f"{spec!r}: {key} must be a number, got {args[key]!r}") from None

    return synthetic(
        jobs=int(num("jobs", int, 0)),
        gpus=int(num("gpus", int, 0)),
        load=num("load", float, 0.9),
        teams=int(num("teams", int, 8)),
        seed=int(num("seed", int, 0)),
        max_gpus_per_job=int(num("max_gpus_per_job", int, 64)),
        gpus_per_node=int(num("gpus_per_node", int, 8)),
    )


def load_workload(
    spec: str,
    start: datetime | None = None,
    end: datetime | None = None,
    vcs: Collection[str] | None = None,
) -> Workload:
    """Load a workload from a spec string.

    - `synthetic:jobs=10000,gpus=4096,load=0.9,seed=1` (keywords of `synthetic`);
    - `philly:PATH` or `pollux:PATH`;
    - a plain PATH to a CSV, recognised by its header (Philly or Pollux columns).
    `start`, `end` and `vcs` apply to Philly traces only.
    """
    kind, sep, rest = spec.partition(":")
    if sep and kind == "synthetic":
        return _synthetic_spec(spec, rest)
    if sep and kind in ("philly", "pollux"):
        path = Path(rest)
    else:
        path, kind = Path(spec), ""
        try:
            with path.open(encoding="utf-8") as f:
                header = {h.strip() for h in f.readline().split(",")}
        except OSError as e:
            raise WorkloadError(f"{path}: cannot read: {e.strerror or e}") from None
        if set(PHILLY_COLUMNS) <= header:
            kind = "philly"
        elif set(POLLUX_COLUMNS) <= header:
            kind = "pollux"
        else:
            raise WorkloadError(f"{path}:1: neither a Philly nor a Pollux header")
    if kind == "pollux":
        return read_pollux(path)
    return read_philly(path, start, end, vcs)
