"""srun's runtime: launch a step on the job's agents, stream its output, collect exits."""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import ssl
import sys
import time
from types import FrameType
from typing import TextIO
from urllib.parse import urlencode, urlsplit

from phalanx.api import version
from phalanx.api.models import LogChunk, StepLaunch, StepStatus
from phalanx.tls import CA_PEM_ENV

from .stepfiles import TaskFiles
from .stepplan import JobContext, NodeTasks, SrunError

_MAX_STEP_TRIES = 50
_POLL_MIN_S, _POLL_MAX_S = 0.05, 0.5
_AGENT_AWAY_S = 30.0  # an agent unreachable this long (not restarting: gone) fails the step
_STREAMS = ("stdout", "stderr")
_DRAIN_S = 2.0  # reading the tasks' last output when srun is stopped


class Response:
    """Status and body of one answer."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status_code = status
        self.content = body


class Http:
    """Minimal keep-alive HTTP client (stdlib: srun starts fast inside job scripts). Agents
    serving TLS are checked against `ca_pem` (PHALANX_CA_PEM: the cluster's CA)."""

    def __init__(self, token: str, ca_pem: str | None = None) -> None:
        self.headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            **version.headers(),
        }
        self.conns: dict[str, http.client.HTTPConnection] = {}
        self._ca_pem = ca_pem
        self._tls: ssl.SSLContext | None = None

    def request(
        self,
        method: str,
        url: str,
        *,
        body: object = None,
        params: dict[str, str | int] | None = None,
    ) -> Response:
        """Send one request with a JSON `body`; raises OSError/HTTPException if unreachable."""
        parts = urlsplit(url)
        target = parts.path + (f"?{urlencode(params)}" if params else "")
        data = json.dumps(body).encode() if body is not None else None
        # A kept-alive connection the server closed: reconnect once, but never resend a
        # POST (the agent may have started the step already).
        for attempt in (1, 2) if method != "POST" else (2,):
            conn = self.conns.get(parts.netloc)
            if conn is None:
                conn = self._connect(parts.scheme, parts.netloc)
                self.conns[parts.netloc] = conn
            try:
                conn.request(method, target, body=data, headers=self.headers)
                resp = conn.getresponse()
                return Response(resp.status, resp.read())
            except (OSError, http.client.HTTPException):
                conn.close()
                del self.conns[parts.netloc]
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _connect(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        if scheme != "https":
            return http.client.HTTPConnection(netloc, timeout=30)
        if self._tls is None:
            if not self._ca_pem:
                raise OSError(f"{netloc} serves TLS and {CA_PEM_ENV} is not set")
            self._tls = ssl.create_default_context(cadata=self._ca_pem)
        return http.client.HTTPSConnection(netloc, timeout=30, context=self._tls)

    def close(self) -> None:
        """Close every connection."""
        for conn in self.conns.values():
            conn.close()


class StepRun:
    """One launched step: its agents, its tasks' output offsets, their exits."""

    def __init__(
        self,
        client: Http,
        job: JobContext,
        plan: list[NodeTasks],
        cwd: str,
        label: bool,
        files: TaskFiles | None = None,
    ) -> None:
        self.client = client
        self.files = files  # -o/-e: tasks' streams to files instead of srun's own
        self.job = job
        self.plan = plan
        self.cwd = cwd
        self.label = label
        self.step_id = -1
        self.launched: list[NodeTasks] = []
        self.nodes = {n.node: n for n in plan}
        self.stop_signal: int | None = None

    def launch(self) -> None:
        """POST the step to every involved agent, retrying with the next id if taken."""
        for _ in range(_MAX_STEP_TRIES):
            self.step_id = _next_step_id(self.job.job_dir)
            taken = False
            for node in self.plan:
                req = StepLaunch(
                    job_id=self.job.job_id, step_id=self.step_id, workdir=self.cwd, tasks=node.tasks
                )
                r = self._request("POST", node, "/v1/steps", body=req.model_dump(mode="json"))
                if r.status_code == 409:
                    taken = True
                    break
                _check(r, node)
                self.launched.append(node)
            if not taken:
                return
            self.kill()
            self.launched = []
        raise SrunError(f"could not find a free step id after {_MAX_STEP_TRIES} tries")

    def kill(self) -> None:
        """DELETE the step on every agent it was launched on (best effort)."""
        for node in self.launched:
            try:
                self._request("DELETE", node, f"/v1/steps/{self.job.job_id}/{self.step_id}")
            except SrunError as e:
                print(f"srun: warning: {e}", file=sys.stderr)

    def follow(self, *, kill_on_bad_exit: bool) -> int:
        """Stream every task's output until all ended; return the step's exit code."""
        offsets = {(n.node, t.task_id, s): 0 for n in self.plan for t in n.tasks for s in _STREAMS}
        partial = dict.fromkeys(offsets, "")
        open_streams = set(offsets)
        codes: dict[int, int] = {}
        killed = False
        delay = _POLL_MIN_S
        while open_streams:
            if self.stop_signal is not None:
                print("srun: interrupted; cancelling the step", file=sys.stderr)
                # What the tasks wrote since the last poll first (a requeued job's last
                # lines: submitit logs its checkpoint and requeue just before it exits).
                self._drain(open_streams, offsets, partial)
                self.kill()
                return 128 + self.stop_signal
            got = False
            for key in sorted(open_streams):
                chunk = self._log(self.nodes[key[0]], key[1], key[2], offsets[key])
                offsets[key] = chunk.next_offset
                if chunk.data:
                    got = True
                    partial[key] = self._emit(key, partial[key] + chunk.data)
                if chunk.eof:
                    open_streams.discard(key)
                    if partial[key]:
                        self._emit(key, partial[key] + "\n")
            codes.update(self._exit_codes())
            if kill_on_bad_exit and not killed and any(c != 0 for c in codes.values()):
                print("srun: a task failed; killing the step (--kill-on-bad-exit)", file=sys.stderr)
                self.kill()
                killed = True
            delay = _POLL_MIN_S if got else min(delay * 2, _POLL_MAX_S)
            if not got and open_streams:
                time.sleep(delay)
        return max(codes.values(), default=0)

    def _drain(
        self,
        streams: set[tuple[str, int, str]],
        offsets: dict[tuple[str, int, str], int],
        partial: dict[tuple[str, int, str], str],
    ) -> None:
        """Emit the output the tasks have written and srun has not read yet, within
        _DRAIN_S (best effort: srun is being stopped)."""
        deadline = time.monotonic() + _DRAIN_S
        try:
            for key in sorted(streams):
                while time.monotonic() < deadline:
                    chunk = self._log(self.nodes[key[0]], key[1], key[2], offsets[key])
                    offsets[key] = chunk.next_offset
                    if chunk.data:
                        partial[key] = self._emit(key, partial[key] + chunk.data)
                    if chunk.eof or not chunk.data:
                        break
                if partial[key]:
                    partial[key] = self._emit(key, partial[key] + "\n")
        except SrunError as e:
            print(f"srun: warning: output not read to the end: {e}", file=sys.stderr)

    def _exit_codes(self) -> dict[int, int]:
        """Shell-style codes of the tasks that ended (128 + signal when killed)."""
        codes = {}
        for node in self.plan:
            for t in self._status(node).tasks:
                if not t.running:
                    code = 128 + t.signal if t.signal is not None else t.exit_code
                    codes[t.task_id] = code if code is not None else 1
        return codes

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT/SIGTERM: remember it; the follow loop cancels the step."""
        self.stop_signal = signum

    def _emit(self, key: tuple[str, int, str], text: str) -> str:
        """Write complete lines (labelled with `-l`), so tasks' lines never interleave
        mid-line; return the unfinished rest."""
        own: TextIO = sys.stdout if key[2] == "stdout" else sys.stderr
        out = (self.files.target(key[2], key[1], key[0]) if self.files else None) or own
        *lines, rest = text.split("\n")
        prefix = f"{key[1]}: " if self.label else ""
        if lines:
            out.write("".join(f"{prefix}{line}\n" for line in lines))
            out.flush()
        return rest

    def _log(self, node: NodeTasks, task: int, stream: str, offset: int) -> LogChunk:
        path = f"/v1/steps/{self.job.job_id}/{self.step_id}/logs"
        r = self._request(
            "GET", node, path, params={"task": task, "stream": stream, "offset": offset}
        )
        _check(r, node)
        return LogChunk.model_validate_json(r.content)

    def _status(self, node: NodeTasks) -> StepStatus:
        r = self._request("GET", node, f"/v1/steps/{self.job.job_id}/{self.step_id}")
        _check(r, node)
        return StepStatus.model_validate_json(r.content)

    def _request(
        self,
        method: str,
        node: NodeTasks,
        path: str,
        *,
        body: object = None,
        params: dict[str, str | int] | None = None,
    ) -> Response:
        deadline = time.monotonic() + _AGENT_AWAY_S
        delay = _POLL_MIN_S
        while True:
            try:
                return self.client.request(method, node.agent_url + path, body=body, params=params)
            except (OSError, http.client.HTTPException) as e:
                # An agent restarting (an upgrade) is away for seconds, then serves again on
                # the same port with this job's steps adopted: wait for it. A POST is sent
                # again only if refused (it never reached the agent: no step started).
                away = isinstance(e, ConnectionRefusedError) or (
                    method != "POST" and isinstance(e, ConnectionError)
                )
                if not away or time.monotonic() > deadline:
                    raise SrunError(
                        f"cannot reach the agent of node {node.node} ({node.agent_url}): {e}"
                    ) from e
                time.sleep(delay)
                delay = min(delay * 2, _POLL_MAX_S)


def _check(r: Response, node: NodeTasks) -> None:
    if r.status_code < 400:
        return
    text = r.content.decode(errors="replace")
    try:
        detail = json.loads(text).get("detail", text)
    except (ValueError, AttributeError):
        detail = text
    raise SrunError(f"agent of node {node.node} answered {r.status_code}: {detail}")


def _next_step_id(job_dir: str | None) -> int:
    """The next step id of this job: a counter file in the job's directory on this node
    (locked, so concurrent sruns get distinct ids); 0 without one."""
    if not job_dir or not os.path.isdir(job_dir):
        return 0
    with open(os.path.join(job_dir, "step-counter"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        step = int(text) if text.isdigit() else 0
        f.seek(0)
        f.truncate()
        f.write(str(step + 1))
    return step
