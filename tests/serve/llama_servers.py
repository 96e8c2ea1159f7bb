"""Real llama-server processes for the hand-off tests, and a `Post` built on httpx.

The router supplies the real `Post` (its upstream client); these tests use the smallest
one that does the same: a JSON POST carrying the engine key.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from phalanx.api.serving import DeploymentSpec, Endpoint, PoolRole, PoolSpec
from phalanx.local.cluster import free_port
from phalanx.serve.engines import engine_command
from phalanx.serve.handoff import Post
from phalanx.testing.engines import llama_server, smollm2

KEY = "engine-key-for-tests"
MODEL = "smollm2"
HEADERS = {"Authorization": f"Bearer {KEY}"}


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    slots: int

    def endpoint(self, pool: PoolRole, job_id: int = 1) -> Endpoint:
        return Endpoint(job_id=job_id, pool=pool, url=self.url, slots=self.slots, generation=1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def start(folder: Path, name: str, handoff_dir: Path, slots: int = 2) -> Server:
    """A llama-server of a disaggregated deployment's pool, started with the command line
    the replica wrapper runs (phalanx.serve.engines) plus one thread and a small context
    through the pool's `args`; not waited for (see `wait_ready`)."""
    spec = DeploymentSpec(
        name="chat",
        engine="llama.cpp",
        model=str(smollm2()),
        engine_path=str(llama_server()),
        served_model_name=MODEL,
        pools=[
            PoolSpec(role=role, slots=slots, args=["-t", "1", "-c", str(1024 * slots)])
            for role in ("prefill", "decode")
        ],
        handoff_dir=str(handoff_dir),
    )
    port = free_port()
    key_file = folder / f"{name}.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    launch = engine_command(
        spec, spec.pools[0], host="127.0.0.1", port=port, key=KEY, key_file=str(key_file)
    )
    log = folder / f"{name}.log"
    proc = start_logged(launch.argv, log, {**os.environ, **launch.env})
    return Server(f"http://127.0.0.1:{port}", proc, log, slots)


def start_logged(
    argv: Sequence[str], log: Path, env: dict[str, str], *, new_session: bool = False
) -> subprocess.Popen[bytes]:
    """An engine process, its output (both streams) into `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=new_session,
        )


class Engine(Protocol):
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def wait_healthy(
    what: str, servers: Sequence[Engine], timeout_s: float, poll_s: float, tail: int
) -> None:
    """Until each engine answers /health 200; its log's last `tail` characters if it exits
    or `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    for server in servers:
        while True:
            if server.proc.poll() is not None:
                raise RuntimeError(f"{what} exited: {server.log.read_text()[-tail:]}")
            try:
                if httpx.get(server.url + "/health", headers=HEADERS, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready: {server.log.read_text()[-tail:]}")
            time.sleep(poll_s)


def wait_ready(*servers: Server, timeout_s: float = 120.0) -> None:
    wait_healthy("llama-server", servers, timeout_s, 0.1, 2000)


def make_post(client: httpx.AsyncClient) -> Post:
    async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        answer = await client.post(url + path, json=body, headers=HEADERS)
        return answer.status_code, answer.json()

    return post


async def ask(
    client: httpx.AsyncClient,
    url: str,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str] = HEADERS,
) -> tuple[str, dict[str, Any]]:
    """Send a request (streaming or not, as `body` says) and return the generated text
    and the engine's last `timings`/`usage` (from the answer, or the stream's last chunk)."""
    if not body.get("stream"):
        answer = await client.post(url + path, json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        data = answer.json()
        return _text(path, data), data
    text: list[str] = []
    last: dict[str, Any] = {}
    async for chunk in _events(client, url + path, body, headers):
        text.append(_text(path, chunk))
        if "timings" in chunk:
            last = chunk
    return "".join(text), last


async def _events(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> AsyncIterator[dict[str, Any]]:
    async with client.stream("POST", url, json=body, headers=headers) as answer:
        assert answer.status_code == 200, await answer.aread()
        async for line in answer.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                return
            yield json.loads(data)


def _text(path: str, data: dict[str, Any]) -> str:
    if path == "/completion":
        return str(data.get("content", ""))
    parts = []
    for choice in data.get("choices", []):
        if "text" in choice:
            parts.append(choice["text"] or "")
        elif "message" in choice:
            parts.append(choice["message"].get("content") or "")
        elif "delta" in choice:
            parts.append(choice["delta"].get("content") or "")
    return "".join(parts)
