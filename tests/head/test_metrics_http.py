"""The head's Prometheus endpoints over real HTTP (SQLite and PostgreSQL): who may scrape,
what a scrape-only token opens (nothing else), and promtool's verdict on the output."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.head.conftest import HeadProc

SCRAPES = ("/metrics", "/v1/metrics/gpus")


def promtool(text: str) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics` on `text` (Debian's `prometheus` package, .ci/run)."""
    tool = shutil.which("promtool")
    assert tool is not None, "promtool is missing: apt-get install prometheus"
    return subprocess.run(
        [tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )


def _user_token(admin: httpx.Client) -> str:
    name = f"u{uuid.uuid4().hex[:8]}"
    r = admin.put("/v1/teams/mteam", json={"name": "mteam"})
    assert r.status_code == 200, r.text
    r = admin.post("/v1/users", json={"name": name, "teams": ["mteam"]})
    assert r.status_code == 201, r.text
    r = admin.post("/v1/tokens", json={"user": name})
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


def _metrics_token(admin: httpx.Client) -> tuple[int, str]:
    r = admin.post("/v1/metrics/tokens", json={"description": "prometheus"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["kind"] == "metrics" and body["user"] is None
    assert body["token"].startswith("phxm_")
    return body["id"], body["token"]


def test_scraping_needs_a_token_and_the_right_one(head: HeadProc) -> None:
    with head.client() as admin:
        user = _user_token(admin)
    for path in SCRAPES:
        assert httpx.get(head.url + path).status_code == 401
        wrong = httpx.get(head.url + path, headers={"Authorization": "Bearer phxm_nope"})
        assert wrong.status_code == 401
        with head.client(user) as plain:
            r = plain.get(path)
            assert r.status_code == 403, r.text  # job/user/team labels of every team
            assert "scrape-only" in r.json()["detail"]
    with head.client(user) as plain:
        assert plain.post("/v1/metrics/tokens", json={}).status_code == 403


def test_admins_scrape_and_promtool_accepts_every_endpoint(head: HeadProc) -> None:
    with head.client() as admin:
        for path in SCRAPES:
            r = admin.get(path)
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
            checked = promtool(r.text)
            assert checked.returncode == 0, (path, checked.stdout, checked.stderr)
        names = {f.name for f in text_string_to_metric_families(admin.get("/metrics").text)}
    assert {
        "phalanx_jobs_started",
        "phalanx_job_queue_wait_seconds",
        "phalanx_job_submit_to_running_seconds",
        "phalanx_scheduling_cycle_duration_seconds",
        "phalanx_node_failures",
        "phalanx_gpus",
        "phalanx_jobs",
        "phalanx_team_gpus_in_use",
    } <= names


def test_a_scrape_only_token_scrapes_and_does_nothing_else(head: HeadProc) -> None:
    with head.client() as admin:
        token_id, token = _metrics_token(admin)
        listed = {t["id"]: t for t in admin.get("/v1/tokens").json()["tokens"]}
        assert listed[token_id]["kind"] == "metrics"
    with head.client(token) as scraper:
        for path in SCRAPES:
            assert scraper.get(path).status_code == 200
        refused = [
            scraper.get("/v1/jobs"),
            scraper.get("/v1/jobs/1"),
            scraper.get("/v1/nodes"),
            scraper.get("/v1/whoami"),
            scraper.get("/v1/tokens"),
            scraper.post("/v1/jobs", json={"command": ["true"], "workdir": "/tmp"}),
            scraper.post("/v1/tokens", json={"user": "admin"}),
            scraper.post("/v1/metrics/tokens", json={}),
            scraper.post("/v1/nodes/n1/drain", json={"reason": "x"}),
        ]
        assert [r.status_code for r in refused] == [403] * len(refused), [
            (r.request.url.path, r.status_code) for r in refused
        ]
    with head.client() as admin:
        assert admin.delete(f"/v1/tokens/{token_id}").status_code == 204
    with head.client(token) as scraper:
        assert scraper.get("/metrics").status_code == 401  # revoked: at once


@pytest.mark.parametrize(
    "query", ["shard=2&of=2", "shard=0&of=0", "shard=-1&of=2", "of=5000", "shard=x"]
)
def test_bad_shards_are_refused_clearly(head: HeadProc, query: str) -> None:
    with head.client() as admin:
        r = admin.get(f"/v1/metrics/gpus?{query}")
    assert r.status_code == 422, r.text
    assert r.json()["detail"]


def test_metrics_token_requests_are_bounded(head: HeadProc) -> None:
    with head.client() as admin:
        for body in (
            {"description": "x" * 201},
            {"expires_s": 0},
            {"expires_s": 1e12},
            {"unknown": 1},
        ):
            r = admin.post("/v1/metrics/tokens", json=body)
            assert r.status_code == 422, (body, r.text)
