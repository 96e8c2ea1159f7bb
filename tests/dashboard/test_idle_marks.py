"""The idle-GPU views in process on a head (not started) whose idle detector is fed real
samples through the head's own path (GpuSamples.record): who sees which flag on the idle
page, the page's bound, and the GPU grid's marks. Over HTTP and in a browser:
test_usage_pages.py and test_browser.py."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.api.models import GpuInfo, GpuTelemetry, JobSpec
from phalanx.core import JobState, NodeState, Team
from phalanx.core.idle import IdleAction, IdlePolicy
from phalanx.head.auth import Principal
from phalanx.head.dashboard import cluster, grid, usage_pages
from phalanx.head.dashboard.session import Viewer
from phalanx.head.mirror import Settings
from phalanx.head.records import JobRecord, NodeRecord
from phalanx.head.server import build
from phalanx.head.service import Head

GPUS = 8
NODES = 130  # 1,040 GPUs, every one flagged: more than the idle page lists
ADMIN = Principal(kind="api", token_id=1, user="root", admin=True)
ALICE = Principal(kind="api", token_id=2, user="alice", teams=frozenset({"red"}))
BOB = Principal(kind="api", token_id=3, user="bob", teams=frozenset({"blue"}))
CAROL = Principal(kind="api", token_id=4, user="carol", admin_of=frozenset({"red"}))
FLAG_ROW = re.compile(r'<tr id="idle-(n\d+)-(\d)" data-job="(\d+)">')


def _owner(n: int) -> tuple[str, str]:
    return ("alice", "red") if n % 2 == 0 else ("bob", "blue")


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    """NODES nodes, each held whole by one running job (even nodes alice's, odd bob's);
    every GPU but node n1's GPU 0 reads 0% for three samples 10 s apart: flagged (a 10 s
    window); n1's GPU 0 reads 97%."""
    state = Path(tmp_path_factory.mktemp("idlemarks")) / "head"
    state.mkdir(mode=0o700)
    h = build(state, None, Settings())
    now = time.time()
    spec = JobSpec(command=["true"], workdir="/w", gpus_per_node=GPUS)
    running = []
    with h.control.lock:
        for team in ("red", "blue"):
            h.mirror.teams[team] = Team(name=team)
        for n in range(NODES):
            name = f"n{n}"
            h.mirror.nodes[name] = NodeRecord(
                name=name, address=f"10.0.{n // 250}.{n % 250}", agent_url="https://x:1",
                agent_secret="x" * 32, cpus=64, memory_mb=1_000_000,
                gpus=[GpuInfo(index=g, uuid=f"G-{n}-{g}", model="H100", memory_mb=81559)
                      for g in range(GPUS)],
                labels={}, state=NodeState.UP, last_heartbeat=now, heard_at=now,
            )  # fmt: skip
            user, team = _owner(n)
            rec = JobRecord(
                id=n + 1, name=f"j{n}", user=user, team=team, account=None, qos="normal",
                priority=100, state=JobState.RUNNING, spec=spec, submit_time=now - 60,
                start_time=now - 60,
            )  # fmt: skip
            rec.placement = [(name, list(range(GPUS)))]
            h.mirror.jobs[rec.id] = rec
            h.mirror.node_jobs.setdefault(name, set()).add(rec.id)
            running.append(rec)
    for team in ("red", "blue"):
        h.usage.idle.set_policy(team, IdlePolicy(IdleAction.PREEMPT, 10.0, 600.0, 1.0))
    for rec in running:
        h.usage.idle.place(rec, now - 30)
    for t in (now - 20, now - 10, now):
        for n in range(NODES):
            readings = [
                GpuTelemetry(index=g, utilization_pct=97.0 if (n, g) == (1, 0) else 0.0)
                for g in range(GPUS)
            ]
            h.samples.record(f"n{n}", readings, t)
    try:
        yield h
    finally:
        h.control.engine.dispose()


def _rows(head: Head, who: Principal) -> tuple[str, list[tuple[str, int, int]]]:
    html = usage_pages._idle(head, Viewer(who, "0" * 64))
    return html, [(node, int(i), int(job)) for node, i, job in FLAG_ROW.findall(html)]


def test_every_idle_gpu_is_flagged_but_the_busy_one(head: Head) -> None:
    assert head.usage.idle.idle_gpus() == NODES * GPUS - 1


def test_the_idle_page_shows_each_viewer_the_flags_the_rest_api_does(head: Head) -> None:
    half = NODES // 2 * GPUS
    for who, team, expected in (
        (ALICE, "red", half),  # her own jobs
        (CAROL, "red", half),  # red's admin: red's jobs, none of her own
        (BOB, "blue", half - 1),  # his own, less n1's busy GPU
    ):
        html, rows = _rows(head, who)
        assert len(rows) == expected, who.user
        assert {_owner(int(node[1:]))[1] for node, _, _ in rows} == {team}
        assert all(job == int(node[1:]) + 1 for node, _, job in rows)
        assert f'<span id="idle-count">{expected}</span>' in html
        assert 'id="idle-cut"' not in html
        assert f'id="policy-{team}"' in html
        other = "blue" if team == "red" else "red"
        assert f'id="policy-{other}"' not in html
        # What the REST API answers the same caller.
        rest = head.usage.idle.flags(who.may_see_job)
        assert {(f.node, f.index) for f in rest} == {(n, i) for n, i, _ in rows}
    assert ("n1", 0) not in {(n, i) for n, i, _ in _rows(head, BOB)[1]}


def test_the_idle_page_lists_a_bounded_number_and_says_how_many_there_are(head: Head) -> None:
    html, rows = _rows(head, ADMIN)
    total = NODES * GPUS - 1
    assert total > usage_pages.MAX_SHOWN_FLAGS
    assert len(rows) == usage_pages.MAX_SHOWN_FLAGS
    assert len(set(rows)) == len(rows)
    assert f'<span id="idle-count">{total}</span>' in html
    assert f"the {usage_pages.MAX_SHOWN_FLAGS} idle longest of {total}" in html
    assert 'id="policy-red"' in html and 'id="policy-blue"' in html
    assert "preempt: pending, at " in html  # flagged, the grace not over


def test_the_grid_marks_flagged_gpus_and_only_those(head: Head) -> None:
    page = cluster.node_page(head, BOB, None, "n1", 1, 50)
    n1 = next(r for r in page.rows if r.name == "n1")
    assert sorted(n1.idle) == list(range(1, GPUS))  # GPU 0 is busy
    cells = re.findall(r"<i [^>]*>", str(grid.cells_html(n1)))
    assert len(cells) == GPUS
    marked = [c for c in cells if 'data-idle="1"' in c]
    assert len(marked) == GPUS - 1
    assert all('class="gpu u0 held idle"' in c and "flagged idle, idle since " in c for c in marked)
    (busy,) = [c for c in cells if 'data-idle="1"' not in c]
    assert 'class="gpu u10 held"' in busy and 'data-busy="1"' in busy
    assert cluster.overview(head).gpus_flagged_idle == NODES * GPUS - 1
