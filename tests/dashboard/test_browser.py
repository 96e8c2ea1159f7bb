"""The dashboard in a real browser (Playwright driving Debian's chromium) against a real
cluster: signing in, the GPU grid, a live log, cancel, drain, and what a plain user may not
see or do. Screenshots land in test-artifacts/dashboard/."""

from __future__ import annotations

import re
import time
from pathlib import Path

from playwright.sync_api import BrowserContext, Page, expect

from phalanx.api.models import JobSpec
from phalanx.api.usage import IdlePolicySpec
from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from tests.dashboard.conftest import People, shot, sign_in
from tests.e2e.helpers import job, py, sh, submit, wait_for


def _running(api: PhalanxClient, job_id: int) -> None:
    wait_for(f"job {job_id} to run", lambda: api.job(job_id).job.state == "R" or None, 60)


def _as(cluster: LocalCluster, token: str) -> PhalanxClient:
    return cluster.client(token)


def test_a_bad_token_is_refused_with_an_error(cluster: LocalCluster, page: Page) -> None:
    page.goto(f"{cluster.url}/ui/nodes")
    expect(page).to_have_url(f"{cluster.url}/ui/login?next=/ui/nodes")
    page.fill("#token", "phx_not-a-real-token")
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("unknown or revoked token")
    assert not [c for c in page.context.cookies() if c["name"] == "phalanx_session"]
    shot(page, "login-error")


def test_gpu_grid_shows_a_running_jobs_gpu_busy_and_a_free_one_idle(
    cluster: LocalCluster, people: People, api: PhalanxClient, page: Page, workdir: Path
) -> None:
    with _as(cluster, people.alice) as alice:
        job_id = submit(alice, job(workdir, sh("sleep 300"), name="busy-one"))
    _running(api, job_id)
    sign_in(page, cluster.url, people.admin, "/ui/nodes")
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "phalanx_session"]
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/ui"  # the head serves TLS here: the cookie is Secure
    held = page.locator(f'i.gpu[data-job="{job_id}"]')
    expect(held).to_have_count(1)
    # The fake GPU reports ~95% once the agent sees the job's process on it (a heartbeat
    # later): the grid follows over SSE, without a reload.
    expect(held).to_have_attribute("data-busy", "1")
    node, index = (held.get_attribute("data-gpu") or ":").split(":")
    whose = rf"job {job_id} \({people.alice_name}\)"
    hover = rf"^{re.escape(node)} GPU {index} · \d+% · \d+/\d+ MiB · {whose}$"
    expect(held).to_have_attribute("title", re.compile(hover))
    free = page.locator('i.gpu:not([data-job])[data-busy="0"]')
    assert free.count() >= 1
    expect(free.first).to_have_class("gpu u0")
    shot(page, "nodes-gpu-grid")
    page.goto(f"{cluster.url}/ui/")
    expect(page.locator("#gpus-allocated")).to_have_text("1")
    expect(page.locator("#jobs-R")).to_have_text("1")
    shot(page, "overview")


def _half_idle(workdir: Path, team: str, name: str) -> JobSpec:
    """A batch job on both nodes: its script (one process) holds the first node's GPU."""
    return JobSpec(
        script="#!/bin/bash\nsleep 300\n", workdir=str(workdir), name=name, nodes=2,
        gpus_per_node=1, launcher="batch", team=team,
    )  # fmt: skip


def test_an_allocated_gpu_left_idle_is_flagged_in_the_grid_the_idle_page_and_the_job_page(
    cluster: LocalCluster, people: People, api: PhalanxClient, page: Page, workdir: Path
) -> None:
    """A batch job on both nodes runs its script on the first only: the fake GPU there
    reads 100%, the second node's 0%. Team red's idle policy (set by the admin over the
    REST API) flags it after 10 s."""
    api.set_idle_policy(people.red, IdlePolicySpec(action="notify", window_s=10.0))
    try:
        spec = _half_idle(workdir, people.red, "half-idle")
        with _as(cluster, people.alice) as alice:
            job_id = submit(alice, spec)
        _running(api, job_id)
        first, second = (p.node for p in api.job(job_id).job.placement)
        sign_in(page, cluster.url, people.alice, "/ui/nodes")
        cells = page.locator(f'i.gpu[data-job="{job_id}"]')
        expect(cells).to_have_count(2)
        busy = page.locator(f'[id="node-{first}"] i.gpu[data-job="{job_id}"]')
        idle = page.locator(f'[id="node-{second}"] i.gpu[data-job="{job_id}"]')
        expect(busy).to_have_attribute("data-busy", "1")
        # Flagged once idle for the window (10 s): the grid follows over SSE.
        expect(idle).to_have_attribute("data-idle", "1", timeout=60_000)
        expect(idle).to_have_class(re.compile(r"\bidle\b"))
        expect(idle).to_have_attribute("data-busy", "0")
        expect(idle).to_have_attribute(
            "title", re.compile(r"flagged idle, idle since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
        )
        expect(busy).not_to_have_class(re.compile(r"\bidle\b"))
        assert busy.get_attribute("data-idle") is None
        expect(page.locator(".legend i.gpu.idle")).to_have_count(1)
        shot(page, "nodes-gpu-grid-idle")  # docs/img/dashboard-gpu-grid.png is a copy
        (flag,) = api.idle_gpus(job_id).gpus
        assert (flag.node, f"{flag.node}:{flag.index}") == (second, idle.get_attribute("data-gpu"))

        page.goto(f"{cluster.url}/ui/")
        expect(page.locator("#gpus-flagged-idle")).to_have_text("1")
        page.goto(f"{cluster.url}/ui/idle")
        flagged = page.locator(f'#idle-flags tr[data-job="{job_id}"]')
        expect(flagged).to_have_count(1)
        expect(flagged).to_have_attribute("id", f"idle-{second}-{flag.index}")
        expect(flagged).to_contain_text(people.alice_name)
        expect(flagged).to_contain_text("notify only")
        expect(page.locator(f'[id="policy-{people.red}"]')).to_contain_text("10s")
        expect(page.locator(f'[id="policy-{people.blue}"]')).to_have_count(0)
        shot(page, "idle-gpus")
        page.goto(f"{cluster.url}/ui/jobs/{job_id}")
        listed = page.locator("#idle-gpus tbody tr")
        expect(listed).to_have_count(1)
        expect(listed).to_have_attribute("data-gpu", re.compile(rf"^{re.escape(second)}:\d+$"))
        expect(page.locator('p.grid i.gpu[data-idle="1"]')).to_have_count(1)
        shot(page, "job-idle-gpus")
    finally:
        api.set_idle_policy(people.red, None)


def test_another_teams_flagged_gpus_are_not_listed(
    cluster: LocalCluster, people: People, api: PhalanxClient, page: Page, workdir: Path
) -> None:
    api.set_idle_policy(people.red, IdlePolicySpec(action="notify", window_s=10.0))
    try:
        spec = _half_idle(workdir, people.red, "idle-elsewhere")
        with _as(cluster, people.alice) as alice:
            job_id = submit(alice, spec)
        _running(api, job_id)
        wait_for("a GPU flagged idle", lambda: api.idle_gpus(job_id).gpus or None, 60)
        sign_in(page, cluster.url, people.bob, "/ui/idle")
        expect(page.locator("#idle-flags")).to_contain_text("no GPU of yours is flagged idle")
        expect(page.locator(f'#idle-flags tr[data-job="{job_id}"]')).to_have_count(0)
        expect(page.locator(f'[id="policy-{people.red}"]')).to_have_count(0)
        expect(page.locator(f'[id="policy-{people.blue}"]')).to_have_count(1)
    finally:
        api.set_idle_policy(people.red, None)


def test_a_job_appears_in_an_open_jobs_page_without_a_reload(
    cluster: LocalCluster, people: People, api: PhalanxClient, page: Page, workdir: Path
) -> None:
    sign_in(page, cluster.url, people.admin, "/ui/jobs")
    page.evaluate("window.__notReloaded = true")
    job_id = submit(api, job(workdir, sh("sleep 300"), name="appears-live"))
    expect(page.locator(f"#job-{job_id}")).to_contain_text("appears-live")
    assert page.evaluate("window.__notReloaded") is True


def test_a_jobs_log_follows_live_and_the_job_is_cancelled_from_its_page(
    cluster: LocalCluster, people: People, api: PhalanxClient, page: Page, workdir: Path
) -> None:
    errors: list[str] = []  # script errors and Content-Security-Policy refusals
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    marker = workdir / "go-on"
    script = (
        "echo before-the-page-opened '<img src=x onerror=alert(1)>'; "
        f"while [ ! -e {marker} ]; do sleep 0.2; done; "
        "echo printed-after-the-page-opened; sleep 300"
    )
    with _as(cluster, people.alice) as alice:
        job_id = submit(alice, job(workdir, sh(script), name="follow-me"))
    _running(api, job_id)
    sign_in(page, cluster.url, people.alice, f"/ui/jobs/{job_id}")
    log = page.locator("#log")
    expect(log).to_contain_text("before-the-page-opened <img src=x onerror=alert(1)>")
    expect(log.locator("img")).to_have_count(0)  # a job's output is text, never markup
    assert "printed-after-the-page-opened" not in (log.text_content() or "")
    page.evaluate("window.__notReloaded = true")
    marker.touch()
    expect(log).to_contain_text("printed-after-the-page-opened")
    assert page.evaluate("window.__notReloaded") is True
    expect(page.locator("#job-state")).to_have_text("R")
    # The GPU utilisation chart (uPlot) draws the job's GPU once a reading arrives.
    expect(page.locator("#gpu-chart canvas")).to_have_count(1)
    expect(page.locator("#gpu-chart .u-legend")).to_contain_text(":0")
    shot(page, "job-page")

    page.click("#cancel")
    expect(page).to_have_url(f"{cluster.url}/ui/jobs/{job_id}")
    expect(page.locator("#job-state")).to_have_text("CA", timeout=30_000)
    assert api.job(job_id).job.state == "CA"
    expect(page.locator("#cancel")).to_have_count(0)  # nothing left to cancel
    assert errors == []


def test_an_admin_drains_and_resumes_a_node(
    cluster: LocalCluster, people: People, api: PhalanxClient, page: Page
) -> None:
    node = cluster.addresses[1]
    try:
        sign_in(page, cluster.url, people.admin, "/ui/nodes")
        row = page.locator(f'[id="node-{node}"]')
        row.locator("input[name=reason]").fill("swap a fan")
        row.locator("button.drain").click()
        expect(row).to_have_attribute("data-state", "drain")
        expect(row.locator(".reason")).to_have_text("swap a fan")
        assert next(n for n in api.nodes().nodes if n.name == node).state == "drain"
        shot(page, "node-drained")
        # Filtered and paginated on the server.
        page.goto(f"{cluster.url}/ui/nodes?state=drain")
        expect(page.locator("table.nodes tbody tr")).to_have_count(1)
        expect(page.locator(f'[id="node-{node}"]')).to_have_count(1)
        page.goto(f"{cluster.url}/ui/nodes?per=1&page=2")
        expect(page.locator("table.nodes tbody tr")).to_have_count(1)
        expect(page.locator(".pager span")).to_have_text("page 2 of 2")
        row = page.locator(f'[id="node-{node}"]')  # host order: 127.0.0.2, then .3
        row.locator("button.resume").click()
        expect(row).to_have_attribute("data-state", "up")
        assert next(n for n in api.nodes().nodes if n.name == node).state == "up"
        # Both are health events, newest first, filterable by node.
        page.goto(f"{cluster.url}/ui/health?node={node}")
        rows = page.locator("table.events tbody tr")
        expect(rows.first).to_have_class("ev-resume")
        expect(page.locator("tr.ev-drain").first).to_contain_text("swap a fan")
    finally:
        if next(n for n in api.nodes().nodes if n.name == node).state == "drain":
            api.resume(node)


def test_a_plain_user_sees_no_other_teams_job_and_no_admin_action(
    cluster: LocalCluster,
    people: People,
    api: PhalanxClient,
    context: BrowserContext,
    page: Page,
    workdir: Path,
) -> None:
    with _as(cluster, people.alice) as alice:
        job_id = submit(alice, job(workdir, sh("sleep 300"), name="alices"))
    _running(api, job_id)
    sign_in(page, cluster.url, people.bob, "/ui/nodes")
    expect(page.locator("#viewer")).to_have_attribute("data-role", "user")
    expect(page.locator("i.gpu").first).to_be_visible()
    expect(page.locator("button.drain")).to_have_count(0)
    expect(page.locator("button.resume")).to_have_count(0)
    # Alice's GPU: its job's id (the API's node list has it), not whose it is.
    held = page.locator(f'i.gpu[data-job="{job_id}"]')
    expect(held).to_have_attribute("title", re.compile(rf"job {job_id} \(another team's\)$"))

    answer = page.goto(f"{cluster.url}/ui/jobs/{job_id}")
    assert answer is not None and answer.status == 403
    expect(page.locator("#refusal")).to_contain_text(f"belongs to {people.alice_name}")
    expect(page.locator("#log")).to_have_count(0)
    shot(page, "plain-user-refused")
    page.goto(f"{cluster.url}/ui/jobs")
    expect(page.locator(f"#job-{job_id}")).to_have_count(0)

    # Forged POSTs with bob's own session and CSRF token: refused, and nothing changes.
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    assert csrf
    node = cluster.addresses[0]
    drained = page.request.post(
        f"{cluster.url}/ui/nodes/{node}/drain", form={"csrf": csrf, "reason": "mine now"}
    )
    assert drained.status == 403
    cancelled = page.request.post(f"{cluster.url}/ui/jobs/{job_id}/cancel", form={"csrf": csrf})
    assert cancelled.status == 403
    no_csrf = page.request.post(f"{cluster.url}/ui/nodes/{node}/drain", form={"reason": "x"})
    assert no_csrf.status == 403
    assert next(n for n in api.nodes().nodes if n.name == node).state == "up"
    assert api.job(job_id).job.state == "R"


def test_the_queue_pages_through_the_schedulers_order_with_an_estimated_start(
    cluster: LocalCluster, people: People, api: PhalanxClient, page: Page, workdir: Path
) -> None:
    """Every GPU busy with a job limited to an hour: the next job has a reservation (its
    estimated start: when that job's limit ends), the others wait behind it, in order."""
    blocker = submit(
        api, job(workdir, sh("sleep 300"), name="blocker", nodes=2, gpus_per_node=2,
                 time_limit_s=3600)
    )  # fmt: skip
    _running(api, blocker)
    with _as(cluster, people.alice) as alice:
        queued = [submit(alice, job(workdir, sh("true"), name=f"q{i}")) for i in range(5)]
    ends = api.job(blocker).job.start_time
    assert ends is not None
    sign_in(page, cluster.url, people.alice, "/ui/queue?per=2")
    seen: list[tuple[str, int]] = []
    for expected_page in (1, 2, 3):
        expect(page.locator(".pager span")).to_have_text(f"page {expected_page} of 3")
        for row in page.locator("table.queue tbody tr").all():
            rank = row.locator("td").nth(0).text_content() or ""
            seen.append((rank, int((row.get_attribute("id") or "-0").split("-")[1])))
        if expected_page < 3:
            page.click("a[rel=next]")
    assert seen == [(str(rank), job_id) for rank, job_id in enumerate(queued, start=1)]
    page.goto(f"{cluster.url}/ui/queue")
    first = page.locator(f"#queued-{queued[0]}")
    expect(first).to_contain_text("Resources")
    stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime(ends + 3600))
    expect(first.locator("td").last).to_contain_text(stamp)
    expect(page.locator(f"#queued-{queued[1]} td").last).to_have_text("after the jobs ahead")
    shot(page, "queue")


REPORTS = """
import time
from phalanx.train.report import Progress, Reporter

reporter = Reporter(0, 0)
for step in range(1, 10_000):
    loss = 4.0 / step
    reporter.report(Progress(0, step, loss, 1000.0, 0.42, time.time()), 0.5, None)
    time.sleep(0.5)
"""


def test_progress_reports_draw_the_loss_chart_and_the_cluster_mfu(
    cluster: LocalCluster, people: People, api: PhalanxClient, page: Page, workdir: Path
) -> None:
    errors: list[str] = []  # script errors and Content-Security-Policy refusals
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    job_id = submit(api, job(workdir, py(REPORTS), name="reports-mfu"))
    _running(api, job_id)
    sign_in(page, cluster.url, people.admin, "/ui/")
    expect(page.locator("#mfu")).to_have_text("42.0%")
    page.goto(f"{cluster.url}/ui/jobs/{job_id}")
    expect(page.locator("#progress-chart canvas")).to_have_count(1)
    expect(page.locator("#progress-chart .u-legend")).to_contain_text("mfu")
    expect(page.locator("#progress-table")).to_contain_text("42.0%")
    page.wait_for_timeout(3000)  # a few more points on the charts for the screenshot
    shot(page, "job-progress")
    assert errors == []
