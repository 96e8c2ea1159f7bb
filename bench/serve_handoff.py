"""The llama.cpp prefill → decode hand-off's cost: TTFT and TPOT through a prefill and a
decode replica (phalanx.serve.handoff) beside the same requests on one aggregated replica.

    .venv/bin/python bench/serve_handoff.py [--requests 20] [--prompt-words 300] [--max-tokens 16]

Three real llama-server replicas of SmolLM2-135M (one thread each, started with the
command line of phalanx.serve.engines): prefill, decode, and the aggregated baseline. The
requests are sent one at a time, alternating baseline and disaggregated on the same
prompt (greedy, streaming), so both see the same machine. TTFT = request sent → first
content chunk (disaggregated: the hand-off included), TPOT = (E2E − TTFT) / (tokens − 1).
Prints one JSON object: both sides' mean/p50/p90 TTFT and mean TPOT, their ratios, the
hand-off's own time (save + restore) and its share of the disaggregated TTFT, how many
outputs were identical to the baseline's fresh answer and to its answer from its prompt
cache (the same request sent again: on long prompts llama.cpp's fresh and cached answers
differ, and the hand-off reproduces the cached one), and the host's CPU steal and load
average over the run.
At concurrency 1 disaggregation cannot win: this measures what the hand-off costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from phalanx.api.serving import DeploymentSpec, Endpoint, PoolSpec
from phalanx.serve.engines import engine_command
from phalanx.serve.handoff import Handoff
from phalanx.testing import engines

KEY = "bench-engine-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
VOCABULARY = (
    "the river city market stone winter light garden road music ancient empire north "
    "harbor mountain forest quiet letter window summer bridge story island evening"
)
WORDS = VOCABULARY.split()


def steal() -> tuple[int, int]:
    fields = Path("/proc/stat").read_text().split("\n")[0].split()
    return int(fields[8]), sum(int(x) for x in fields[1:9])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(folder: Path, handoff: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    spec = DeploymentSpec(
        name="bench",
        engine="llama.cpp",
        model=str(engines.smollm2()),
        engine_path=str(engines.llama_server()),
        pools=[
            PoolSpec(role=r, slots=2, args=["-t", "1", "-c", "4096"]) for r in ("prefill", "decode")
        ],
        handoff_dir=str(handoff),
    )
    port = free_port()
    key_file = folder / f"{name}.key"
    key_file.write_text(KEY)
    launch = engine_command(
        spec, spec.pools[0], host="127.0.0.1", port=port, key=KEY, key_file=str(key_file)
    )
    log = (folder / f"{name}.log").open("wb")
    proc = subprocess.Popen(list(launch.argv), stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(url: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", headers=HEADERS, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} not ready")


async def stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], sent: float
) -> tuple[str, float, float, int]:
    """(text, TTFT s, E2E s, tokens) of one streamed completion, timed from `sent`."""
    first = 0.0
    parts: list[str] = []
    tokens = 0
    async with client.stream("POST", url + "/v1/completions", json=body, headers=HEADERS) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    if not first:
                        first = time.monotonic() - sent
                    parts.append(choice["text"])
                    tokens += 1
    return "".join(parts), first, time.monotonic() - sent, tokens


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "mean": round(statistics.fmean(ordered), 2),
        "p50": round(ordered[len(ordered) // 2], 2),
        "p90": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 2),
    }


async def run(args: argparse.Namespace, urls: dict[str, str]) -> dict[str, Any]:
    rng = random.Random(args.seed)
    handoff = Handoff("llama.cpp")
    pre = Endpoint(job_id=1, pool="prefill", url=urls["prefill"], slots=2, generation=1)
    dec = Endpoint(job_id=2, pool="decode", url=urls["decode"], slots=2, generation=1)
    side: dict[str, dict[str, list[float]]] = {
        k: {"ttft": [], "tpot": []} for k in ("agg", "disagg")
    }
    transfer: list[float] = []
    share: list[float] = []
    identical = 0
    identical_cached = 0
    # A fresh connection per request, for both sides alike: llama-server (cpp-httplib) may
    # close a kept-alive connection after a streamed answer without saying so.
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=300, limits=no_reuse) as client:

        async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            r = await client.post(url + path, json=body, headers=HEADERS)
            return r.status_code, r.json()

        for i in range(args.requests):
            prompt = f"Request {i}. " + " ".join(rng.choices(WORDS, k=args.prompt_words))
            body = {
                "prompt": prompt,
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": True,
                "ignore_eos": True,
            }
            sent = time.monotonic()
            alone, ttft, e2e, n = await stream(client, urls["agg"], body, sent)
            side["agg"]["ttft"].append(1000 * ttft)
            side["agg"]["tpot"].append(1000 * (e2e - ttft) / max(1, n - 1))
            # The same request again: answered from the replica's prompt cache (the prompt's
            # last token evaluated alone, as on the decode replica after a hand-off).
            cached, *_ = await stream(client, urls["agg"], body, time.monotonic())
            sent = time.monotonic()
            prepared = await handoff.prefill(post, pre, dec, "/v1/completions", body)
            try:
                split, ttft, e2e, n = await stream(client, urls["decode"], prepared.body, sent)
            finally:
                await prepared.release()
            side["disagg"]["ttft"].append(1000 * ttft)
            side["disagg"]["tpot"].append(1000 * (e2e - ttft) / max(1, n - 1))
            transfer.append(prepared.timings.transfer_ms)
            share.append(prepared.timings.transfer_ms / (1000 * ttft))
            identical += split == alone
            identical_cached += split == cached
    agg_ttft, dis_ttft = summary(side["agg"]["ttft"]), summary(side["disagg"]["ttft"])
    agg_tpot = statistics.fmean(side["agg"]["tpot"])
    dis_tpot = statistics.fmean(side["disagg"]["tpot"])
    return {
        "aggregated": {"ttft_ms": agg_ttft, "tpot_ms_mean": round(agg_tpot, 2)},
        "disaggregated": {
            "ttft_ms": dis_ttft,
            "tpot_ms_mean": round(dis_tpot, 2),
            "handoff_save_restore_ms": summary(transfer),
            "handoff_share_of_ttft": round(statistics.fmean(share), 4),
        },
        "ratio_ttft_mean_disagg_over_agg": round(dis_ttft["mean"] / agg_ttft["mean"], 3),
        "ratio_tpot_mean_disagg_over_agg": round(dis_tpot / agg_tpot, 3),
        "identical_outputs_vs_fresh": f"{identical}/{args.requests}",
        "identical_outputs_vs_prompt_cached": f"{identical_cached}/{args.requests}",
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--prompt-words", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-handoff-") as tmp:
        folder = Path(tmp)
        handoff = folder / "handoff"
        handoff.mkdir()
        procs: list[subprocess.Popen[bytes]] = []
        urls: dict[str, str] = {}
        try:
            for name in ("prefill", "decode", "agg"):
                proc, urls[name] = start(folder, handoff, name)
                procs.append(proc)
            for url in urls.values():
                wait_ready(url)
            steal0, total0 = steal()
            try:
                result = asyncio.run(run(args, urls))
            except Exception:
                for name, proc in zip(urls, procs, strict=True):  # before their folder goes
                    tail = (folder / f"{name}.log").read_text(errors="replace")[-1500:]
                    state = "running" if proc.poll() is None else f"exited {proc.returncode}"
                    print(f"--- {name} engine ({state}) log ---\n{tail}", file=sys.stderr)
                raise
            steal1, total1 = steal()
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    result["config"] = {
        "requests": args.requests,
        "prompt_words": args.prompt_words,
        "max_tokens": args.max_tokens,
        "threads_per_replica": 1,
        "model": "SmolLM2-135M-Instruct Q4_1",
    }
    result["host"] = {
        "cpu_steal_pct": round(100 * (steal1 - steal0) / max(1, total1 - total0), 2),
        "loadavg": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
