"""Shared parts of the serving benchmarks (bench/serve_routing.py, bench/serve_disagg.py):
real llama-server replicas of SmolLM2-135M started with phalanx.serve.engines' command
line, `phalanx serve router` as its own process in front of them (`--no-auth`: no head),
trace sampling that keeps the prefix structure, the router's Prometheus counters, and the
host's CPU steal and load average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from phalanx.api.serving import DeploymentSpec, PoolSpec
from phalanx.serve.bench import BenchRequest, WorkloadSpec, build
from phalanx.serve.bench import traces as bench_traces
from phalanx.serve.engines import engine_command
from phalanx.testing import engines

KEY = "bench-engine-key"
MODEL = "smol"
HEADERS = {"Authorization": f"Bearer {KEY}"}


# ------------------------------------------------------------------------------ the host
def cpu_times() -> tuple[int, int]:
    """(steal jiffies, all jiffies) from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n")[0].split()
    return int(fields[8]), sum(int(x) for x in fields[1:9])


def host(before: tuple[int, int]) -> dict[str, object]:
    steal1, total1 = cpu_times()
    return {
        "cpus": os.cpu_count(),
        "cpu_steal_pct": round(100 * (steal1 - before[0]) / max(1, total1 - before[1]), 2),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ----------------------------------------------------------------------------- processes
@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    def tail(self) -> str:
        state = "running" if self.popen.poll() is None else f"exited {self.popen.returncode}"
        text = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
        return f"--- {self.name} ({state}) ---\n{text}"


def start_replica(
    folder: Path,
    name: str,
    *,
    slots: int,
    ctx: int,
    role: str = "aggregated",
    handoff: Path | None = None,
) -> Proc:
    """One llama-server replica, one thread, the production command line."""
    spec = DeploymentSpec(
        name="bench",
        engine="llama.cpp",
        model=str(engines.smollm2()),
        engine_path=str(engines.llama_server()),
        served_model_name=MODEL,
        pools=(
            [PoolSpec(role="aggregated", slots=slots, args=["-t", "1", "-c", str(ctx)])]
            if role == "aggregated"
            else [
                PoolSpec(role=r, slots=slots, args=["-t", "1", "-c", str(ctx)])
                for r in ("prefill", "decode")
            ]
        ),
        handoff_dir=str(handoff) if handoff else None,
    )
    pool = next(p for p in spec.pools if p.role == role)
    port = free_port()
    key_file = folder / f"{name}.key"
    key_file.write_text(KEY)
    key_file.chmod(0o600)
    launch = engine_command(
        spec, pool, host="127.0.0.1", port=port, key=KEY, key_file=str(key_file)
    )
    log = folder / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(list(launch.argv), stdout=out, stderr=subprocess.STDOUT)
    return Proc(name, popen, f"http://127.0.0.1:{port}", log)


def start_router(
    folder: Path,
    name: str,
    policy: str,
    *,
    replicas: Sequence[str] = (),
    prefill: Sequence[str] = (),
    decode: Sequence[str] = (),
    slots: int,
) -> Proc:
    """`phalanx serve router --no-auth` (no head) in front of fixed replicas."""
    port = free_port()
    key_file = folder / "engine.key"
    key_file.write_text(KEY)
    key_file.chmod(0o600)
    argv = [sys.executable, "-m", "phalanx.cli.main", "serve", "router"]
    argv += ["--listen", f"127.0.0.1:{port}", "--no-auth", "--policy", policy]
    argv += ["--engine-key-file", str(key_file), "--served-model-name", MODEL]
    argv += ["--engine", "llama.cpp", "--slots", str(slots)]
    for url in replicas:
        argv += ["--replica", url]
    for url in prefill:
        argv += ["--prefill", url]
    for url in decode:
        argv += ["--decode", url]
    log = folder / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    return Proc(name, popen, f"http://127.0.0.1:{port}", log)


def wait_ready(proc: Proc, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise SystemExit(f"{proc.name} exited\n{proc.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(proc.url + "/health", headers=HEADERS, timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"{proc.name} not ready in {timeout_s:.0f} s\n{proc.tail()}")


def warm_up(url: str, count: int = 1) -> None:
    """Short requests of their own words (nothing the benchmark's prompts share)."""
    for i in range(count):
        body = {
            "model": MODEL,
            "prompt": f"warm up {i} the quiet harbor",
            "max_tokens": 2,
            "temperature": 0,
        }
        r = httpx.post(url + "/v1/completions", json=body, headers=HEADERS, timeout=120)
        if r.status_code != 200:
            raise SystemExit(f"warm-up on {url}: {r.status_code} {r.text[:300]}")


@contextlib.contextmanager
def running(procs: list[Proc]) -> Iterator[list[Proc]]:
    """Kills every process started into `procs` on the way out; shows their logs on error."""
    try:
        yield procs
    except BaseException:
        for proc in procs:
            print(proc.tail(), file=sys.stderr)
        raise
    finally:
        for proc in procs:
            proc.popen.kill()
            proc.popen.wait()


# ------------------------------------------------------------------------------- metrics
def prometheus(url: str) -> dict[str, float]:
    """`name{labels}` → value of a /metrics page (sums nothing; comments dropped)."""
    text = httpx.get(url + "/metrics", headers=HEADERS, timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value)
    return out


def metric_sum(metrics: dict[str, float], name: str) -> float:
    """The sum of a metric over its label sets (`name` or `name{...}`)."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return metric_sum(after, name) - metric_sum(before, name)


# -------------------------------------------------------------------------------- traces
def session_key(hash_ids: Sequence[int]) -> int:
    """A Mooncake conversation: its requests share the first two blocks (block 0 is the
    system prompt every request starts with; the second is the conversation's own)."""
    return zlib.crc32(repr(tuple(hash_ids[:2])).encode())


def sampled_trace(
    name: str,
    *,
    every: int,
    scale: float,
    compress: float,
    max_input: int,
    num: int | None,
    offset: int = 0,
) -> list[BenchRequest]:
    """The trace scaled down: 1 conversation in `every` (Mooncake: all of a sampled
    conversation's turns, so the prefix sharing between turns is kept; Azure, which has no
    conversations: 1 request in `every`), the token lengths × `scale` (Mooncake blocks of
    512 × scale words, the bench client's mooncake workload), the arrival times ÷
    `compress`, then the first `num` requests from `offset` (times shifted to start at 0)."""
    rows = bench_traces.load(name)
    spec = WorkloadSpec(
        name=name,  # type: ignore[arg-type]  # "mooncake" | "azure-conv" | "azure-code"
        num=len(rows),
        scale=scale,
        trace_time=True,
        time_scale=1.0 / compress,
        max_input=max_input,
    )
    everything = build(spec)
    if name == "mooncake":
        chosen = [
            req
            for row, req in zip(rows, everything, strict=True)
            if session_key(row.hash_ids) % every == 0
        ]
    else:
        chosen = everything[::every]
    chosen = chosen[offset:]
    if num is not None:
        chosen = chosen[:num]
    if not chosen:
        raise SystemExit("the sample is empty")
    t0 = chosen[0].arrival_s
    return [replace(req, arrival_s=req.arrival_s - t0) for req in chosen]


def scale_down(
    requests: Sequence[BenchRequest], args: argparse.Namespace, unit: str
) -> dict[str, object]:
    """How a trace was scaled down for a run (the JSON's `scale_down`): one `unit` (requests,
    conversations) in `--every`, lengths × `--scale`, times ÷ `--compress`, and what that gave."""
    span = max(r.arrival_s for r in requests)
    return {
        f"{unit}_sampled_one_in": args.every,
        "token_length_scale": args.scale,
        "time_compress": args.compress,
        "arrival_rate_vs_trace": round(args.compress / args.every, 4),
        "max_input_tokens": args.max_input,
        "offset": args.offset,
        "requests": len(requests),
        "offered_rate_rps": round((len(requests) - 1) / span, 3) if span else None,
        "mean_prompt_words": round(sum(r.prompt_len for r in requests) / len(requests), 1),
        "mean_max_tokens": round(sum(r.max_tokens for r in requests) / len(requests), 1),
    }
