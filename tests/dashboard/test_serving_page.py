"""Serving metrics end to end: a real head and agent (fake GPUs), a real deployment (one
llama-server replica as a job) and a real router (`phalanx serve router --head …`) that
scrapes the engine's /metrics and reports its summary to the head. The summary shows in
`GET /v1/serve/deployments/{name}`, `phalanx serve show`, the head's /metrics and the
dashboard's Serving page (Playwright, Debian's chromium) — to the owner, not to a user of
another team."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

import httpx
import pytest
from playwright.sync_api import Page, expect
from typer.testing import CliRunner

from phalanx.api.serving import DeploymentInfo, DeploymentSpec, PoolSpec
from phalanx.cli.main import app
from phalanx.client.serving import ServeClient
from phalanx.local import LocalCluster
from phalanx.testing import engines
from phalanx.tls import client_context
from tests.dashboard.conftest import People, shot, sign_in
from tests.serve.polling import wait_for
from tests.serve.test_router_llama import Proc, _wait_ready, metric, start_router

T = TypeVar("T")
NAME = "smol-metrics"
ROUTER_ID = "router-under-test"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A head (TLS) and one agent with two fake GPUs (overrides conftest's two nodes)."""
    with LocalCluster(tmp_path_factory.mktemp("serving-page"), nodes=1, gpus_per_node=2) as c:
        yield c


@dataclass
class World:
    cluster: LocalCluster
    people: People
    router: Proc
    info: DeploymentInfo  # with the router's report of the requests sent


@pytest.fixture(scope="module")
def world(
    cluster: LocalCluster, people: People, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    state = tmp_path_factory.mktemp("serving-router")
    alice = ServeClient(cluster.client(people.alice))
    alice.apply(
        DeploymentSpec(
            name=NAME, engine="llama.cpp", model=str(engines.smollm2()),
            engine_path=str(engines.llama_server()), team=people.red,
            pools=[PoolSpec(replicas=1, slots=2, args=["-t", "1", "-c", "1024"])],
        )
    )  # fmt: skip
    wait_for("a ready replica", lambda: len(alice.endpoints(NAME).endpoints) == 1)
    token_file = state / "router.token"
    token_file.write_text(people.alice)
    assert cluster.ca_file is not None
    router = start_router(
        state, "--head", cluster.url, "--deployment", NAME, "--token-file", str(token_file),
        "--ca-file", str(cluster.ca_file), "--report-interval", "0.5", "--engine-poll", "0.5",
        "--router-id", ROUTER_ID,
    )  # fmt: skip
    try:
        _wait_ready(router, "/health")
        body = {"model": NAME, "prompt": "Tell me about cats and", "max_tokens": 3}
        for _ in range(3):  # the same prompt: the engine's cache serves the repeats
            r = httpx.post(
                router.url + "/v1/completions", json=body, timeout=60,
                headers={"Authorization": f"Bearer {people.alice}"},
            )  # fmt: skip
            assert r.status_code == 200, r.text

        def reported() -> DeploymentInfo | None:
            info = alice.get(NAME)
            for s in info.stats:
                p = s.report.pools[0] if s.report.pools else None
                if p and p.requests >= 3 and p.cache_hit_rate is not None:
                    return info
            return None

        info = wait_for("the router's report of 3 requests", reported, timeout=30)
        yield World(cluster, people, router, info)
    finally:
        router.stop()
        alice.delete(NAME)


def test_the_routers_summary_reaches_the_head_and_serve_show(world: World) -> None:
    (s,) = world.info.stats
    assert s.report.router == ROUTER_ID and not s.stale
    (p,) = s.report.pools
    assert p.role == "aggregated" and p.requests >= 3 and p.errors == 0
    assert p.ttft_p50_ms is not None and p.ttft_p50_ms > 0
    assert p.tpot_p50_ms is not None and p.tpot_p50_ms > 0
    assert p.replicas_ready == 1 and p.engine_running is not None
    assert p.cache_hit_rate is not None and 0 < p.cache_hit_rate < 1
    assert p.slo_attainment is None  # the pool has no SLO
    (replica,) = world.info.replicas
    assert replica.node is not None and replica.ready
    env = world.cluster.client_env(world.people.alice)
    out = CliRunner().invoke(app, ["serve", "show", NAME], env=env)
    assert out.exit_code == 0, out.output
    assert re.search(rf"router {ROUTER_ID}: reported \d+ s ago", out.output), out.output
    assert re.search(r"pool aggregated: [\d.]+ req/s \([1-9]\d* in 30 s\), errors 0%", out.output)
    assert re.search(r"cache hit [1-9]\d?%", out.output), out.output
    assert replica.node in out.output


def test_the_heads_metrics_carry_per_deployment_gauges(world: World) -> None:
    c = world.cluster
    text = httpx.get(
        c.url + "/metrics", headers={"Authorization": f"Bearer {c.admin_token}"},
        verify=client_context(str(c.ca_file)),
    ).text  # fmt: skip
    labels = f'deployment="{NAME}",pool="aggregated"'
    assert metric(text, "phalanx_serve_replicas_desired", labels) == 1
    assert metric(text, "phalanx_serve_replicas_ready", labels) == 1
    assert metric(text, "phalanx_serve_replica_failures", labels) == 0
    assert metric(text, "phalanx_serve_routers_reporting", f'deployment="{NAME}"') == 1
    # Requests ended in the router's window: the gauge follows the latest report.
    assert metric(text, "phalanx_serve_requests_per_second", labels) > 0
    assert metric(text, "phalanx_serve_ttft_p50_seconds", labels) > 0
    assert 0 < metric(text, "phalanx_serve_cache_hit_rate", labels) < 1
    # The router's own /metrics re-exports the engine's numbers per replica.
    (replica,) = world.info.replicas
    router = httpx.get(
        world.router.url + "/metrics", headers={"Authorization": f"Bearer {world.people.alice}"}
    ).text
    at = f'pool="aggregated",replica="{replica.job_id}"'
    assert metric(router, "phalanx_router_engine_up", at) == 1
    assert metric(router, "phalanx_router_engine_generated_tokens", at) >= 3


def test_stats_reports_are_authenticated_bounded_and_per_deployment(world: World) -> None:
    c, people = world.cluster, world.people
    url = f"{c.url}/v1/serve/deployments/{NAME}/stats"
    pool = {"role": "aggregated", "requests": 1, "requests_per_s": 0.1, "errors": 0,
            "error_rate": 0}  # fmt: skip
    good = {"router": "other-router", "window_s": 30, "pools": [pool]}

    def post(token: str | None, body: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(url, json=body, headers=headers, verify=client_context(str(c.ca_file)))

    assert post(None, good).status_code == 401
    assert post("phx_not-a-token", good).status_code == 401
    assert post(people.bob, good).status_code == 404  # another team's: not there for bob
    for bad in (
        {**good, "pools": [{**pool, "error_rate": 2}]},
        {**good, "pools": [{**pool, "ttft_p50_ms": -1}]},
        {**good, "pools": [{**pool, "role": "everything"}]},
        {**good, "router": "x" * 129},
        {**good, "pools": [pool] * 4},
        {**good, "pools": [pool, pool]},
        {**good, "colour": "blue"},
    ):  # fmt: skip
        r = post(people.alice, bad)
        assert r.status_code == 422, (bad, r.text)
    decode = {**pool, "role": "decode"}  # not a pool of this deployment: dropped
    r = post(people.alice, {**good, "pools": [pool, decode]})
    assert r.status_code == 200, r.text
    assert [p["role"] for p in r.json()["report"]["pools"]] == ["aggregated"]
    routers = {s.report.router for s in ServeClient(c.client(people.alice)).get(NAME).stats}
    assert routers == {ROUTER_ID, "other-router"}


def test_the_serving_page_shows_the_deployment_to_its_owner_only(world: World, page: Page) -> None:
    c, people = world.cluster, world.people
    (replica,) = world.info.replicas
    sign_in(page, c.url, people.alice, "/ui/serving")
    section = page.locator(f"#deployment-{NAME}")
    expect(section).to_have_count(1)
    expect(section.locator("h2")).to_contain_text(f"owner {people.alice_name}")
    pool = page.locator(f"#pool-{NAME}-aggregated")
    expect(pool.locator("td.ready")).to_have_text("1")
    expect(pool.locator("td.desired")).to_have_text("1")
    row = page.locator(f"#replica-{replica.job_id}")
    expect(row).to_contain_text(replica.node or "?")
    expect(row).to_contain_text("yes")
    stats = section.locator(f'tr.router-pool[data-router="{ROUTER_ID}"][data-pool="aggregated"]')
    expect(stats.locator("td.requests")).to_have_text(re.compile(r"^[1-9]\d*$"))
    expect(stats.locator("td.hit-rate")).to_have_text(re.compile(r"^[1-9]\d?%$"))
    expect(page.locator('nav a[href="/ui/serving"]')).to_have_count(1)
    shot(page, "serving")
    page.context.clear_cookies()
    sign_in(page, c.url, people.bob, "/ui/serving")
    expect(page.locator("#no-deployments")).to_be_visible()
    expect(page.locator(f"#deployment-{NAME}")).to_have_count(0)
    assert NAME not in page.content()
