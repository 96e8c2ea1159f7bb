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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from phalanx.api.serving import Endpoint, PoolRole
from phalanx.local.cluster import free_port
from phalanx.serve.handoff import Handoff, HandoffError
from phalanx.testing.vllm_env import smollm2_safetensors, vllm_python
from tests.serve.llama_servers import HEADERS, KEY, MODEL, ask, make_post

pytestmark = pytest.mark.vllm

NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
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


def start(folder: Path, name: str, *, nixl: bool) -> Vllm:
    """A vLLM replica as a deployment's engine command line starts it (serving contract:
    prefill/decode pools add the NixlConnector and a side-channel port)."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}
    args = [
        str(vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(smollm2_safetensors()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        "--api-key",
        KEY,
        "--max-num-seqs",
        "4",
        "--enforce-eager",
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
    ]
    if nixl:
        args += ["--kv-transfer-config", NIXL]
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port())
    log = folder / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return Vllm(f"http://127.0.0.1:{port}", proc, log)


def wait_ready(*servers: Vllm, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    for server in servers:
        while True:
            if server.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited: {server.log.read_text()[-3000:]}")
            try:
                if httpx.get(server.url + "/health", headers=HEADERS, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM not ready: {server.log.read_text()[-3000:]}")
            time.sleep(0.5)


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
    server = start(tmp_path_factory.mktemp("vllm-agg"), "aggregated", nixl=False)
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
    prefill = start(folder, "prefill", nixl=True)
    decode = start(folder, "decode", nixl=True)
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
