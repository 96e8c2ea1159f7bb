"""The agent's own `/metrics`: this node's GPUs, read now, labelled with node, gpu, uuid
and the job, user and team holding each (phalanx.api.gpumetrics), and the loop that keeps
dcgm-exporter's job-mapping files (jobmap.py) in step with the jobs running here.

Who may scrape: the head (the agent secret) and whoever holds the scrape token in the file
`phalanx agent --metrics-token-file` names (e.g. a head-issued `phalanx token create
--scope metrics` token, the same one Prometheus sends the head). The per-GPU series name
every job's user and team, so a job's own step token is refused.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Header, HTTPException, Response

from phalanx.api.asgi import bearer_token
from phalanx.api.gpumetrics import CONTENT_TYPE, GpuRow, render
from phalanx.api.models import GpuInfo

from .gpus import GpuProvider
from .jobmap import JobMapWriter
from .reconcile import Reconciler

log = logging.getLogger("phalanx.agent")
METRICS_PATH = "/metrics"
MAP_INTERVAL_S = 1.0  # the job-mapping files are checked at least this often


class MetricsTokenError(ValueError):
    """The scrape token file is unreadable or empty."""


def read_token(path: Path) -> str:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise MetricsTokenError(f"cannot read the metrics token file {path}: {e}") from None
    if len(value) < 16:
        raise MetricsTokenError(f"the metrics token file {path} holds no token (16+ characters)")
    return value


def gpu_rows(
    node: str, inventory: list[GpuInfo], gpus: GpuProvider, rec: Reconciler
) -> list[GpuRow]:
    """This node's GPUs now: a fresh reading, and the jobs with a running rank on each."""
    readings = {t.index: t for t in gpus.telemetry()}
    holders = rec.gpu_holders()
    rows = []
    for gpu in inventory:
        t = readings.get(gpu.index)
        held = holders.get(gpu.index, [])
        a = held[0] if held else None
        rows.append(
            GpuRow(
                node=node,
                gpu=gpu.index,
                uuid=gpu.uuid,
                memory_mb=gpu.memory_mb,
                utilization_pct=None if t is None else t.utilization_pct,
                memory_used_mb=None if t is None else t.memory_used_mb,
                temperature_c=None if t is None else t.temperature_c,
                power_w=None if t is None else t.power_w,
                energy_j=None if t is None else t.energy_j,
                age_s=None if t is None else 0.0,
                job=None if a is None else a.job_id,
                user="" if a is None else a.user,
                team="" if a is None or a.team is None else a.team,
            )
        )
    return rows


def install(
    app: FastAPI,
    *,
    node: str,
    inventory: list[GpuInfo],
    gpus: GpuProvider,
    reconciler: Reconciler,
    secret: str,
    scrape_token: str | None,
) -> None:
    """Add `GET /metrics` to the agent's API (it must be among the BearerGate's open
    paths: the route checks its own tokens)."""
    accepted = [secret] + ([scrape_token] if scrape_token else [])
    cache: dict[tuple[object, ...], str] = {}  # label sets between scrapes

    def allowed(authorization: str | None) -> None:
        token = bearer_token(authorization)
        if token is None:
            raise HTTPException(401, "missing Authorization: Bearer token")
        if not any(hmac.compare_digest(token.encode(), t.encode()) for t in accepted):
            raise HTTPException(401, "not a token that may scrape this agent")

    @app.get(METRICS_PATH, response_class=Response)
    async def metrics(authorization: Annotated[str | None, Header()] = None) -> Response:
        """This node's per-GPU series (the head's agent secret, or the scrape token)."""
        allowed(authorization)
        rows = await asyncio.to_thread(gpu_rows, node, inventory, gpus, reconciler)
        return Response(render(rows, cache), media_type=CONTENT_TYPE)


async def keep_job_map(
    writer: JobMapWriter,
    reconciler: Reconciler,
    changed: asyncio.Event,
    stop: asyncio.Event,
    on_error: Callable[[str], None],
) -> None:
    """Rewrite the job-mapping files whenever what runs here changes (`changed` is set by
    process and desired-state changes), checking at least every MAP_INTERVAL_S; cleared
    when the agent stops. A failed write is reported and retried, never fatal."""
    last_error = 0.0
    while not stop.is_set():
        try:
            holders = reconciler.gpu_holders()
            jobs = {gpu: [a.job_id for a in held] for gpu, held in holders.items()}
            await asyncio.to_thread(writer.update, jobs)
        except OSError as e:
            if time.monotonic() - last_error > 60:  # once a minute while it lasts
                log.warning("job-mapping files in %s: %s", writer.directory, e)
                last_error = time.monotonic()
            on_error("job-mapping files")
        changed.clear()
        waiter = asyncio.create_task(changed.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, timeout=MAP_INTERVAL_S, return_when="FIRST_COMPLETED")
        waiter.cancel()
        stopper.cancel()
