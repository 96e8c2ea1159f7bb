"""The router in front of a disaggregated pair (`--prefill URL --decode URL`): the prompt is
prefilled on one llama-server, its KV handed to the other (disagg's Handoff, llama.cpp slot
save/restore), and the decode replica generates — greedy outputs as one replica's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serve.llama_servers import KEY, MODEL, Server, start, wait_ready
from tests.serve.test_router_llama import Proc, _wait_ready, metric, start_router


@dataclass
class Pair:
    prefill: Server
    decode: Server
    router: Proc


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    folder = tmp_path_factory.mktemp("disagg")
    handoff = folder / "handoff"
    handoff.mkdir()
    servers = [start(folder, "prefill", handoff), start(folder, "decode", handoff)]
    router: Proc | None = None
    try:
        wait_ready(*servers)
        router = start_router(
            folder, "--prefill", servers[0].url, "--decode", servers[1].url, "--engine-key", KEY,
            "--engine", "llama.cpp", "--slots", "2", "--no-auth",
        )  # fmt: skip
        _wait_ready(router, "/health")
        yield Pair(servers[0], servers[1], router)
    finally:
        if router is not None:
            router.stop()
        for s in servers:
            s.stop()


def text(path: str, response: httpx.Response, stream: bool) -> str:
    assert response.status_code == 200, response.text
    if not stream:
        choice = response.json()["choices"][0]
        return str(choice["text"] if path == "/v1/completions" else choice["message"]["content"])
    out = []
    for block in response.text.split("\n\n"):
        data = block.removeprefix("data: ")
        if not block or data == "[DONE]":
            continue
        choice = json.loads(data)["choices"]
        if choice:
            c = choice[0]
            out.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
    return "".join(out)


REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"prompt": "The three primary colours are", "max_tokens": 12}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say a fruit."}],
                              "max_tokens": 12}),
]  # fmt: skip


def test_disaggregated_outputs_match_one_replica_streaming_and_not(
    pair: Pair, tmp_path: Path
) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    for path, request in REQUESTS:
        for stream in (False, True):
            body = {"model": MODEL, "temperature": 0, **request, "stream": stream}
            want = text(path, httpx.post(pair.decode.url + path, json=body, headers=headers,
                                         timeout=60), stream)  # fmt: skip
            got = text(path, httpx.post(pair.router.url + path, json=body, timeout=60), stream)
            assert got == want and got
    metrics = httpx.get(pair.router.url + "/metrics").text
    assert metric(metrics, "phalanx_router_handoff_seconds_count") == 4
    assert metric(metrics, "phalanx_router_replica_requests", 'pool="decode"') == 4
    # A request the hand-off cannot carry gets a 400 in OpenAI's shape, not a 5xx.
    several = {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2}
    r = httpx.post(pair.router.url + "/v1/completions", json=several, timeout=30)
    assert r.status_code == 400 and "hand-off" in r.json()["error"]["message"]
