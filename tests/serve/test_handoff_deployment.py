"""The hand-off across a real disaggregated deployment: a head and an agent (fake GPUs) run
a prefill and a decode replica job (the replica wrapper starting llama-server with
phalanx.serve.engines' command line), the endpoints come from the head, and the wrappers
sweep the shared hand-off folder."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from phalanx.api.serving import DeploymentSpec, Endpoints, PoolSpec
from phalanx.client.serving import ServeClient
from phalanx.local import LocalCluster
from phalanx.serve.handoff import FILE_PREFIX, FILE_SUFFIX, FILE_TTL_S, Handoff
from phalanx.testing import engines
from tests.serve.llama_servers import ask
from tests.serve.polling import wait_for

T = TypeVar("T")
ARGS = ["-t", "1", "-c", "2048"]
STALE = f"{FILE_PREFIX}{'0' * 32}{FILE_SUFFIX}"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Endpoints, Path]]:
    state = tmp_path_factory.mktemp("handoff-deploy")
    handoff = state / "handoff"
    handoff.mkdir()
    # Left behind by a router that died between save and restore.
    stale = handoff / STALE
    stale.write_bytes(b"kv")
    old = time.time() - FILE_TTL_S - 60
    os.utime(stale, (old, old))
    with LocalCluster(state, nodes=1, gpus_per_node=2) as cluster, cluster.client() as api:
        serve = ServeClient(api)
        serve.apply(
            DeploymentSpec(
                name="split",
                engine="llama.cpp",
                model=str(engines.smollm2()),
                engine_path=str(engines.llama_server()),
                served_model_name="smol",
                pools=[
                    PoolSpec(role="prefill", slots=2, args=ARGS),
                    PoolSpec(role="decode", slots=2, args=ARGS),
                ],
                handoff_dir=str(handoff),
            )
        )

        def both() -> Endpoints | None:
            ep = serve.endpoints("split")
            return ep if sorted(e.pool for e in ep.endpoints) == ["decode", "prefill"] else None

        yield wait_for("a ready prefill and decode replica", both), handoff
        serve.delete("split")


@pytest.mark.parametrize(
    ("path", "stream"),
    [("/v1/completions", False), ("/v1/chat/completions", True)],
)
def test_a_hand_off_between_the_deployments_replicas_matches_one_replica(
    deployment: tuple[Endpoints, Path], path: str, stream: bool
) -> None:
    ep, folder = deployment
    (prefill,) = [e for e in ep.endpoints if e.pool == "prefill"]
    (decode,) = [e for e in ep.endpoints if e.pool == "decode"]
    headers = {"Authorization": f"Bearer {ep.engine_key}"}
    body: dict[str, object] = {"model": "smol", "temperature": 0, "max_tokens": 8}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "Name three colours."}]
        body["stream"] = stream
    else:
        body["prompt"] = "The longest river of Africa is the"

    async def main() -> tuple[str, str]:
        handoff = Handoff(ep.engine, handoff_dir=folder)
        handoff.set_replicas(ep.endpoints)
        async with httpx.AsyncClient(timeout=60, headers=headers) as client:

            async def post(url: str, p: str, b: dict[str, object]) -> tuple[int, dict[str, object]]:
                answer = await client.post(url + p, json=b)
                return answer.status_code, answer.json()

            # The reference: the same request, whole, on the prefill pool's replica.
            alone, _ = await ask(client, prefill.url, path, dict(body), headers)
            prepared = await handoff.prefill(post, prefill, decode, path, dict(body))
            try:
                split, _ = await ask(client, decode.url, path, prepared.body, headers)
            finally:
                await prepared.release()
        return alone, split

    alone, split = asyncio.run(main())
    assert split == alone and split.strip()
    # The router saw the folder and removed its file once restored.
    assert [f.name for f in folder.iterdir() if f.name != STALE] == []


def test_the_replicas_sweep_what_a_hand_off_left_behind(
    deployment: tuple[Endpoints, Path],
) -> None:
    _, folder = deployment
    wait_for("the stale hand-off file swept", lambda: not any(folder.iterdir()), timeout=30)
