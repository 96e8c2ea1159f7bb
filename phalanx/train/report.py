"""Progress reports: a line on stdout, and under Phalanx a small JSON POST to the head.

Under Phalanx (PHALANX_HEAD, PHALANX_JOB_ID and a token in PHALANX_STEP_TOKEN or
PHALANX_TOKEN all set) each node's local rank 0 POSTs

    {PHALANX_HEAD}/v1/jobs/{PHALANX_JOB_ID}/progress
    {"rank": int, "step": int, "loss": float|null, "tokens_per_s": float|null,
     "mfu": float|null, "time": unix seconds,
     "checkpoint_s": float, "checkpoint_step": int}   (the last two once a checkpoint was saved)

from a background thread, so a slow or absent head never slows or stops training: the
queue is short and full means the report is dropped, and the first failure is logged
once (later ones only counted). The head uses these as heartbeats (hang detection) and
for the dashboard.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from phalanx.tls import CA_PEM_ENV, TLSError, client_context

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)
PROGRESS_THREAD = "phalanx-progress"


class _NotFromProgressThread(logging.Filter):
    """httpx logs every request at INFO: a training script that sets logging to INFO would
    get one line per progress post in its stderr. Only the reporter's own requests are
    dropped; the script's own httpx calls still log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != PROGRESS_THREAD


_QUIET_PROGRESS = _NotFromProgressThread()


@dataclass(frozen=True)
class Progress:
    """One progress report (the JSON body, field for field)."""

    rank: int
    step: int
    loss: float | None
    tokens_per_s: float | None
    mfu: float | None
    time: float
    # The last checkpoint: how long its save held training (seconds) and its step; sent
    # only when set (the head observes each checkpoint once: phalanx_job_checkpoint_…).
    checkpoint_s: float | None = None
    checkpoint_step: int | None = None


def body(p: Progress) -> dict[str, Any]:
    """The JSON body of a report (the checkpoint fields only when set)."""
    out = asdict(p)
    for key in ("checkpoint_s", "checkpoint_step"):
        if out[key] is None:
            del out[key]
    return out


def progress_line(p: Progress, step_time_s: float | None, tflops: float | None) -> str:
    """The human line printed by rank 0."""
    parts = [f"step {p.step}"]
    if p.loss is not None:
        parts.append(f"loss {p.loss:.4f}")
    if step_time_s is not None:
        parts.append(f"step {step_time_s * 1e3:.1f} ms")
    if p.tokens_per_s is not None:
        parts.append(f"{p.tokens_per_s:,.0f} tok/s")
    if tflops is not None:
        parts.append(f"{tflops:.3g} TFLOP/s/dev")
    if p.mfu is not None:
        parts.append(f"MFU {p.mfu * 100:.1f}%")
    return " | ".join(parts)


class Reporter:
    """Prints progress (rank 0) and posts it to the Phalanx head when configured."""

    def __init__(
        self,
        rank: int,
        local_rank: int,
        environ: Mapping[str, str] | None = None,
        printer: Callable[[str], None] | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        env = os.environ if environ is None else environ
        self.rank = rank
        self.printer = printer or (lambda line: print(line, file=sys.stdout, flush=True))
        self.failures = 0
        self.sent = 0
        # PHALANX_HEAD may list a leader and its standbys, comma-separated.
        heads = [h.strip().rstrip("/") for h in env.get("PHALANX_HEAD", "").split(",")]
        job = env.get("PHALANX_JOB_ID", "")
        token = env.get("PHALANX_STEP_TOKEN") or env.get("PHALANX_TOKEN") or ""
        self.urls = [f"{h}/v1/jobs/{job}/progress" for h in heads if h]
        self.url: str | None = None
        if self.urls and job and token and local_rank == 0:
            self.url = self.urls[0]
        self._token = token
        self._timeout = timeout_s
        self._ca = env.get(CA_PEM_ENV) or None  # the CA the head's TLS is pinned to
        self._queue: queue.Queue[Progress | None] = queue.Queue(maxsize=4)
        self._thread: threading.Thread | None = None
        if self.url is not None:
            self._thread = threading.Thread(target=self._run, name=PROGRESS_THREAD, daemon=True)
            self._thread.start()

    def report(
        self, p: Progress, step_time_s: float | None = None, tflops: float | None = None
    ) -> None:
        """Print (rank 0) and queue the POST (never blocks; drops when the queue is full)."""
        if self.rank == 0:
            self.printer(progress_line(p, step_time_s, tflops))
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(p)

    def _run(self) -> None:
        import httpx  # here, not at import: it costs every training process ~0.3 s

        logging.getLogger("httpx").addFilter(_QUIET_PROGRESS)  # once: same filter object
        assert self.url is not None
        from phalanx.api import version

        headers = {
            "Authorization": f"Bearer {self._token}",
            "Content-Type": "application/json",
            **version.headers(),
        }
        try:
            verify = client_context(self._ca)
        except TLSError as exc:
            self.printer(f"phalanx: progress not reported to the head: {exc}")
            return
        with httpx.Client(timeout=self._timeout, verify=verify) as client:
            while (item := self._queue.get()) is not None:
                self._post(client, headers, body(item))

    def _post(self, client: httpx.Client, headers: dict[str, str], body: dict[str, Any]) -> None:
        import httpx

        assert self.url is not None
        try:
            for attempt in range(len(self.urls)):
                try:
                    resp = client.post(self.url, content=json.dumps(body), headers=headers)
                except httpx.TransportError:
                    if attempt == len(self.urls) - 1:
                        raise
                    resp = None
                if resp is not None and resp.status_code != 503:
                    break
                # Unreachable, or a standby head: the next one may be the leader now.
                self.url = self.urls[(self.urls.index(self.url) + 1) % len(self.urls)]
            assert resp is not None
            resp.raise_for_status()
            self.sent += 1
        except httpx.HTTPError as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning(
                    "progress report to %s failed (%s); training continues, further "
                    "failures are not logged",
                    self.url,
                    exc,
                )

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (up to timeout_s) and stop the thread."""
        if self._thread is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout_s)
        self._thread = None
