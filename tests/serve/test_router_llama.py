"""The router as a process in front of two real llama-server replicas of SmolLM2-135M
(`phalanx serve router --replica URL …`): same greedy outputs as one replica, each policy's
routing, a replica killed under load, Phalanx-token auth against a real head, rate limits,
hostile input."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from phalanx.api.models import TeamSpec, UserCreate
from phalanx.local import LocalCluster
from phalanx.local.cluster import free_port
from phalanx.serve.router.app import Router
from phalanx.serve.router.server import RouterOptions, build
from phalanx.serve.router.stats import PoolWindow
from phalanx.testing.engines import llama_server, smollm2

KEY = "engine-secret-key"
MODEL = "smol"


@dataclass
class Proc:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _wait_ready(p: Proc, path: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if p.proc.poll() is not None:
            raise RuntimeError(f"{p.proc.args!r} exited {p.proc.returncode}:\n{p.tail()}")
        try:
            if httpx.get(p.url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{p.url}{path} not ready after {timeout_s} s:\n{p.tail()}")


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of the first series `name{…labels…}` in a Prometheus exposition."""
    for line in text.splitlines():
        if line.startswith(name) and labels in line and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels} in the metrics")


def _wait_busy(replica: Proc, slots: int = 1, timeout_s: float = 30.0) -> None:
    """Until `slots` of the replica's slots are processing a request."""
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {KEY}"}
    while time.monotonic() < deadline:
        answer = httpx.get(replica.url + "/slots", headers=headers, timeout=5).json()
        if sum(1 for s in answer if s.get("is_processing")) >= slots:
            return
        time.sleep(0.01)
    raise AssertionError("the replica never started generating")


def start_replica(logs: Path) -> Proc:
    port = free_port()
    log = logs / f"llama-{port}.log"
    argv = [
        str(llama_server()), "-m", str(smollm2()), "--host", "127.0.0.1", "--port", str(port),
        "-np", "2", "--api-key", KEY, "--metrics", "--alias", MODEL, "-t", "1", "-c", "2048",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(f"http://127.0.0.1:{port}", proc, log)


def start_router(logs: Path, *args: str) -> Proc:
    port = free_port()
    log = logs / f"router-{port}.log"
    argv = [
        sys.executable, "-m", "phalanx.cli.main", "serve", "router",
        "--listen", f"127.0.0.1:{port}", "--engine-key", KEY, *args,
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(f"http://127.0.0.1:{port}", proc, log)


@dataclass
class Setup:
    replicas: list[Proc]
    routers: dict[str, Proc]
    head: LocalCluster
    tokens: dict[str, str]
    logs: Path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    logs = tmp_path_factory.mktemp("router-logs")
    procs: list[Proc] = []
    with LocalCluster(tmp_path_factory.mktemp("head"), nodes=0, tls=False) as head:
        try:
            replicas = [start_replica(logs), start_replica(logs)]
            procs.extend(replicas)
            fixed = [a for r in replicas for a in ("--replica", r.url)]
            routers = {
                name: start_router(logs, *fixed, "--no-auth", "--policy", name, *extra)
                for name, extra in (
                    ("round-robin", []),
                    ("least-load", []),
                    ("power-of-two", []),
                    ("kv-aware", ["--block-chars", "64"]),
                )
            }
            routers["tight"] = start_router(logs, *fixed, "--no-auth", "--max-in-flight", "1")
            routers["auth"] = start_router(
                logs, *fixed, "--head", head.url, "--owner", "alice", "--team", "ml",
                "--rate-limit", "ml=0.2", "--served-model-name", MODEL,
            )  # fmt: skip
            procs.extend(routers.values())
            admin = head.client()
            for team in ("ml", "vision"):
                admin.set_team(TeamSpec(name=team))
            admin.create_user(UserCreate(name="alice", teams=["ml"]))
            admin.create_user(UserCreate(name="carol", teams=["ml"]))
            admin.create_user(UserCreate(name="bob", teams=["vision"]))
            tokens = {u: admin.create_token(u).token for u in ("alice", "carol", "bob")}
            tokens["admin"] = head.admin_token
            for r in replicas:
                _wait_ready(r, "/health")
            for router in routers.values():
                _wait_ready(router, "/health")
            yield Setup(replicas, routers, head, tokens, logs)
        finally:
            for p in procs:
                p.stop()


def complete(url: str, body: dict[str, Any], token: str | None = None) -> httpx.Response:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url + path, json={"model": MODEL, **body}, headers=headers, timeout=60)


def direct(replica: Proc, body: dict[str, Any]) -> httpx.Response:
    return complete(replica.url, body, KEY)


def events(text: str) -> list[Any]:
    """A stream's SSE events, without what differs between two identical generations."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        if data == "[DONE]":
            out.append(data)
            continue
        event = json.loads(data)
        for volatile in ("id", "created", "timings", "usage"):
            event.pop(volatile, None)
        out.append(event)
    return out


def text_of(event: Any) -> str:
    if not isinstance(event, dict) or not event.get("choices"):
        return ""
    choice = event["choices"][0]
    return str(choice.get("text") or (choice.get("delta") or {}).get("content") or "")


GREEDY = {"temperature": 0, "max_tokens": 8}


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "The capital of France is", **GREEDY},
        {"messages": [{"role": "user", "content": "Name a colour."}], **GREEDY},
    ],
    ids=["completions", "chat"],
)
def test_greedy_outputs_through_the_router_match_one_replica(
    setup: Setup, body: dict[str, Any]
) -> None:
    router = setup.routers["round-robin"]
    want = direct(setup.replicas[0], body)
    assert want.status_code == 200
    for _ in range(2):  # one request to each replica
        got = complete(router.url, body)
        assert got.status_code == 200, got.text
        assert got.json()["choices"] == want.json()["choices"]
        for count in ("prompt_tokens", "completion_tokens"):  # (cached_tokens may differ)
            assert got.json()["usage"][count] == want.json()["usage"][count]
    streamed = {**body, "stream": True}
    want_stream = direct(setup.replicas[0], streamed)
    for _ in range(2):
        got = complete(router.url, streamed)
        assert got.status_code == 200
        assert got.headers["content-type"].startswith("text/event-stream")
        assert events(got.text) == events(want_stream.text)
        assert events(got.text)[-1] == "[DONE]"


def test_round_robin_alternates_and_least_load_spreads(setup: Setup) -> None:
    body = {"prompt": "Hi", "max_tokens": 1, "temperature": 0}
    rr = [complete(setup.routers["round-robin"].url, body) for _ in range(4)]
    order = [r.headers["x-phalanx-replica"] for r in rr]
    assert order[0] != order[1] and order[0::2] == [order[0]] * 2 and order[1::2] == [order[1]] * 2
    ll = [complete(setup.routers["least-load"].url, body) for _ in range(4)]
    assert {r.headers["x-phalanx-replica"] for r in ll} == {"1", "2"}
    p2 = [complete(setup.routers["power-of-two"].url, body) for _ in range(20)]
    assert all(r.status_code == 200 for r in p2)
    assert {r.headers["x-phalanx-replica"] for r in p2} == {"1", "2"}


def test_kv_aware_sends_a_repeated_prefix_to_the_same_replica(setup: Setup) -> None:
    router = setup.routers["kv-aware"].url
    prefixes = [
        "You are a helpful assistant for a bakery. Answer briefly and kindly. " * 3,
        "You are a terse assistant for a bicycle shop. Answer in one word only. " * 3,
    ]
    homes: list[str] = []
    for prefix in prefixes:
        seen = set()
        for question in ("Bread?", "Cake?", "Hours?", "Price?"):
            r = complete(router, {"prompt": prefix + question, "max_tokens": 1, "temperature": 0})
            assert r.status_code == 200
            seen.add(r.headers["x-phalanx-replica"])
        assert len(seen) == 1, seen
        homes.extend(seen)
    metrics = httpx.get(router + "/metrics").text
    # 3 of 4 requests per prefix hit their cache.
    assert metric(metrics, "phalanx_router_prefix_cache_hit_rate") > 0.5
    assert 'phalanx_router_replica_requests{pool="aggregated",replica="1"' in metrics


def test_a_replica_killed_under_load_fails_no_request(setup: Setup) -> None:
    victim = start_replica(setup.logs)
    router = start_router(
        setup.logs, "--replica", victim.url, "--replica", setup.replicas[1].url,
        "--no-auth", "--policy", "round-robin",
    )  # fmt: skip
    try:
        _wait_ready(victim, "/health")
        _wait_ready(router, "/health")
        body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
        long = {
            "model": MODEL,
            "prompt": "Count:",
            "max_tokens": 1000,
            "temperature": 0,
            "ignore_eos": True,
        }
        # A long stream from the victim (round-robin's first) keeps one of its slots busy.
        with httpx.stream("POST", router.url + "/v1/completions",
                          json={**long, "stream": True}, timeout=60) as stream:  # fmt: skip
            assert stream.headers["x-phalanx-replica"] == "1"
            chunks = stream.iter_bytes()
            received = next(chunks)
            with ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(complete, router.url, body) for _ in range(8)]
                _wait_busy(victim, slots=2)  # a whole request is in flight there too
                victim.proc.send_signal(signal.SIGKILL)
                answers = [f.result() for f in futures]
            received += b"".join(chunks)
        assert [a.status_code for a in answers] == [200] * 8
        texts = {a.json()["choices"][0]["text"] for a in answers}
        assert len(texts) == 1  # every answer is the same greedy text, whoever produced it
        # The stream had begun: never sent again, it ends with an error event.
        got = events(received.decode())
        assert "[DONE]" not in got and "error" in got[-1]
        assert sum(1 for e in got if text_of(e)) < 1000
        after = [complete(router.url, body) for _ in range(3)]
        assert [a.status_code for a in after] == [200] * 3
        metrics = httpx.get(router.url + "/metrics").text
        assert metric(metrics, "phalanx_router_replica_failures", 'replica="1"') >= 1
        assert metric(metrics, "phalanx_router_replica_failures", 'replica="2"') == 0
        assert metric(metrics, "phalanx_router_retries_total") >= 1
    finally:
        router.stop()
        victim.stop()


def test_auth_owner_team_and_admin_only_with_team_rate_limits(setup: Setup) -> None:
    url = setup.routers["auth"].url
    body = {"prompt": "Hi", "max_tokens": 1, "temperature": 0}
    none = complete(url, body)
    assert none.status_code == 401 and none.json()["error"]["type"] == "authentication_error"
    assert complete(url, body, "not-a-token").status_code == 401
    bob = complete(url, body, setup.tokens["bob"])
    assert bob.status_code == 403 and "bob" in bob.json()["error"]["message"]
    for who in ("alice", "admin", "carol"):
        r = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {setup.tokens[who]}"})
        assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL
    # Team ml may send 0.2 requests/s (a burst of one): carol's second request waits.
    assert complete(url, body, setup.tokens["carol"]).status_code == 200
    limited = complete(url, body, setup.tokens["alice"])
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert complete(url, body, setup.tokens["admin"]).status_code == 200  # no team: no limit
    assert httpx.get(url + "/metrics").status_code == 401
    assert KEY not in setup.routers["auth"].tail()
    assert setup.tokens["alice"] not in setup.routers["auth"].tail()


def test_requests_past_max_in_flight_get_503_until_one_ends(setup: Setup) -> None:
    router = setup.routers["tight"]
    long = {
        "model": MODEL,
        "prompt": "Count:",
        "max_tokens": 1000,
        "temperature": 0,
        "ignore_eos": True,
    }
    with httpx.stream("POST", router.url + "/v1/completions", json={**long, "stream": True},
                      timeout=60) as first:  # fmt: skip
        assert first.status_code == 200
        chunks = first.iter_bytes()  # (held: a dropped iterator closes the stream)
        next(chunks)  # it is being answered now (for seconds)
        busy = complete(router.url, {"prompt": "Hi", "max_tokens": 1})
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["code"] == "overloaded"
    # The client left mid-stream: the router drops the replica's stream and frees its place.
    deadline = time.monotonic() + 20
    while (r := complete(router.url, {"prompt": "Hi", "max_tokens": 1})).status_code == 503:
        assert time.monotonic() < deadline, "the abandoned stream was never let go"
        time.sleep(0.05)
    assert r.status_code == 200
    metrics = httpx.get(router.url + "/metrics").text
    assert metric(metrics, "phalanx_router_in_flight") == 0


def test_hostile_input_gets_openai_errors_and_the_router_keeps_serving(setup: Setup) -> None:
    url = setup.routers["least-load"].url + "/v1/completions"
    huge = httpx.post(url, content=b'{"prompt": "' + b"a" * (5 * 1024 * 1024) + b'"}')
    assert huge.status_code == 413
    for content, status in [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (b'{"model": "smol", "prompt": "x", "stream": "yes"}', 400),
        (b'{"model": "smol", "prompt": 7}', 400),
        (b'{"model": "gpt-4", "prompt": "x"}', 404),
        (b'{"model": "smol", "prompt": "x", "n": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
        (b"[" * 200_000 + b"]" * 200_000, 400),
        (b"\xff\xfe garbage", 400),
    ]:
        r = httpx.post(url, content=content, timeout=30)
        assert r.status_code == status, (content[:60], r.text)
        error = r.json()["error"]
        assert error["message"] and error["type"]
    # A client that declares more body than it sends, then goes away.
    with socket.create_connection(("127.0.0.1", int(url.split(":")[2].split("/")[0]))) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    assert httpx.get(url.replace("/v1/completions", "/nope")).status_code == 404
    ok = complete(setup.routers["least-load"].url, {"prompt": "Hi", "max_tokens": 1})
    assert ok.status_code == 200
    assert setup.routers["least-load"].proc.poll() is None
    assert "Traceback" not in setup.routers["least-load"].tail()


def test_stats_window_in_a_running_router_measures_ttft_and_tpot(setup: Setup) -> None:
    """`build(background=…)` runs beside the router (as the autoscaler does) and reads
    `router.stats.window` while real requests go through it."""
    seen: list[PoolWindow] = []

    async def watch(router: Router) -> None:
        while True:
            seen.append(router.stats.window("aggregated", 300.0))
            await asyncio.sleep(0.02)

    options = RouterOptions(
        replicas=[r.url for r in setup.replicas], engine_key=KEY, no_auth=True,
        served_model_name=MODEL, policy="least-load",
    )  # fmt: skip
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build(options, background=[watch]), port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        body = {"prompt": "Count: one, two,", "max_tokens": 6, "temperature": 0}
        assert complete(url, body).status_code == 200
        assert complete(url, {**body, "stream": True}).status_code == 200
        assert complete(url, {"prompt": 5}).status_code == 400  # refused: not a request
        time.sleep(0.2)
        window = seen[-1]
        assert (window.requests, window.errors, window.in_flight) == (2, 0, 0)
        assert window.replicas_ready == 2
        assert len(window.ttft_ms) == 2 and all(t > 0 for t in window.ttft_ms)
        # The stream's TPOT from its events; the whole answer's from llama.cpp's timings.
        assert len(window.tpot_ms) == 2 and all(t > 0 for t in window.tpot_ms)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_kv_aware_counts_a_request_as_prefill_until_its_first_token_then_as_decoding(
    setup: Setup,
) -> None:
    """The outstanding work the kv-aware cost weighs, read from a running router: a
    streamed request's uncached blocks count as prefill until its first event is back,
    then only as a sequence in flight; nothing is left once it ends."""
    routers: list[Router] = []

    async def keep(router: Router) -> None:
        routers.append(router)

    options = RouterOptions(
        replicas=[r.url for r in setup.replicas], engine_key=KEY, no_auth=True,
        served_model_name=MODEL, policy="kv-aware", block_chars=64,
    )  # fmt: skip
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build(options, background=[keep]), port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while not (server.started and routers) and time.monotonic() < deadline:
            time.sleep(0.02)
        router = routers[0]
        prompt = "Tell me about the sea and the ships on it, " * 8  # 344 chars: 5 blocks
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 200, "temperature": 0,
                "ignore_eos": True, "stream": True}  # fmt: skip
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            chunks = r.iter_bytes()
            next(chunks)  # the first token is back: it is decoding now
            (busy,) = [x for x in router.replicas if x.in_flight]
            assert (busy.in_flight, busy.active_blocks) == (1, 5)
            assert (busy.prefilling, busy.prefill_blocks) == (0, 0)
            # A second prompt with the same prefix goes where it is cached: 0 + 1 decoding
            # there against 5 blocks to prefill on the idle replica.
            again = httpx.post(url + "/v1/completions", json={
                "model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0
            }, timeout=60)  # fmt: skip
            assert again.headers["x-phalanx-replica"] == r.headers["x-phalanx-replica"]
        deadline = time.monotonic() + 20
        while any(x.in_flight for x in router.replicas):
            assert time.monotonic() < deadline, "the stream was never let go"
            time.sleep(0.05)
        for x in router.replicas:
            assert (x.prefilling, x.prefill_blocks, x.active_blocks) == (0, 0, 0)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
