"""Serving deployments on a local cluster: how fast replicas get ready and are replaced,
and what the router's `GET …/endpoints` costs against a plain authenticated GET.

    .venv/bin/python bench/serve_deploy.py [--replicas 2] [--requests 500]

Prints one JSON object: seconds from `apply` to every replica ready (real llama-server
replicas of SmolLM2-135M on fake GPUs), from a SIGKILLed engine to the pool ready again,
and the latency of `GET /v1/serve/deployments/{name}/endpoints` beside the baseline
`GET /v1/whoami` (same client, TLS and token; interleaved), with their ratio; the host's
CPU steal and load average over the run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

from phalanx.api.serving import DeploymentSpec, Endpoints, PoolSpec
from phalanx.client.serving import ServeClient
from phalanx.local import LocalCluster
from phalanx.testing import engines

T = TypeVar("T")


def steal() -> tuple[int, int]:
    fields = Path("/proc/stat").read_text().split("\n")[0].split()
    return int(fields[8]), sum(int(x) for x in fields[1:9])


def wait_for(probe: Callable[[], T | None], timeout: float = 120.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.02)
    raise SystemExit("timed out")


def engine_pid(url: str) -> int:
    port = url.rsplit(":", 1)[1].encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"llama-server") and port in argv:
                return int(entry.name)
    raise SystemExit(f"no engine at {url}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    s0 = steal()
    spec = DeploymentSpec(
        name="bench",
        engine="llama.cpp",
        model=str(engines.smollm2()),
        engine_path=str(engines.llama_server()),
        pools=[PoolSpec(replicas=args.replicas, slots=2, args=["-t", "1", "-c", "1024"])],
    )
    with (
        tempfile.TemporaryDirectory() as state,
        LocalCluster(Path(state), nodes=2) as cluster,
        cluster.client() as api,
    ):
        serve = ServeClient(api)

        def all_ready() -> Endpoints | None:
            ep = serve.endpoints("bench")
            return ep if len(ep.endpoints) == args.replicas else None

        began = time.monotonic()
        serve.apply(spec)
        ep = wait_for(all_ready)
        ready_s = time.monotonic() - began
        victim = ep.endpoints[0]
        began = time.monotonic()
        os.kill(engine_pid(victim.url), signal.SIGKILL)
        wait_for(
            lambda: (e := all_ready()) and victim.job_id not in {x.job_id for x in e.endpoints}
        )
        replaced_s = time.monotonic() - began
        print("measuring GETs", file=sys.stderr)
        verify = ssl.create_default_context(cafile=str(cluster.ca_file))
        headers = {"Authorization": f"Bearer {cluster.admin_token}"}
        base = cluster.head_url()
        times: dict[str, list[float]] = {"endpoints": [], "whoami": []}
        paths = {"endpoints": "/v1/serve/deployments/bench/endpoints", "whoami": "/v1/whoami"}
        with httpx.Client(base_url=base, headers=headers, verify=verify) as http:
            for _ in range(20):  # warm the connection and the head's caches
                http.get(paths["endpoints"]).raise_for_status()
            for _ in range(args.requests):
                for key, path in paths.items():
                    t = time.perf_counter()
                    http.get(path).raise_for_status()
                    times[key].append(1000 * (time.perf_counter() - t))
        serve.delete("bench")
    s1 = steal()
    p50 = {k: round(statistics.median(v), 3) for k, v in times.items()}
    print(
        json.dumps(
            {
                "replicas": args.replicas,
                "apply_to_all_ready_s": round(ready_s, 2),
                "engine_killed_to_ready_again_s": round(replaced_s, 2),
                "endpoints_get_ms": {"p50": p50["endpoints"], "p99": pct(times["endpoints"], 0.99)},
                "baseline_whoami_get_ms": {"p50": p50["whoami"], "p99": pct(times["whoami"], 0.99)},
                "endpoints_vs_baseline_p50_ratio": round(p50["endpoints"] / p50["whoami"], 2),
                "requests_each": args.requests,
                "host_steal_pct": round(100 * (s1[0] - s0[0]) / max(1, s1[1] - s0[1]), 1),
                "load_average": os.getloadavg(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
