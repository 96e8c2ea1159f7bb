"""`python -m phalanx.serve.replica`: one replica of a deployment, inside its job.

Runs as the job's user. It asks the head what to start (`GET /v1/serve/replicas/self`
with the job's step token), picks a free port on its node's address, starts the engine
(phalanx.serve.engines) as its child, reports `{url, ready: false}`, waits for the
engine's health endpoint, then reports `{url, ready: true}` and keeps watching it:

- the engine unhealthy → reported not ready (and ready again once it answers);
- the engine exits → reported not ready, and the wrapper exits non-zero (the job fails,
  the head's controller replaces the replica);
- SIGTERM (cancel, scale down, rolling update, preemption notice) → reported not ready,
  in-flight requests drained (briefly: the router has seen the news), SIGTERM forwarded
  to the engine, and the wrapper exits with the engine's status.

The engine's API key reaches the engine in a 0600 file in a private folder (or its
environment), never on a command line; the job's step token is not passed to it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

import httpx

from phalanx.api.serving import ReplicaConfig, ReplicaReport
from phalanx.serve import engines
from phalanx.serve.handoff import FILE_TTL_S, sweep
from phalanx.tls import CA_FILE_ENV, CA_PEM_ENV, client_context

log = logging.getLogger("phalanx.serve.replica")

POLL_S = 0.2  # health polls while the engine starts
WATCH_S = 1.0  # health polls once it is ready
UNHEALTHY_AFTER = 3  # failed polls in a row before a ready engine is reported not ready
DRAIN_MIN_S = 1.5  # after reporting not ready, the router's refresh (~1 s) sees it
DRAIN_MAX_S = 3.5  # … and in-flight requests get this long (the agent's kill grace is 5 s)
STOP_S = 10.0  # the engine's own shutdown, then SIGKILL
SWEEP_S = 10.0  # how often a llama.cpp prefill/decode replica sweeps stale hand-off files
HEAD_TIMEOUT_S = 5.0
STARTUP_S = 1800.0  # an engine not healthy after this long (vLLM loads in minutes) fails
# Engine variables the wrapper must not pass on: the job's own credential.
_PRIVATE_ENV = ("PHALANX_STEP_TOKEN",)


class ReplicaError(Exception):
    """The replica cannot start (the head refused it, no port): exit 2 with the message."""


class HeadLink:
    """The wrapper's calls to the head, with the job's step token."""

    def __init__(self, urls: list[str], token: str, job_id: int, ca: str | None) -> None:
        self.urls = urls
        self.job_id = job_id
        self._http = httpx.Client(
            headers={"Authorization": f"Bearer {token}"},
            timeout=HEAD_TIMEOUT_S,
            verify=client_context(ca),
        )

    def config(self, deadline_s: float = 60.0) -> ReplicaConfig:
        """What to start; retried while the head is away (a restart)."""
        end = time.monotonic() + deadline_s
        while True:
            for url in self.urls:
                try:
                    r = self._http.get(
                        f"{url}/v1/serve/replicas/self", params={"job_id": self.job_id}
                    )
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    return ReplicaConfig.model_validate_json(r.content)
                if r.status_code != 503:
                    raise ReplicaError(f"the head refused this replica: {r.status_code} {r.text}")
            if time.monotonic() > end:
                raise ReplicaError(f"no head answered at {', '.join(self.urls)}")
            time.sleep(1.0)

    def report(self, url: str, ready: bool) -> bool:
        """Tell the head; False if no head took it (the caller tries again later)."""
        body = ReplicaReport(url=url, ready=ready, job_id=self.job_id).model_dump(mode="json")
        for head in self.urls:
            try:
                r = self._http.post(f"{head}/v1/serve/replicas/self", json=body)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                return True
            if r.status_code in (401, 404):
                return True  # no longer a running replica (being stopped): nothing to tell
            log.warning("the head answered %d to a report: %s", r.status_code, r.text[:300])
        return False

    def close(self) -> None:
        self._http.close()


def free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never orphaned


class Replica:
    def __init__(self, link: HeadLink, config: ReplicaConfig, host: str) -> None:
        self.link = link
        self.config = config
        self.host = host
        self.pool = next(p for p in config.spec.pools if p.role == config.pool)
        self.port = free_port(host)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}"
        self.private = Path(tempfile.mkdtemp(prefix="phalanx-replica-"))  # 0700
        self.key_file = self.private / "engine.key"
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(config.engine_key + "\n")
        self.engine: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self._told: bool | None = None  # the readiness the head last took
        self._want = False
        self._http = httpx.Client(
            timeout=2.0, headers={"Authorization": f"Bearer {config.engine_key}"}
        )
        spec = config.spec
        disaggregated = spec.engine == "llama.cpp" and self.pool.role != "aggregated"
        self.handoff_dir = spec.handoff_dir if disaggregated else None
        self._swept = 0.0

    # ------------------------------------------------------------------ engine
    def start_engine(self) -> None:
        side = free_port(self.host) if self.config.spec.engine == "vllm" else None
        launch = engines.engine_command(
            self.config.spec,
            self.pool,
            host=self.host,
            port=self.port,
            key=self.config.engine_key,
            key_file=str(self.key_file),
            side_channel_port=side,
        )
        env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
        env.update(launch.env)
        log.info("starting the engine on %s: %s", self.url, launch.argv[0])
        self.engine = subprocess.Popen(
            list(launch.argv),
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # signals reach it through the wrapper only
            preexec_fn=_die_with_parent,
        )

    def healthy(self) -> bool:
        for path in engines.health_paths(self.config.spec.engine):
            try:
                if self._http.get(self.url + path).status_code == 200:
                    return True
            except httpx.HTTPError:
                continue
        return False

    def busy(self) -> bool:
        """Whether the engine is still answering requests (llama.cpp: a slot processing;
        vLLM: requests running); unknown engines are taken as idle."""
        try:
            if self.config.spec.engine == "llama.cpp":
                slots = self._http.get(self.url + "/slots").json()
                return any(s.get("is_processing") for s in slots if isinstance(s, dict))
            if self.config.spec.engine == "vllm":
                text = self._http.get(self.url + "/metrics").text
                for line in text.splitlines():
                    if line.startswith("vllm:num_requests_running"):
                        return float(line.rsplit(" ", 1)[-1]) > 0
        except (httpx.HTTPError, ValueError):
            return False
        return False

    def sweep_handoff(self) -> None:
        """Remove the slot files hand-offs left behind (phalanx.serve.handoff): every
        replica sharing the folder sweeps it, which is harmless."""
        if self.handoff_dir is None or time.monotonic() - self._swept < SWEEP_S:
            return
        self._swept = time.monotonic()
        removed = sweep(self.handoff_dir, FILE_TTL_S)
        if removed:
            log.info("removed %d stale hand-off files from %s", removed, self.handoff_dir)

    # ------------------------------------------------------------------ reports
    def tell(self, ready: bool) -> None:
        """Report `ready` (again, until a head takes it)."""
        self._want = ready
        if self._told is ready:
            return
        if self.link.report(self.url, ready):
            self._told = ready

    def retry_report(self) -> None:
        if self._told is not self._want:
            self.tell(self._want)

    # ------------------------------------------------------------------ life
    def run(self) -> int:
        self.start_engine()
        assert self.engine is not None
        self.tell(False)
        began = time.monotonic()
        while not self.stopping:  # 1. until the engine answers
            if self.engine.poll() is not None:
                return self.engine_died()
            if self.healthy():
                break
            if time.monotonic() - began > STARTUP_S:
                log.error("the engine did not answer its health check in %.0f s", STARTUP_S)
                self.stop()
                return 1  # a failure: the controller replaces the replica (with backoff)
            self.retry_report()
            time.sleep(POLL_S)
        if not self.stopping:
            log.info("the engine is ready at %s", self.url)
            self.tell(True)
        misses = 0
        while not self.stopping:  # 2. watch it
            time.sleep(WATCH_S)
            if self.engine.poll() is not None:
                return self.engine_died()
            if self.healthy():
                misses = 0
                self.tell(True)
            else:
                misses += 1
                if misses >= UNHEALTHY_AFTER:
                    self.tell(False)
            self.retry_report()
            self.sweep_handoff()
        return self.stop()

    def engine_died(self) -> int:
        assert self.engine is not None
        code = self.engine.returncode
        log.error("the engine exited (status %s); this replica fails", code)
        self.tell(False)
        return code if code and code > 0 else 1

    def stop(self) -> int:
        """Not ready → drain → SIGTERM to the engine → its status."""
        assert self.engine is not None
        self.tell(False)
        began = time.monotonic()
        while time.monotonic() - began < DRAIN_MAX_S and self.engine.poll() is None:
            if time.monotonic() - began >= DRAIN_MIN_S and not self.busy():
                break
            time.sleep(0.1)
        if self.engine.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.engine.pid, signal.SIGTERM)
            try:
                self.engine.wait(STOP_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.engine.pid, signal.SIGKILL)
                self.engine.wait()
        code = self.engine.returncode
        return 128 - code if code < 0 else code

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        self.stopping = True

    def cleanup(self) -> None:
        if self.engine is not None and self.engine.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.engine.pid, signal.SIGKILL)
            self.engine.wait()
        self._http.close()
        shutil.rmtree(self.private, ignore_errors=True)


def node_address(env: dict[str, str]) -> str:
    """The address of the node the job runs on: the agent gives the first node's address
    as MASTER_ADDR, and a replica is a one-node job."""
    return env.get("PHALANX_NODE_ADDRESS") or env.get("MASTER_ADDR") or "127.0.0.1"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s replica %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    parser = argparse.ArgumentParser(prog="python -m phalanx.serve.replica")
    # Shown in the process table and the job's command; the head's answer is what counts.
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--generation", type=int, required=True)
    parser.parse_args(argv)
    env = dict(os.environ)
    missing = [
        v for v in ("PHALANX_HEAD", "PHALANX_STEP_TOKEN", "PHALANX_JOB_ID") if not env.get(v)
    ]
    if missing:
        print(f"error: not inside a Phalanx job ({', '.join(missing)} unset)", file=sys.stderr)
        return 2
    ca = env.get(CA_PEM_ENV) or env.get(CA_FILE_ENV)
    heads = [u.strip().rstrip("/") for u in env["PHALANX_HEAD"].split(",") if u.strip()]
    link = HeadLink(heads, env["PHALANX_STEP_TOKEN"], int(env["PHALANX_JOB_ID"]), ca)
    replica: Replica | None = None
    stop_early = False

    def early(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stop_early
        stop_early = True

    signal.signal(signal.SIGTERM, early)
    signal.signal(signal.SIGINT, early)
    try:
        config = link.config()
        if stop_early:
            return 143
        replica = Replica(link, config, node_address(env))
        signal.signal(signal.SIGTERM, replica.on_signal)
        signal.signal(signal.SIGINT, replica.on_signal)
        replica.stopping = stop_early  # a signal before the handler moved: stop at once
        return replica.run()
    except (ReplicaError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if replica is not None:
            replica.cleanup()
        link.close()


if __name__ == "__main__":
    sys.exit(main())
