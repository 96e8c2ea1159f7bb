"""The vLLM prefill → decode hand-off (NixlConnector, the two-step `kv_transfer_params`
request) on real vLLM-on-CPU servers, against one aggregated vLLM.

Marked `vllm`: `make test` deselects them (pytest reports them as deselected), `make
test-vllm` runs them after `make vllm-env` built vLLM's own venv (.ci/run does both, and
says loudly when the venv cannot be installed). vLLM takes ~4.7 GB per instance here: at
most two run at once (the aggregated reference is stopped before the pair starts)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from phalanx.api.serving import DeploymentSpec, Endpoint, PoolRole, PoolSpec
from phalanx.local.cluster import free_port
from phalanx.serve.engines import engine_command
from phalanx.serve.handoff import Handoff, HandoffError
from phalanx.testing.vllm_env import smollm2_safetensors, vllm_python
from tests.serve.llama_servers import (
    HEADERS,
    KEY,
    MODEL,
    ask,
    make_post,
    start_logged,
    wait_healthy,
)

pytestmark = pytest.mark.vllm

MAX_TOKENS = 12
CASES = [
    ("/v1/completions", False, "The three most important rivers of Europe are the Danube, the"),
    ("/v1/completions", True, "A recipe for bread needs flour, water, salt and"),
    ("/v1/chat/completions", False, "What is the capital of France?"),
    ("/v1/chat/completions", True, "Name a planet of the solar system."),
]


@dataclass
class Vllm:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def endpoint(self, pool: PoolRole) -> Endpoint:
        return Endpoint(job_id=1, pool=pool, url=self.url, slots=4, generation=1)

    def stop(self) -> None:
        """vLLM runs an engine core and a worker process beside its API server: the whole
        process group goes."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # children left behind, if any


def start(folder: Path, name: str, role: PoolRole, core: int) -> Vllm:
    """A vLLM replica of a deployment's pool, started with the command line the replica
    wrapper runs (phalanx.serve.engines: prefill/decode pools get the NixlConnector and
    its side channel), plus CPU settings: one core each (OpenMP threads of two engines
    spinning on the same two cores slow decoding a hundredfold), a 1 GiB KV cache."""
    roles: list[PoolRole] = ["aggregated"] if role == "aggregated" else ["prefill", "decode"]
    spec = DeploymentSpec(
        name="chat",
        engine="vllm",
        model=str(smollm2_safetensors()),
        engine_path=str(vllm_python()),
        served_model_name=MODEL,
        pools=[
            PoolSpec(
                role=r,
                slots=4,
                args=["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048"],
            )
            for r in roles
        ],
    )
    port = free_port()
    pool = next(p for p in spec.pools if p.role == role)
    launch = engine_command(
        spec,
        pool,
        host="127.0.0.1",
        port=port,
        key=KEY,
        key_file=str(folder / "unused.key"),
        side_channel_port=free_port(),
    )
    env = {
        **os.environ,
        **launch.env,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(core % (os.cpu_count() or 1)),
    }
    log = folder / f"{name}.log"
    proc = start_logged(launch.argv, log, env, new_session=True)
    return Vllm(f"http://127.0.0.1:{port}", proc, log)


def wait_ready(*servers: Vllm, timeout_s: float = 600.0) -> None:
    wait_healthy("vLLM", servers, timeout_s, 0.5, 3000)


def _request(path: str, text: str, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "stream": stream,
    }
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def _tokens_by_source(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers=HEADERS, timeout=10).text
    found = re.findall(
        r'^vllm:prompt_tokens_by_source_total\{[^}]*source="(\w+)"[^}]*\} (\S+)$', text, re.M
    )
    return {source: float(value) for source, value in found}


@pytest.fixture(scope="module")
def aggregated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    server = start(tmp_path_factory.mktemp("vllm-agg"), "aggregated", "aggregated", core=0)
    try:
        wait_ready(server)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def reference(aggregated: Vllm) -> dict[tuple[str, bool, str], str]:
    async def main() -> dict[tuple[str, bool, str], str]:
        async with httpx.AsyncClient(timeout=300) as client:
            return {
                case: (
                    await ask(
                        client, aggregated.url, case[0], _request(case[0], case[2], stream=case[1])
                    )
                )[0]
                for case in CASES
            }

    return asyncio.run(main())


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory,
    aggregated: Vllm,
    reference: dict[tuple[str, bool, str], str],
) -> Iterator[tuple[Vllm, Vllm]]:
    aggregated.stop()  # at most two vLLM instances at once (memory)
    folder = tmp_path_factory.mktemp("vllm-pd")
    prefill = start(folder, "prefill", "prefill", core=0)
    decode = start(folder, "decode", "decode", core=1)
    try:
        wait_ready(prefill, decode)
        yield prefill, decode
    finally:
        prefill.stop()
        decode.stop()


def test_a_prefill_replica_without_the_connector_is_a_handoff_error(aggregated: Vllm) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(timeout=300) as client:
            with pytest.raises(HandoffError) as failed:
                await Handoff("vllm").prefill(
                    make_post(client),
                    aggregated.endpoint("prefill"),
                    aggregated.endpoint("decode"),
                    "/v1/completions",
                    _request("/v1/completions", "Hello", stream=False),
                )
        assert "returned no kv_transfer_params" in str(failed.value)

    asyncio.run(main())


@pytest.mark.parametrize("case", CASES, ids=[f"{p}-stream={s}" for p, s, _ in CASES])
def test_vllm_disaggregated_output_is_identical_to_aggregated_and_pulls_the_kv(
    reference: dict[tuple[str, bool, str], str],
    pair: tuple[Vllm, Vllm],
    case: tuple[str, bool, str],
) -> None:
    prefill, decode = pair
    path, stream, text = case

    async def main() -> tuple[str, Any]:
        async with httpx.AsyncClient(timeout=300) as client:
            prepared = await Handoff("vllm").prefill(
                make_post(client),
                prefill.endpoint("prefill"),
                decode.endpoint("decode"),
                path,
                _request(path, text, stream=stream),
            )
            assert prepared.body["kv_transfer_params"]["do_remote_prefill"] is True
            try:
                split, _ = await ask(client, decode.url, path, prepared.body)
            finally:
                await prepared.release()
            return split, prepared.timings

    before = _tokens_by_source(decode.url)
    split, timings = asyncio.run(main())
    after = _tokens_by_source(decode.url)
    assert split == reference[case]
    assert split.strip()
    # The decode replica took the prompt's KV from the prefill replica over NIXL and
    # computed (almost) none of it itself.
    pulled = after["external_kv_transfer"] - before.get("external_kv_transfer", 0)
    computed = after["local_compute"] - before.get("local_compute", 0)
    assert timings.prompt_tokens >= 8
    assert pulled >= timings.prompt_tokens - 1
    assert computed <= 1
