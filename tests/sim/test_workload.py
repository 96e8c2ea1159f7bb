"""Workloads: the Philly and Pollux readers on the real traces, and the synthetic generator."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import astuple
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from phalanx.sim.workload import (
    POLLUX_APPS,
    TraceJob,
    Workload,
    WorkloadError,
    load_workload,
    read_philly,
    read_pollux,
    synthetic,
)

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
PHILLY = TRACES / "philly_pollux" / "philly.csv"
POLLUX = TRACES / "philly_pollux" / "workloads"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"no trace folder at {TRACES}")

PHILLY_ROWS = 82_247
# GPU-count histogram of philly.csv, from shared/traces/README.md.
PHILLY_SIZES = {1: 76_627, 2: 1_818, 4: 1_870, 8: 1_643, 12: 7, 16: 199, 24: 7, 32: 67, 64: 6}
PHILLY_SIZES[128] = 3


@pytest.fixture(scope="module")
def philly() -> Workload:
    if not TRACES.is_dir():
        pytest.skip(f"no trace folder at {TRACES}")
    return read_philly(PHILLY)


def assert_sorted_with_ids(w: Workload) -> None:
    assert [j.id for j in w.jobs] == list(range(len(w.jobs)))
    keys = [(j.submit_s, j.id) for j in w.jobs]
    assert keys == sorted(keys)


# --- Philly ---------------------------------------------------------------------------


@needs_traces
def test_philly_loads_every_row(philly: Workload) -> None:
    assert len(philly) + philly.skipped == PHILLY_ROWS
    assert philly.skipped == 0  # this file has no zero-duration or zero-GPU rows
    assert_sorted_with_ids(philly)
    assert philly.origin == datetime(2017, 9, 4, 10, 30, 41)
    assert philly.jobs[0].submit_s == 0.0
    assert Counter(j.gpus for j in philly.jobs) == PHILLY_SIZES
    one_gpu = sum(j.gpus == 1 for j in philly.jobs) / len(philly)
    assert one_gpu == pytest.approx(0.932, abs=0.0005)
    assert philly.gpu_seconds / 3600 == pytest.approx(978_078, abs=1)
    teams = Counter(j.team for j in philly.jobs)
    assert len(teams) == 15
    assert teams.most_common(2) == [("6214e9", 41_226), ("11cb48", 16_091)]
    assert "82,247 jobs" in philly.source
    assert all(j.duration_s > 0 and j.model == "" for j in philly.jobs)


@needs_traces
def test_philly_ties_keep_file_order(philly: Workload) -> None:
    rows = [(j.submit_s, int(j.name.removeprefix("philly-"))) for j in philly.jobs]
    assert rows == sorted(rows)  # equal timestamps stay in file-row order
    assert len({r for _, r in rows}) == PHILLY_ROWS


@needs_traces
def test_philly_window_counts_from_start(philly: Workload) -> None:
    start, end = datetime(2017, 10, 1), datetime(2017, 11, 1)
    october = read_philly(PHILLY, start=start, end=end)
    assert len(october) == 47_192  # rows whose timestamp starts with 2017-10
    assert october.origin == start
    assert all(0 <= j.submit_s < 31 * 86400 for j in october.jobs)
    assert_sorted_with_ids(october)
    assert "2017-10-01..2017-10-31" in october.source
    # The same jobs as filtering the full load by hand, shifted to the new origin.
    offset = (start - datetime(2017, 9, 4, 10, 30, 41)).total_seconds()
    by_hand = [j.name for j in philly.jobs if offset <= j.submit_s < offset + 31 * 86400]
    assert [j.name for j in october.jobs] == by_hand


@needs_traces
def test_philly_open_ended_window(philly: Workload) -> None:
    late = read_philly(PHILLY, start=datetime(2017, 12, 1))
    assert len(late) == 8_080  # rows whose timestamp starts with 2017-12
    assert "2017-12-01..2017-12-22" in late.source
    # Without a start, submit_s counts from the earliest kept job, not the file's.
    end, vcs = datetime(2017, 10, 15), {"7f04ca", "2869ce"}
    early = read_philly(PHILLY, end=end, vcs=vcs)
    assert early.jobs[0].submit_s == 0.0
    assert philly.origin is not None and early.origin is not None
    cut = (end - philly.origin).total_seconds()
    by_hand = [j for j in philly.jobs if j.team in vcs and j.submit_s < cut]
    assert [j.name for j in early.jobs] == [j.name for j in by_hand]
    assert early.origin == philly.origin + timedelta(seconds=by_hand[0].submit_s)


@needs_traces
def test_philly_vc_filter(philly: Workload) -> None:
    two = read_philly(PHILLY, vcs={"103959", "0e4a51"})
    assert len(two) == 1_934 + 1_435
    assert {j.team for j in two.jobs} == {"103959", "0e4a51"}
    assert_sorted_with_ids(two)
    assert "VCs 0e4a51,103959" in two.source
    assert [j.name for j in two.jobs] == [
        j.name for j in philly.jobs if j.team in {"103959", "0e4a51"}
    ]
    window = read_philly(
        PHILLY, datetime(2017, 10, 1), datetime(2017, 11, 1), vcs=["7f04ca", "no-such-vc"]
    )
    assert {j.team for j in window.jobs} == {"7f04ca"}
    assert len(read_philly(PHILLY, vcs=[])) == 0


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def test_philly_skips_and_counts_unusable_rows(tmp_path: Path) -> None:
    csv = write(
        tmp_path / "p.csv",
        HEADER + "2017-10-02 00:00:10,60.0,2,120.0,a\n"
        "2017-10-02 00:00:00,0.0,1,0.0,a\n"
        "2017-10-02 00:00:05,30.0,0,0.0,b\n"
        "2017-10-02 00:00:00,45.0,1,45.0,b\n"
        "2017-10-01 00:00:00,45.0,1,45.0,b\n"
        "\n",
    )
    w = read_philly(csv, start=datetime(2017, 10, 2))
    assert w.skipped == 2
    assert [(j.id, j.submit_s, j.gpus, j.team, j.name) for j in w.jobs] == [
        (0, 0.0, 1, "b", "philly-3"),
        (1, 10.0, 2, "a", "philly-0"),
    ]
    assert read_philly(csv, vcs=["a"]).skipped == 1  # only rows inside the selection count


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (HEADER + "2017-10-02 00:00:10,sixty,1,60,a\n", r"p\.csv:2: could not convert"),
        (HEADER + "2017-10-02 00:00:10,60,1,60,a\nyesterday,60,1,60,a\n", r"p\.csv:3: Invalid"),
        (HEADER + "2017-10-02 00:00:10,60,1.5,90,a\n", r"p\.csv:2: invalid literal for int"),
        (HEADER + "2017-10-02 00:00:10,60\n", r"p\.csv:2: too few columns"),
        ("timestamp,duration,gpus,cluster\n", r"p\.csv:1: missing column\(s\) num_gpus"),
        ("", r"missing column"),
    ],
)
def test_philly_errors_name_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        read_philly(write(tmp_path / "p.csv", text))


def test_philly_argument_errors(tmp_path: Path) -> None:
    csv = write(tmp_path / "p.csv", HEADER)
    with pytest.raises(WorkloadError, match="cannot read"):
        read_philly(tmp_path / "absent.csv")
    with pytest.raises(WorkloadError, match="naive start"):
        read_philly(csv, start=datetime(2017, 10, 1, tzinfo=UTC))
    with pytest.raises(WorkloadError, match="empty window"):
        read_philly(csv, start=datetime(2017, 10, 2), end=datetime(2017, 10, 1))
    empty = read_philly(csv)
    assert (len(empty), empty.origin, empty.skipped) == (0, None, 0)


# --- Pollux ---------------------------------------------------------------------------


@needs_traces
def test_pollux_workload() -> None:
    w = read_pollux(POLLUX / "workloads" / "workload-1.csv")
    assert len(w) == 160
    assert_sorted_with_ids(w)
    assert w.origin is None
    assert {j.team for j in w.jobs} == {"pollux"}
    first = w.jobs[0]
    assert (first.name, first.submit_s, first.model, first.gpus) == (
        "cifar10-0",
        107.0,
        "cifar10",
        6,
    )
    assert first.duration_s == pytest.approx(POLLUX_APPS["cifar10"].duration_s(6))
    assert all(j.name.startswith(j.model + "-") for j in w.jobs)
    assert max(j.submit_s for j in w.jobs) < 8 * 3600  # an 8-hour arrival window


@needs_traces
def test_every_pollux_file_loads() -> None:
    sizes = {"workloads": 160, "workloads-realistic": 160, "workloads-0.5": 80}
    sizes |= {"workloads-1.5": 240, "workloads-2.0": 320}
    models: set[str] = set()
    for folder, jobs in sizes.items():
        for n in range(1, 9):
            w = read_pollux(POLLUX / folder / f"workload-{n}.csv")
            assert len(w) == jobs, (folder, n)
            assert all(j.duration_s > 0 and j.gpus >= 1 for j in w.jobs)
            models |= {j.model for j in w.jobs}
            for j in w.jobs:  # the modelled scaling stays in a plausible band where used
                assert 0.5 <= POLLUX_APPS[j.model].efficiency(j.gpus) <= 1.0, j
    assert models == set(POLLUX_APPS)


def test_pollux_modelled_durations_scale_sublinearly() -> None:
    for name, app in POLLUX_APPS.items():
        times = [app.duration_s(n) for n in (1, 2, 4, 8, 16, 48)]
        assert times == sorted(times, reverse=True), name
        assert app.duration_s(1) == app.single_gpu_h * 3600
        assert app.efficiency(1) == 1.0 > app.efficiency(2)


def test_pollux_errors(tmp_path: Path) -> None:
    header = "name,time,application,num_replicas,batch_size\n"
    bad_app = write(tmp_path / "w.csv", header + "a-0,10,cifar10,1,128\nb-1,20,gpt5,8,1\n")
    with pytest.raises(WorkloadError, match=r"w\.csv:3: unknown application 'gpt5'"):
        read_pollux(bad_app)
    bad_reps = write(tmp_path / "w.csv", header + "a-0,10,cifar10,0,128\n")
    with pytest.raises(WorkloadError, match=r"w\.csv:2: num_replicas must be ≥ 1"):
        read_pollux(bad_reps)
    with pytest.raises(WorkloadError, match="missing column"):
        read_pollux(write(tmp_path / "w.csv", "name,time\n"))


def test_fast_construction_matches_the_dataclass(tmp_path: Path) -> None:
    header = "name,time,application,num_replicas,batch_size\n"
    w = read_pollux(write(tmp_path / "w.csv", header + "b-1,20,bert,8,12\na-0,10,ncf,1,128\n"))
    for job in w.jobs:
        rebuilt = TraceJob(*astuple(job))
        assert rebuilt == job and hash(rebuilt) == hash(job)
    assert [j.name for j in w.jobs] == ["a-0", "b-1"]
    with pytest.raises(AttributeError):
        w.jobs[0].gpus = 2  # type: ignore[misc]  # frozen: the assignment must fail


# --- synthetic ------------------------------------------------------------------------


def test_synthetic_size_and_determinism() -> None:
    a = synthetic(5_000, 1_024, seed=7)
    assert len(a) == 5_000
    assert_sorted_with_ids(a)
    assert a == synthetic(5_000, 1_024, seed=7)
    assert a.jobs != synthetic(5_000, 1_024, seed=8).jobs
    assert a.jobs[0].submit_s == 0.0 and a.origin is None
    assert "seed=7" in a.source


@pytest.mark.parametrize(("load", "gpus"), [(0.9, 1_024), (0.5, 64), (1.5, 100_000)])
def test_synthetic_offered_load(load: float, gpus: int) -> None:
    w = synthetic(20_000, gpus, load=load, seed=1)
    assert w.offered_load(gpus) == pytest.approx(load, rel=0.1)
    total = sum(j.gpus * j.duration_s for j in w.jobs)
    assert total / (gpus * w.span_s) == pytest.approx(load, rel=0.1)


def test_synthetic_arrivals_look_poisson() -> None:
    w = synthetic(20_000, 1_024, seed=2)
    gaps = [b.submit_s - a.submit_s for a, b in zip(w.jobs, w.jobs[1:], strict=False)]
    cv = statistics.stdev(gaps) / statistics.mean(gaps)
    assert cv == pytest.approx(1.0, abs=0.05)  # exponential gaps: stdev = mean


def test_synthetic_size_mix_durations_and_teams() -> None:
    w = synthetic(20_000, 4_096, seed=3, max_gpus_per_job=64, gpus_per_node=8, teams=5)
    sizes = Counter(j.gpus for j in w.jobs)
    assert sizes[1] / len(w) == pytest.approx(0.90, abs=0.01)
    assert set(sizes) == {1, 2, 4, 8, 16, 32, 64}
    assert sizes[16] > sizes[32] > sizes[64] > 0
    durations = sorted(j.duration_s for j in w.jobs)
    assert durations[0] >= 60 and durations[-1] <= 7 * 86400
    assert statistics.median(durations) == pytest.approx(1200, rel=0.1)
    assert statistics.mean(durations) > 5 * statistics.median(durations)  # heavy tail
    teams = Counter(j.team for j in w.jobs)
    assert set(teams) == {f"team{k}" for k in range(5)}
    assert [t for t, _ in teams.most_common()] == [f"team{k}" for k in range(5)]  # Zipf order


def test_synthetic_sizes_respect_node_shape_and_caps() -> None:
    w = synthetic(20_000, 96, seed=4, max_gpus_per_job=128, gpus_per_node=6)
    sizes = {j.gpus for j in w.jobs}
    assert max(sizes) <= 96  # no job is larger than the cluster
    assert all(g % 6 == 0 for g in sizes if g > 6)
    assert {1, 2, 4, 6} <= sizes
    small = synthetic(2_000, 8, seed=4, max_gpus_per_job=4)
    assert {j.gpus for j in small.jobs} == {1, 2, 4}


def test_synthetic_edge_cases_and_errors() -> None:
    assert len(synthetic(0, 8)) == 0
    one = synthetic(1, 8)
    assert len(one) == 1 and one.span_s == 0.0
    with pytest.raises(WorkloadError, match="span"):
        one.offered_load(8)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"jobs": -1, "gpus": 8}, "jobs must be ≥ 0"),
        ({"jobs": 1, "gpus": 0}, "gpus must be ≥ 1"),
        ({"jobs": 1, "gpus": 8, "load": 0.0}, "load must be > 0"),
        ({"jobs": 1, "gpus": 8, "teams": 0}, "teams must be ≥ 1"),
        ({"jobs": 1, "gpus": 8, "max_gpus_per_job": 0}, "max_gpus_per_job must be ≥ 1"),
    ]
    for kwargs, match in cases:
        with pytest.raises(WorkloadError, match=match):
            synthetic(**kwargs)


# --- load_workload --------------------------------------------------------------------


def test_load_workload_synthetic_spec() -> None:
    w = load_workload("synthetic:jobs=100, gpus=64, load=0.7, seed=3, teams=2")
    assert w == synthetic(100, 64, load=0.7, seed=3, teams=2)
    for spec, match in [
        ("synthetic:jobs=100", "needs jobs=N and gpus=N"),
        ("synthetic:jobs=1e3,gpus=8", "jobs must be a number"),
        ("synthetic:jobs=10,gpus=8,colour=red", "not key=value"),
    ]:
        with pytest.raises(WorkloadError, match=match):
            load_workload(spec)


@needs_traces
def test_load_workload_recognises_files(tmp_path: Path) -> None:
    pollux = POLLUX / "workloads" / "workload-2.csv"
    assert load_workload(str(pollux)) == read_pollux(pollux)
    assert load_workload(f"pollux:{pollux}") == read_pollux(pollux)
    start, end, vcs = datetime(2017, 11, 1), datetime(2017, 12, 1), ["7f04ca"]
    by_header = load_workload(str(PHILLY), start=start, end=end, vcs=vcs)
    assert len(by_header) > 0
    assert by_header == read_philly(PHILLY, start, end, vcs)
    assert load_workload(f"philly:{PHILLY}", vcs=vcs) == read_philly(PHILLY, vcs=vcs)
    with pytest.raises(WorkloadError, match="neither a Philly nor a Pollux header"):
        load_workload(str(write(tmp_path / "x.csv", "a,b,c\n")))
