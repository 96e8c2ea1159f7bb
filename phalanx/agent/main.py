"""The agent process: API server, registration and heartbeats in one asyncio loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from phalanx import pidlock
from phalanx.api.models import MAX_CONFINEMENT, RegisterRequest, validation_detail
from phalanx.tls import TLSError, client_context

from . import adopt, cgroups, fakeload, metrics, telemetry
from .confine import JobConfiner
from .execrun import ExecManager
from .gpus import FakeProvider, GpuError, GpuProvider, detect
from .guard import LeaseFile, start_guard, stop_guard
from .headlink import HeadLink, HeadSeen, JoinRefused
from .headlink import _headers as headlink_headers
from .health import EVENTS_FILE, EventQueue, HealthMonitor, check_problem
from .identity import sane_env
from .jobmap import JobMapWriter, expand
from .leave import Leaver
from .processes import ProcessManager
from .reconcile import LaunchContext, Reconciler
from .server import create_app
from .slurm_cmds import write_shims
from .steps import StepManager
from .survive import Survivals
from .tlsserve import AgentTLS

SHUTDOWN_GRACE_S = 1  # seconds (uvicorn takes whole ones)
log = logging.getLogger(__name__)
NODE_CREDENTIAL_FILE = "node.token"  # the node credential, kept across restarts (0600)
LOCK_FILE = "agent.lock"  # in the state dir: one agent per state dir
PORT_FILE = "port"  # "ADDRESS PORT" the API last listened on: taken again after a restart
# Exit for an upgrade (or any restart), leaving the jobs running for the next agent on this
# state dir to adopt; SIGTERM and SIGINT still mean "stop my jobs, then exit".
UPGRADE_SIGNAL = signal.SIGUSR2


class AgentError(RuntimeError):
    """The agent cannot start or cannot join; the message says what to fix."""


@dataclass(frozen=True)
class AgentConfig:
    """How to run one agent (the `phalanx agent` flags)."""

    head_url: str  # or several, comma-separated: a leader and its standbys
    token: str  # the join token; never logged, never given to jobs
    address: str  # where this node is reached (API server, MASTER_ADDR)
    name: str
    state_dir: Path
    port: int = 0  # agent API port; 0 picks a free one
    fake_gpus: int | None = None
    gpu_model: str = "H100"
    labels: dict[str, str] = field(default_factory=dict)
    heartbeat_s: float = 2.0
    health_checks: tuple[Path, ...] = ()  # NHC-style scripts: exit 0 is healthy
    health_interval_s: float = 30.0  # how often they run; also each one's timeout
    use_cgroups: bool = True  # confine each job in its own cgroup (when root and mounted)
    cgroup_parent: str = cgroups.DEFAULT_PARENT  # the cgroup every agent's jobs go under
    job_pids_max: int | None = cgroups.DEFAULT_PIDS_MAX  # per job and node; None: unlimited
    gpu_dev_dir: Path | None = None  # fake GPUs' device files (nvidia0…), for tests
    ca_file: Path | None = None  # the CA certificate the head's TLS is pinned to
    max_outage_s: float = 720.0  # keep jobs through a head outage this long (head caps it)
    telemetry_interval_s: float = telemetry.DEFAULT_INTERVAL_S  # GPU and job sampling
    telemetry_ship_s: float = telemetry.DEFAULT_SHIP_S  # batches to the head
    # dcgm-exporter's --hpc-job-mapping-dir: one file per GPU listing its jobs (`%n`: the
    # node's name); None: none written.
    hpc_job_mapping_dir: str | None = None
    metrics_token_file: Path | None = None  # the token that may scrape /metrics (besides the head)
    # SIGTERM: "stop" kills the jobs and exits; "leave" has them noticed and requeued
    # first, within leave_grace_s (an agent running as a Slurm job: agent/leave.py).
    on_sigterm: str = "stop"
    leave_grace_s: float = 60.0


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the agent owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def run_agent(
    cfg: AgentConfig,
    stop: threading.Event | None = None,
    leave_jobs: threading.Event | None = None,
) -> None:
    """Run the agent until SIGINT/SIGTERM (or `stop` is set): serve the agent API,
    register with the head, heartbeat and reconcile. Every job process is stopped before
    it returns. SIGUSR2 (or `leave_jobs` set) ends it too but leaves the jobs running: the
    next agent started on the same state dir within the lease adopts them (an upgrade).
    Raises AgentError for problems the user must fix (no GPUs, bad token)."""
    # Everything the agent writes is its own unless it says otherwise (jobs' files are
    # created for their user): no job reads the agent's records or credentials. The
    # umask is the process's: an agent run inside another program gives it back.
    umask = os.umask(0o077)
    try:
        _check_head_urls(cfg.head_url)
        _check_health_settings(cfg)
        ca_pem = _read_ca(cfg.ca_file)
        with _state_lock(cfg.state_dir):
            asyncio.run(_run(cfg, stop, leave_jobs, ca_pem))
    except (GpuError, JoinRefused, metrics.MetricsTokenError) as e:
        raise AgentError(str(e)) from e
    finally:
        os.umask(umask)


@contextlib.contextmanager
def _state_lock(state_dir: Path) -> Iterator[None]:
    """Hold `<state-dir>/agent.lock` while the agent runs. A second agent on the same state
    dir would take the first one's job processes for a dead agent's leftovers and kill
    them, and both would write the same lease file: it is refused instead."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        held = pidlock.lock(state_dir, LOCK_FILE, "agent")
    except pidlock.AlreadyRunning as e:
        raise AgentError(f"{e}; stop it first, or give this agent its own --state-dir") from None
    except OSError as e:
        raise AgentError(f"cannot use the state dir {state_dir}: {e.strerror or e}") from None
    try:
        yield
    finally:
        held.close()


async def _run(
    cfg: AgentConfig,
    stop_flag: threading.Event | None,
    leave_flag: threading.Event | None,
    ca_pem: str | None,
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    leaving = asyncio.Event()  # stop, but leave the jobs running (an upgrade)

    def leave() -> None:
        leaving.set()
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(UPGRADE_SIGNAL, leave)
    for flag, action in ((stop_flag, stop.set), (leave_flag, leave)):
        if flag is not None:
            threading.Thread(
                target=lambda f=flag, a=action: (f.wait(), loop.call_soon_threadsafe(a)),
                daemon=True,
            ).start()

    changed = asyncio.Event()
    map_changed = asyncio.Event()  # what runs here changed: the job-mapping files follow

    def notify(*_: object) -> None:
        loop.call_soon_threadsafe(changed.set)
        loop.call_soon_threadsafe(map_changed.set)

    state_dir = cfg.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Jobs pass through to their own files (srun shims, batch script, step counter) by
    # exact path; nothing here can be listed, and the rest is mode 0700/0600.
    state_dir.chmod(0o711)
    agent_secret = secrets.token_urlsafe(32)
    keep_out: set[str] = {cfg.token, agent_secret}  # the node token joins once issued
    scrape_token = None
    if cfg.metrics_token_file is not None:
        scrape_token = metrics.read_token(cfg.metrics_token_file)
        keep_out.add(scrape_token)
    # A job never inherits the agent's environment: a standard PATH and locale, then its
    # user's login variables, its own exported ones and the agent's (env.py).
    ctx = LaunchContext(
        state_dir=state_dir,
        base_env=sane_env(),
        head_url=cfg.head_url,
        secrets=keep_out,
        head_ca_pem=ca_pem,
        fake_gpus=cfg.fake_gpus is not None,
    )
    procs = ProcessManager(on_change=notify)
    steps = StepManager(ctx, procs)
    survivals = Survivals()  # exceptions the agent's loops caught and survived
    reconciler = Reconciler(
        ctx,
        procs,
        on_change=notify,
        on_stop_job=steps.stop_undesired,
        on_adopt_steps=steps.adopt,
        survivals=survivals,
    )
    execs = ExecManager(ctx, procs, reconciler)
    gpus = detect(
        cfg.fake_gpus,
        cfg.gpu_model,
        node_name=cfg.name,
        busy=reconciler.busy_gpus,
        load=lambda: fakeload.loads(reconciler.holdings()),
        device_dir=cfg.gpu_dev_dir,
    )
    confinement = cgroups.setup(
        cfg.name,
        state_dir,
        parent=cfg.cgroup_parent,
        pids_max=cfg.job_pids_max,
        enabled=cfg.use_cgroups,
    )
    job_map = None
    if cfg.hpc_job_mapping_dir is not None:
        job_map = JobMapWriter(
            expand(cfg.hpc_job_mapping_dir, cfg.name), [g.index for g in gpus.inventory()]
        )
        try:
            job_map.prepare()
        except OSError as e:
            gpus.close()
            confinement.close()
            raise AgentError(
                f"--hpc-job-mapping-dir {job_map.directory}: {e.strerror or e}"
            ) from None
    if confinement.enabled:
        log.info("confinement: %s (one cgroup per job)", confinement.describe)
    else:
        log.warning("confinement: %s: jobs run without cgroup limits", confinement.describe)
    if confinement.enabled:
        confine = JobConfiner(confinement, gpus.device_files())
        reconciler.confine = confine
        steps.cgroup_of = confine.get
        execs.cgroup_of = confine.get
    health = HealthMonitor(
        gpus,
        EventQueue(state_dir / EVENTS_FILE),
        [p.resolve() for p in cfg.health_checks],
        interval_s=cfg.health_interval_s,
        on_change=notify,
        survivals=survivals,
    )
    try:
        health.start()  # the checks' first run starts now, in parallel with registering
        write_shims(ctx.bin_dir)
        # The job processes an earlier run of the agent left: within its lease (an upgrade,
        # a crash) they wait for the head's word, to be adopted or killed; past it they
        # are killed now, before registering (this agent reports their epochs lost and
        # never runs them again).
        survivors = await asyncio.to_thread(adopt.inherit, state_dir)
        if survivors.deadline is not None:
            reconciler.survivors = survivors
        sock = _listen(cfg.address, cfg.port, state_dir / PORT_FILE)
        # With a pinned CA the agent's API serves TLS too, with a certificate the head
        # signs at registration (the head's own CA); without one, plain HTTP.
        agent_tls = AgentTLS(state_dir) if ca_pem is not None else None
        scheme = "https" if agent_tls is not None else "http"
        agent_url = f"{scheme}://{cfg.address}:{sock.getsockname()[1]}"
        request = _register_request(cfg, agent_url, agent_secret, gpus, confinement.describe)
        if agent_tls is not None:
            request = request.model_copy(update={"csr": agent_tls.csr(cfg.name)})
        inject = gpus.inject if isinstance(gpus, FakeProvider) else None
        seen = HeadSeen(cfg.name)
        app = create_app(
            secret=agent_secret,
            reconciler=reconciler,
            steps=steps,
            inject=inject,
            head_seen=seen,
            execs=execs,
        )
        metrics.install(
            app,
            node=cfg.name,
            inventory=request.gpus,
            gpus=gpus,
            reconciler=reconciler,
            secret=agent_secret,
            scrape_token=scrape_token,
        )
        # A request still open when the agent stops (a peer's, a log read, an exec) gets
        # SHUTDOWN_GRACE_S to finish: an agent leaving for an upgrade must be gone well
        # within the lease, or its jobs are fenced before the next agent adopts them.
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
        if agent_tls is not None:
            config.load()
            config.ssl = agent_tls.context  # its certificate arrives with registration
        server = _Server(config)
        serving = asyncio.create_task(_serve(server, sock, reconciler, stop))
        log.info("agent %s serving on %s with %d GPU(s)", cfg.name, agent_url, len(request.gpus))
        link = HeadLink(
            cfg.head_url,
            cfg.token,
            request,
            reconciler,
            gpus,
            changed=changed,
            stop=stop,
            heartbeat_s=cfg.heartbeat_s,
            secrets=keep_out,
            health=health,
            verify=client_context(ca_pem),
            agent_tls=agent_tls,
            credential_file=state_dir / NODE_CREDENTIAL_FILE,
            seen=seen,
            max_outage_s=cfg.max_outage_s,
            lease_until=survivors.deadline,
        )
        if cfg.on_sigterm == "leave" and threading.current_thread() is threading.main_thread():
            Leaver(link, reconciler, stop, cfg.leave_grace_s).install(loop)
        shipping = _start_telemetry(cfg, gpus, reconciler, link, survivals, stop, ca_pem)
        # Fences the jobs should this process be frozen or killed (it cannot, then).
        guard = start_guard(state_dir)
        if survivors.deadline is not None:
            # Take the lease over from the previous agent's guard, unchanged: this guard
            # now fences its jobs at that deadline unless the head answers this agent.
            LeaseFile(state_dir).renew(survivors.deadline)
        mapper = None
        if job_map is not None:
            mapper = asyncio.create_task(
                metrics.keep_job_map(
                    job_map,
                    reconciler,
                    map_changed,
                    stop,
                    lambda what: survivals.record(what, "not written; retried", quiet=True),
                )
            )
        try:
            await link.run()
        finally:
            if leaving.is_set():
                await link.last_beat()
                log.warning(
                    "agent %s exiting for a restart; its jobs keep running, and its lease guard "
                    "fences them unless an agent on %s takes them over within the lease",
                    cfg.name,
                    state_dir,
                )
            else:
                log.info("agent %s stopping: ending job processes", cfg.name)
                await asyncio.to_thread(reconciler.shutdown)
                await asyncio.to_thread(stop_guard, guard)
            if mapper is not None:
                stop.set()
                await mapper
                if job_map is not None and not leaving.is_set():
                    with contextlib.suppress(OSError):  # its jobs are gone: no labels
                        await asyncio.to_thread(job_map.update, {})
            server.should_exit = True
            await serving
            await shipping.stop()
    finally:
        await asyncio.to_thread(health.stop)
        gpus.close()
        confinement.close()


class _Telemetry:
    """The sampler thread and the shipper task of one agent run."""

    def __init__(self, sampler: telemetry.Sampler, task: asyncio.Task[None]) -> None:
        self.sampler = sampler
        self.task = task

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await asyncio.to_thread(self.sampler.stop)


def _start_telemetry(
    cfg: AgentConfig,
    gpus: GpuProvider,
    reconciler: Reconciler,
    link: HeadLink,
    survivals: Survivals,
    stop: asyncio.Event,
    ca_pem: str | None,
) -> _Telemetry:
    """Sample GPUs and jobs on a thread; ship the samples from a task (agent/telemetry.py)."""
    loop = asyncio.get_running_loop()
    shipper: telemetry.Shipper | None = None

    def job_ended() -> None:
        if shipper is not None:
            loop.call_soon_threadsafe(shipper.wake)

    sampler = telemetry.Sampler(
        gpus,
        reconciler.holdings,
        interval_s=cfg.telemetry_interval_s,
        survivals=survivals,
        on_job_end=job_ended,
    )

    def target() -> tuple[str, str] | None:
        token = link.node_token
        return None if token is None else (link.head_url, token)

    shipper = telemetry.Shipper(
        sampler,
        cfg.name,
        target,
        headlink_headers,
        ship_s=cfg.telemetry_ship_s,
        verify=client_context(ca_pem),
        survivals=survivals,
    )
    sampler.start()
    return _Telemetry(sampler, asyncio.create_task(shipper.run(stop)))


async def _serve(
    server: uvicorn.Server, sock: socket.socket, reconciler: Reconciler, stop: asyncio.Event
) -> None:
    """Serve the agent API. An agent adopting jobs (adopt.py) serves only once it knows
    them (the head's first desired state): their srun steps' and the head's requests wait
    in the listen backlog meanwhile rather than get a 404 for a job it adopts a moment
    later."""
    while not reconciler.settled() and not stop.is_set():
        await asyncio.sleep(0.05)
    if not stop.is_set():
        await server.serve(sockets=[sock])


def _check_head_urls(value: str) -> None:
    """`--head URL` or `URL1,URL2,…`: every entry an http(s) URL."""
    urls = [u.strip() for u in value.split(",")]
    for url in urls:
        if not url.startswith(("http://", "https://")) or len(url.split("//", 1)[1]) == 0:
            raise AgentError(
                f"--head {value!r}: expected http(s)://HOST:PORT, or several comma-separated"
            )


def _read_ca(path: Path | None) -> str | None:
    """The pinned CA certificate's PEM text (checked to load), or None: trust the system's."""
    if path is None:
        return None
    try:
        pem = path.read_text()
        client_context(pem)
    except (OSError, UnicodeDecodeError, TLSError) as e:
        raise AgentError(f"--ca-file {path}: not a readable PEM certificate ({e})") from None
    return pem


def _check_health_settings(cfg: AgentConfig) -> None:
    if cfg.health_interval_s <= 0:
        raise AgentError(f"--health-interval must be > 0 seconds, got {cfg.health_interval_s:g}")
    for path in cfg.health_checks:
        problem = check_problem(path)
        if problem is not None:
            raise AgentError(problem)
    try:
        telemetry.check_interval(cfg.telemetry_interval_s, "--telemetry-interval")
        telemetry.check_interval(cfg.telemetry_ship_s, "--telemetry-ship")
    except ValueError as e:
        raise AgentError(str(e)) from None


def _listen(address: str, port: int, remembered: Path | None = None) -> socket.socket:
    """Bind the API socket now, so port 0 resolves before registering. With port 0 the
    port of the previous run on this state dir (`remembered`) is taken again when free:
    the jobs it adopts reach their agent at the URL they were given (srun)."""
    sock = None
    if port == 0 and remembered is not None:
        with contextlib.suppress(OSError, ValueError):
            was_address, was_port = remembered.read_text().split()
            if was_address == address:
                sock = _bind(address, int(was_port))
    if sock is None:
        try:
            sock = _bind(address, port)
        except OSError as e:
            raise AgentError(f"cannot listen on {address}:{port}: {e.strerror or e}") from e
    if remembered is not None:
        with contextlib.suppress(OSError):
            remembered.write_text(f"{address} {sock.getsockname()[1]}\n")
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _bind(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _register_request(
    cfg: AgentConfig,
    agent_url: str,
    agent_secret: str,
    gpus: GpuProvider,
    confinement: str = "unknown",
) -> RegisterRequest:
    try:
        return RegisterRequest(
            name=cfg.name,
            address=cfg.address,
            agent_url=agent_url,
            agent_secret=agent_secret,
            cpus=os.cpu_count() or 1,
            memory_mb=_memory_mb(),
            gpus=gpus.inventory(),
            labels=cfg.labels,
            confinement=confinement[:MAX_CONFINEMENT],
        )
    except ValidationError as e:
        raise AgentError(f"invalid agent settings: {validation_detail(e.errors())}") from e


def _memory_mb() -> int:
    """Physical memory in MiB."""
    try:
        return max(1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20)
    except (ValueError, OSError):
        return 1
