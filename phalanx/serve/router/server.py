"""The router process: builds the gateway for a deployment (its endpoints refreshed from
the head) or for fixed replicas (`--replica URL`, tests and benchmarks), and serves it
with uvicorn (httptools and uvloop when installed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import uvicorn
from pydantic import ValidationError

from phalanx.api.serving import Endpoint, Endpoints, Engine, Policy, PoolRole
from phalanx.serve.router.access import Audience, HeadUnreachable, RateLimits, TokenCache
from phalanx.serve.router.app import Router, RouterConfig
from phalanx.serve.router.checks import DEFAULT_MAX_BODY
from phalanx.serve.router.engine_metrics import POLL_S, EnginePoller
from phalanx.serve.router.headlink import HeadError, HeadLink
from phalanx.serve.router.prefix import DEFAULT_MAX_BLOCKS, PrefixIndex
from phalanx.serve.router.replicas import ReplicaSet
from phalanx.serve.router.report import REPORT_S, Reporter
from phalanx.serve.router.stats import RouterStats

log = logging.getLogger("phalanx.serve.router")

REFRESH_S = 1.0  # endpoints from the head, this often (and soon after a replica fails)
AUDIENCE_S = 10.0  # the deployment's owner and team, this often
SOONEST_S = 0.2  # a replica error triggers a refresh no sooner than this after the last


DEPLOYMENT_NAME = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")  # as api.serving's


class RouterSetupError(Exception):
    """The router cannot start as asked; the message says why."""


@dataclass
class RouterOptions:
    head: str | None = None
    deployment: str | None = None
    token: str | None = None  # the router's own token (reads the deployment's endpoints)
    ca: str | None = None
    replicas: list[str] = field(default_factory=list)  # fixed replicas instead of a head
    prefill: list[str] = field(default_factory=list)  # fixed disaggregated pools
    decode: list[str] = field(default_factory=list)
    engine: Engine | None = None  # fixed replicas: default custom (llama.cpp if disaggregated)
    engine_key: str | None = None
    served_model_name: str | None = None
    policy: Policy | None = None
    block_chars: int | None = None
    slots: int = 4
    owner: str | None = None  # fixed replicas + head: who may call (with --team, admins)
    team: str | None = None
    no_auth: bool = False
    rate_limits: dict[str, float] = field(default_factory=dict)
    default_rate: float | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    retries: int = 2
    max_in_flight: int = 4096
    max_blocks: int = DEFAULT_MAX_BLOCKS
    read_timeout_s: float = 600.0
    engine_poll_s: float = POLL_S  # each replica's /metrics this often (0: never)
    report_s: float = REPORT_S  # the summary to the head this often (head mode; 0: never)
    router_id: str = ""  # names this router's reports (default: the host name)


def _fixed_endpoints(options: RouterOptions, model: str) -> Endpoints:
    pools: list[tuple[PoolRole, str]] = [
        *(("aggregated", url) for url in options.replicas),
        *(("prefill", url) for url in options.prefill),
        *(("decode", url) for url in options.decode),
    ]
    disaggregated = bool(options.prefill)
    return Endpoints(
        name="replicas",
        served_model_name=model,
        engine=options.engine or ("llama.cpp" if disaggregated else "custom"),
        policy=options.policy or "kv-aware",
        block_chars=options.block_chars or 256,
        generation=0,
        engine_key=options.engine_key or "-",
        endpoints=[
            Endpoint(job_id=i + 1, pool=pool, url=url, slots=options.slots, generation=0)
            for i, (pool, url) in enumerate(pools)
        ],
    )


async def _discover_model(url: str, key: str | None) -> str:
    """The model a replica serves (its /v1/models), when --served-model-name is not given."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            r = await client.get(f"{url.rstrip('/')}/v1/models", headers=headers)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise RouterSetupError(
            f"cannot learn the served model from {url}/v1/models ({e!r}): give --served-model-name"
        ) from None


def build(
    options: RouterOptions,
    clock: Callable[[], float] = time.monotonic,
    background: Sequence[Callable[[Router], Coroutine[Any, Any, None]]] = (),
) -> Router:
    """The gateway app; its lifespan starts the endpoint refresh (head mode) and each of
    `background` (e.g. the SLO autoscaler reading `router.stats`), cancelled at shutdown."""
    fixed = options.replicas or options.prefill or options.decode
    if not fixed and not (options.head and options.deployment):
        raise RouterSetupError(
            "give --head and --deployment, or --replica URL (or --prefill and --decode URLs)"
        )
    if options.deployment is not None and not DEPLOYMENT_NAME.fullmatch(options.deployment):
        raise RouterSetupError(f"--deployment {options.deployment!r} is not a deployment name")
    if fixed and options.deployment:
        raise RouterSetupError("fixed replicas and --deployment exclude each other")
    if bool(options.prefill) != bool(options.decode) or (options.prefill and options.replicas):
        raise RouterSetupError("give --replica URLs, or both --prefill and --decode URLs")
    if options.deployment and not options.token:
        raise RouterSetupError("the router needs its token (--token-file) to read endpoints")
    if not options.head and not options.no_auth:
        raise RouterSetupError(
            "without --head nothing can check client tokens: give --head URL (and --owner/"
            "--team with --replica), or --no-auth to serve anyone who can reach the router"
        )
    if fixed and options.head and not (options.owner or options.team):
        raise RouterSetupError("with --replica and --head, say who may call: --owner, --team")
    if 0 < options.engine_poll_s < 0.1 or 0 < options.report_s < 0.5:
        raise RouterSetupError(
            "--engine-poll takes 0 (never) or at least 0.1 s; --report-interval 0 or at least 0.5 s"
        )
    index = PrefixIndex(options.max_blocks)
    replicas = ReplicaSet(index, clock, read_timeout_s=options.read_timeout_s)
    link = HeadLink(options.head, options.token or "", options.ca) if options.head else None
    stats = RouterStats(clock)
    audience = Audience(owner=options.owner, team=options.team)
    wake = asyncio.Event()

    def current_audience() -> Audience:
        return audience

    def replica_error() -> None:
        wake.set()

    config = RouterConfig(
        served_model_name=options.served_model_name or "",
        max_body_bytes=options.max_body_bytes,
        retries=options.retries,
        max_in_flight=options.max_in_flight,
        policy=options.policy,
        block_chars=options.block_chars,
    )

    def publish(endpoints: Endpoints) -> None:
        replicas.update(endpoints)
        for pool in ("aggregated", "prefill", "decode"):
            stats.set_ready(pool, replicas.ready(pool))

    async def startup() -> Callable[[], Awaitable[None]]:
        nonlocal audience
        tasks: list[asyncio.Task[None]] = []
        if link is None or fixed:
            model = options.served_model_name or await _discover_model(
                [*options.replicas, *options.decode][0], options.engine_key
            )
            router.config = _with_model(router.config, model)
            publish(_fixed_endpoints(options, model))
        else:
            assert options.deployment is not None
            name = options.deployment
            try:
                publish(await link.endpoints(name))
                audience = await link.audience(name)
                router.config = _with_model(router.config, _model(replicas))
            except (HeadError, ValidationError) as e:
                await link.aclose()
                raise RouterSetupError(str(e)) from None
            except HeadUnreachable as e:
                log.warning("%s; retrying in the background", e)
            tasks.append(asyncio.create_task(refresh_loop(link, name)))
        if options.engine_poll_s > 0:
            poller = EnginePoller(replicas, options.engine_poll_s)
            router.engines = poller
            tasks.append(asyncio.create_task(poller.run()))
        if link is not None and options.deployment and options.report_s > 0:
            reporter = Reporter(
                link,
                options.deployment,
                options.router_id or socket.gethostname(),
                stats,
                router.engines,
                router.metrics.predicted_hit_rate,
                options.report_s,
            )
            tasks.append(asyncio.create_task(reporter.run()))
        tasks.extend(asyncio.create_task(job(router)) for job in background)

        async def stop() -> None:
            for task in tasks:
                task.cancel()
            for task in tasks:
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception:
                    log.exception("a router task failed")
            if link is not None:
                await link.aclose()

        return stop

    async def refresh_loop(link: HeadLink, name: str) -> None:
        nonlocal audience
        last_audience = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), REFRESH_S)
                await asyncio.sleep(SOONEST_S)
            wake.clear()
            try:
                publish(await link.endpoints(name))
                router.config = _with_model(router.config, _model(replicas))
                if time.monotonic() - last_audience >= AUDIENCE_S or audience == Audience():
                    audience = await link.audience(name)
                    last_audience = time.monotonic()
            except (HeadError, HeadUnreachable, ValidationError) as e:
                log.warning("cannot refresh the endpoints of %s: %s", name, e)
            except Exception:
                log.exception("refreshing the endpoints of %s failed", name)

    tokens = TokenCache(link.whoami, clock) if link is not None and not options.no_auth else None
    router = Router(
        config,
        replicas,
        tokens=tokens,
        audience=current_audience,
        limits=RateLimits(options.rate_limits, options.default_rate, clock),
        stats=stats,
        on_replica_error=replica_error,
        lifespan=startup,
    )
    return router


def _model(replicas: ReplicaSet) -> str:
    assert replicas.endpoints is not None
    return replicas.endpoints.served_model_name


def _with_model(config: RouterConfig, model: str) -> RouterConfig:
    return config if config.served_model_name == model else replace(config, served_model_name=model)


def serve(
    options: RouterOptions,
    host: str,
    port: int,
    background: Sequence[Callable[[Router], Coroutine[Any, Any, None]]] = (),
) -> None:
    """Run the router until SIGINT/SIGTERM (with `background` tasks, as `build`)."""
    app = build(options, background=background)
    loop = "uvloop" if _has("uvloop") else "asyncio"
    http = "httptools" if _has("httptools") else "h11"
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop=loop,
        http=http,
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=75,
        backlog=4096,
    )


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
