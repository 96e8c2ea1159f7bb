"""The telemetry pipeline end to end: agents sample their fake GPUs as the jobs declare or
drive them, ship batches to the head, the head stores them, and a job's stats (API and
`phalanx jobstats`) come out exact, live and then final."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select

from phalanx.api.telemetry import JobStats
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.head import db
from phalanx.local import LocalCluster
from phalanx.testing.postgres import PostgresServer
from tests.cli.conftest import invoke
from tests.e2e.helpers import cancel_all, job, sh, wait_for, wait_state

SAMPLE_S = 0.5


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def tele(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalCluster, str]]:
    """One node with four fake H100s sampled every 0.5 s and shipped every second."""
    db_url = None
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        db_url = pg.new_database("telemetry_e2e")
    state = tmp_path_factory.mktemp(f"tele-{request.param}")
    args = ["--telemetry-interval", str(SAMPLE_S), "--telemetry-ship", "1"]
    with LocalCluster(state, nodes=1, gpus_per_node=4, db_url=db_url, agent_args=args) as c:
        url = db_url or db.default_url(c.head_dir)
        yield c, url


@pytest.fixture
def api(tele: tuple[LocalCluster, str]) -> Iterator[PhalanxClient]:
    cluster, _ = tele
    with cluster.client() as client:
        yield client
        try:
            cancel_all(client)
        finally:
            cluster.check()


def _stats_with(client: PhalanxClient, job_id: int, samples: int) -> JobStats:
    """The job's stats once each of its GPUs has at least `samples` samples."""

    def probe() -> JobStats | None:
        s = client.job_stats(job_id)
        ok = s.per_gpu and all(g.samples >= samples for g in s.per_gpu)
        return s if ok else None

    return wait_for(f"{samples} samples of job {job_id}", probe, timeout=60)


def test_declared_utilisation_gives_exact_stats_live_then_final(
    tele: tuple[LocalCluster, str], api: PhalanxClient, tmp_path: Path
) -> None:
    cluster, url = tele
    spec = job(
        tmp_path,
        sh("sleep 6"),
        gpus_per_node=4,
        launcher="node",
        env={"PHALANX_FAKE_GPU_UTIL": "80,40,0,0", "PHALANX_FAKE_GPU_MEM_PCT": "10"},
    )
    job_id = api.submit(spec).job_ids[0]
    wait_state(api, job_id, "R")
    live = _stats_with(api, job_id, 3)
    assert not live.final and live.state == "R"
    assert [(g.index, g.mean_util_pct, g.p95_util_pct) for g in live.per_gpu] == [
        (0, 80.0, 80.0),
        (1, 40.0, 40.0),
        (2, 0.0, 0.0),
        (3, 0.0, 0.0),
    ]
    assert [g.idle for g in live.per_gpu] == [False, False, True, True]
    assert live.gpus_total == 4 and live.gpus_idle == 2
    # 10% of an H100's 81,559 MiB, as declared
    assert {g.peak_memory_mb for g in live.per_gpu} == {8156}
    assert live.notes[0].startswith("2 of 4 GPUs unused")
    assert any(n.startswith("GPU memory far below") for n in live.notes)
    assert live.resolution == "raw" and len(live.util_series) == 4
    # The job ends by itself; its stats are final within 30 s and say the same.
    wait_state(api, job_id, "CD", timeout=30)

    def final() -> JobStats | None:
        s = api.job_stats(job_id)
        return s if s.final else None

    done = wait_for("final stats", final, timeout=30)
    assert done.state == "CD" and done.end_time is not None
    assert [g.mean_util_pct for g in done.per_gpu] == [80.0, 40.0, 0.0, 0.0]
    assert done.gpus_idle == 2 and done.mean_util_pct == 30.0
    assert done.energy_j is not None and done.energy_j > 0
    assert done.notes == live.notes
    # The summary is kept with the job, in its own table: small.
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                select(db.job_stats.c.summary_json).where(db.job_stats.c.job_id == job_id)
            ).one()
        summary = json.loads(row.summary_json)
        assert summary["gpus_idle"] == 2 and summary["per_gpu"] == []
        assert len(row.summary_json) < 1500

        def chunks() -> int | None:  # the store flushes every 30 s
            with engine.connect() as conn:
                n = conn.execute(select(func.count()).select_from(db.telemetry_chunks)).scalar()
            return n if n else None

        wait_for("samples stored as chunks", chunks, timeout=45)
    finally:
        engine.dispose()
    # `phalanx jobstats` shows it, and its --json is the same object
    env = cluster.client_env()
    shown = invoke("jobstats", str(job_id), env=env)
    assert shown.exit_code == 0, shown.stderr
    assert "2 of 4 GPUs unused" in shown.stdout and "final" in shown.stdout
    as_json = JobStats.model_validate_json(
        invoke("jobstats", str(job_id), "--json", env=env).stdout
    )
    assert as_json.per_gpu == done.per_gpu


def test_a_job_drives_its_utilisation_at_run_time(
    tele: tuple[LocalCluster, str], api: PhalanxClient, tmp_path: Path
) -> None:
    f = '"$PHALANX_FAKE_GPU_UTIL_FILE"'
    script = f"echo 20 > {f}; sleep 3; echo 60 > {f}; sleep 3"
    job_id = api.submit(job(tmp_path, sh(script), gpus_per_node=1)).job_ids[0]
    wait_state(api, job_id, "CD", timeout=60)
    done = wait_for("final stats", lambda: s if (s := api.job_stats(job_id)).final else None, 30)
    [series] = done.util_series
    values = [p.value for p in series.points]
    # Before the rank's first write the GPU shows the default (busy, ~95%); then 20, then 60.
    driven = [v for v in values if v is not None and v < 90]
    assert driven[0] == 20.0 and driven[-1] == 60.0 and set(driven) == {20.0, 60.0}
    assert values.index(60.0) > values.index(20.0)
    assert values.count(20.0) >= 3 and values.count(60.0) >= 3


def test_a_jobs_cpu_and_memory_use(
    tele: tuple[LocalCluster, str], api: PhalanxClient, tmp_path: Path
) -> None:
    burn = "import time\nt = time.time()\nb = bytearray(64 << 20)\nwhile time.time() - t < 6: pass"
    spec = job(
        tmp_path,
        ["python3", "-c", burn],
        launcher="node",
        cpus_per_task=1,
        env={"PHALANX_FAKE_GPU_UTIL": "20"},
    )
    job_id = api.submit(spec).job_ids[0]
    wait_state(api, job_id, "CD", timeout=60)
    done = wait_for("final stats", lambda: s if (s := api.job_stats(job_id)).final else None, 30)
    # One busy loop: most of a core (a shared machine takes some), 64 MiB and more held.
    assert done.cpu_cores_mean is not None and 0.3 < done.cpu_cores_mean <= 1.1
    assert done.cpus is not None and done.cpus >= 1
    assert done.memory_peak_mb is not None and done.memory_peak_mb >= 64
    assert done.per_gpu[0].mean_util_pct == 20.0


REPORTS = """\
import time
from phalanx.train.report import Progress, Reporter
r = Reporter(rank=0, local_rank=0, printer=lambda line: None)
for i in range(14):  # a report every 0.5 s, as phalanx.train posts them
    r.report(Progress(0, i, 2.0, 1000.0 * (i + 1), 0.30 + i / 100, time.time()))
    time.sleep(0.5)
r.close()
"""


def test_mfu_and_tokens_per_s_over_time(
    tele: tuple[LocalCluster, str], api: PhalanxClient, tmp_path: Path
) -> None:
    spec = job(tmp_path, [sys.executable, "-c", REPORTS], launcher="node")
    job_id = api.submit(spec).job_ids[0]
    wait_state(api, job_id, "CD", timeout=60)
    done = wait_for("final stats", lambda: s if (s := api.job_stats(job_id)).final else None, 30)
    # The head keeps one report per job every 5 s: steps 0, ~10 (7 s of reports).
    mfu = [p.value or 0.0 for p in done.mfu_series]
    tps = [p.value or 0.0 for p in done.tokens_per_s_series]
    assert 2 <= len(mfu) <= 3 and mfu[0] == 0.30 and mfu == sorted(mfu)
    # Each kept report whole: its MFU and tokens/s are the same step's.
    assert all(round(v * 100) - 30 == t / 1000 - 1 for v, t in zip(mfu, tps, strict=True))
    assert done.mfu_mean == round(sum(mfu) / len(mfu), 6)
    assert [p.time for p in done.mfu_series] == sorted(p.time for p in done.mfu_series)


def test_stats_of_a_job_nobody_may_see_or_that_does_not_exist(
    tele: tuple[LocalCluster, str], api: PhalanxClient
) -> None:
    cluster, _ = tele
    with pytest.raises(ApiError) as missing:
        api.job_stats(999_999)
    assert missing.value.status == 404
    shown = invoke("jobstats", "nope", env=cluster.client_env())
    assert shown.exit_code == 2 and "Traceback" not in shown.stderr + shown.stdout


def test_stats_survive_a_head_restart(
    tele: tuple[LocalCluster, str], api: PhalanxClient, tmp_path: Path
) -> None:
    """Runs last in this module: it restarts the head. A head stopped with SIGTERM writes
    what it buffered; the kept summary and the samples come back with it."""
    cluster, _ = tele
    env = {"PHALANX_FAKE_GPU_UTIL": "60,0"}
    spec = job(tmp_path, sh("sleep 4"), gpus_per_node=2, launcher="node", env=env)
    job_id = api.submit(spec).job_ids[0]
    wait_state(api, job_id, "CD", timeout=60)
    done = wait_for("final stats", lambda: s if (s := api.job_stats(job_id)).final else None, 30)
    cluster.kill_head(signal.SIGTERM)  # returns once it exited
    cluster.restart_head()
    with cluster.client() as again:
        after = again.job_stats(job_id)
    assert after.final and after.notes == done.notes
    assert after.per_gpu == done.per_gpu  # the samples were flushed before it stopped
    assert [g.mean_util_pct for g in after.per_gpu] == [60.0, 0.0]
    assert after.util_series == done.util_series
