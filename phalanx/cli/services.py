"""`phalanx head`, `phalanx agent` and `phalanx up`: running the cluster's processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from phalanx.cli.output import fail

if TYPE_CHECKING:
    from phalanx.head.certs import TLSRequest


def head(
    state_dir: Annotated[
        Path,
        typer.Option(
            help="Where the head keeps its database and tokens.",
            file_okay=False,
            show_default=False,
        ),
    ],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8265,
    db: Annotated[
        str | None,
        typer.Option(
            help="Database URL, e.g. postgresql+psycopg://… (default: SQLite in the state dir)."
        ),
    ] = None,
    heartbeat: Annotated[
        float, typer.Option(min=0.1, max=30, help="Seconds between agent heartbeats.")
    ] = 2.0,
    heartbeat_rate: Annotated[
        float,
        typer.Option(
            min=1,
            max=1e6,
            help="Heartbeats a second the head budgets for: with more than --heartbeat × "
            "this many nodes, agents heartbeat less often, down to 3 per --lease "
            "(README: Heartbeats at scale).",
        ),
    ] = 1500.0,
    lease: Annotated[
        float,
        typer.Option(
            min=0.5,
            max=3600,
            help="A node silent this long is marked down; its agent stops its jobs after as "
            "long without the head, and they are requeued once --requeue-margin more has "
            "passed (at least 3 heartbeats).",
        ),
    ] = 8.0,
    requeue_margin: Annotated[
        float, typer.Option(min=0, max=600, help="Seconds after the lease before requeueing.")
    ] = 2.0,
    overload_grace: Annotated[
        float,
        typer.Option(
            min=0,
            max=3600,
            help="While the head is behind on its work, a node's silence is counted only up "
            "to when the head could hear it, at most this many seconds behind now: a dead "
            "node is down after --lease plus this at the latest (0: the wall clock alone).",
        ),
    ] = 30.0,
    shed_backlog: Annotated[
        float,
        typer.Option(
            min=0,
            max=3600,
            help="Past this many seconds of backlog the head answers submits and reads 503 "
            "(Retry-After) so heartbeats go first (0: never).",
        ),
    ] = 2.0,
    kill_grace: Annotated[
        float, typer.Option(min=0, max=3600, help="Seconds between SIGTERM and SIGKILL.")
    ] = 5.0,
    preempt_grace: Annotated[
        float,
        typer.Option(
            min=0, max=86400, help="Seconds a preempted job has to checkpoint (its own wins)."
        ),
    ] = 60.0,
    hang_timeout: Annotated[
        float,
        typer.Option(
            min=0,
            max=7 * 86400,
            help="A job that reports progress and then goes silent this long is restarted "
            "(its own --hang-timeout wins; 0: off).",
        ),
    ] = 600.0,
    users_map_to_self: Annotated[
        bool,
        typer.Option(
            "--users-map-to-self",
            help="A personal cluster: users without an explicit --uid run their jobs as the "
            "head's own Unix account, not the account named like them (`phalanx up`).",
        ),
    ] = False,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            help="Serve with this certificate (PEM; with --tls-key) instead of the head's own "
            "CA's.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(help="Private key of --tls-cert (PEM).", dir_okay=False, show_default=False),
    ] = None,
    tls_ca: Annotated[
        Path | None,
        typer.Option(
            help="CA certificate that signed --tls-cert, for clients and jobs to pin "
            "(default: none; they use the system's trust store).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    tls_name: Annotated[
        list[str] | None,
        typer.Option(
            help="Extra name or address clients reach the head by, for its own certificate "
            "(repeatable; the listen address, hostname and loopback are always in).",
            show_default=False,
        ),
    ] = None,
    plain_http: Annotated[
        bool,
        typer.Option(
            help="Serve plain HTTP, without TLS: tokens cross the network readable. Allowed on "
            "a loopback --host only, unless --plain-http-anywhere.",
        ),
    ] = False,
    plain_http_anywhere: Annotated[
        bool,
        typer.Option(help="Allow --plain-http on a non-loopback --host (a trusted network)."),
    ] = False,
    token_ttl: Annotated[
        str,
        typer.Option(
            help="Default life of a user's API token (24h, 90d, …; never: no expiry); "
            "`phalanx token create --expires` picks another, never past the minting token's."
        ),
    ] = "90d",
    join_token_ttl: Annotated[
        str,
        typer.Option(
            help="Default life of a join token, the one written to join.token included "
            "(a fresh one replaces it at start once it has expired)."
        ),
    ] = "24h",
    max_queued_per_user: Annotated[
        int,
        typer.Option(min=0, help="Queued and running jobs a user may have at once (0: no limit)."),
    ] = 10_000,
    max_spec_bytes: Annotated[
        int,
        typer.Option(
            min=0, max=2 * 1024 * 1024, help="Largest job spec, bytes of JSON (0: the body limit)."
        ),
    ] = 256 * 1024,
    max_outage: Annotated[
        float,
        typer.Option(
            min=0,
            max=7 * 86400,
            help="Agents keep their jobs through a head outage (restart, pause, failover) "
            "this long when their peers confirm the head is out (0: fence at the lease).",
        ),
    ] = 720.0,
    notify_allow: Annotated[
        list[str] | None,
        typer.Option(
            help="Where job notifications (--notify-url) may be posted: a host (any http(s) "
            "URL to it) or a URL prefix (https://hooks.example.com/phalanx); repeatable; "
            "`none`: nowhere. Default: this machine only (127.0.0.1, localhost, [::1]).",
            show_default=False,
        ),
    ] = None,
    telemetry_raw_days: Annotated[
        float,
        typer.Option(min=0.01, max=3650, help="Keep raw GPU samples (10 s) this many days."),
    ] = 7.0,
    telemetry_minute_days: Annotated[
        float,
        typer.Option(min=0.01, max=3650, help="Keep per-minute GPU rollups this many days."),
    ] = 30.0,
    telemetry_hour_days: Annotated[
        float,
        typer.Option(min=0.01, max=36500, help="Keep per-hour GPU rollups this many days."),
    ] = 365.0,
) -> None:
    """Run the head: REST API, scheduler and state (blocks; Ctrl-C stops it).

    The API is served over TLS by default: on first start the head makes a private CA and
    a server certificate in STATE_DIR/tls (clients pin STATE_DIR/tls/ca.crt), or serves
    the operator's certificate (--tls-cert, --tls-key).
    """
    from phalanx.cli.ttl import parse_ttl
    from phalanx.head.mirror import Settings
    from phalanx.head.notify import DEFAULT_ALLOW, allow_entries
    from phalanx.head.server import serve

    if lease < 3 * heartbeat:
        fail(f"--lease {lease:g} must be at least 3 heartbeats (--heartbeat {heartbeat:g})")
    try:
        api_ttl = parse_ttl("--token-ttl", token_ttl, allow_never=True)
        join_ttl = parse_ttl("--join-token-ttl", join_token_ttl, allow_never=True)
        allow = allow_entries(notify_allow) if notify_allow else DEFAULT_ALLOW
    except ValueError as exc:
        fail(str(exc))
    settings = Settings(
        heartbeat_s=heartbeat,
        heartbeat_rate=heartbeat_rate,
        lease_s=lease,
        requeue_margin_s=requeue_margin,
        overload_grace_s=overload_grace,
        shed_backlog_s=shed_backlog,
        kill_grace_s=kill_grace,
        preempt_grace_s=preempt_grace,
        hang_timeout_s=hang_timeout,
        users_map_to_self=users_map_to_self,
        api_token_ttl_s=api_ttl,
        join_token_ttl_s=join_ttl,
        max_queued_per_user=max_queued_per_user,
        max_spec_bytes=max_spec_bytes,
        max_outage_s=max_outage,
        notify_allow=allow,
        telemetry_raw_days=telemetry_raw_days,
        telemetry_minute_days=telemetry_minute_days,
        telemetry_hour_days=telemetry_hour_days,
    )
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        fail(f"cannot create the state dir {state_dir}: {exc.strerror}")
    tls = _head_tls(
        host, tls_cert, tls_key, tls_ca, tls_name or [], plain_http, plain_http_anywhere
    )
    with contextlib.suppress(KeyboardInterrupt):
        serve(state_dir, host, port, db, settings, tls)


def _head_tls(
    host: str,
    cert: Path | None,
    key: Path | None,
    ca: Path | None,
    names: list[str],
    plain: bool,
    plain_anywhere: bool,
) -> TLSRequest | None:
    """What TLS the flags ask for (None: plain HTTP), or a one-line failure."""
    from phalanx.head.certs import TLSRequest
    from phalanx.tls import is_loopback

    if plain or plain_anywhere:
        if cert or key or ca or names:
            fail("--plain-http serves without TLS: drop the --tls-* options, or --plain-http")
        if not is_loopback(host) and not plain_anywhere:
            fail(
                f"--plain-http on --host {host} would send tokens readable over the network; "
                "serve TLS (the default), or add --plain-http-anywhere on a trusted network"
            )
        return None
    if bool(cert) != bool(key):
        fail("--tls-cert and --tls-key go together")
    if ca and not cert:
        fail("--tls-ca names the CA of --tls-cert; without --tls-cert the head makes its own")
    return TLSRequest(cert=cert, key=key, ca=ca, names=tuple(names))


def _labels(values: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for value in values:
        key, sep, label = value.partition("=")
        if not sep or not key or not label:
            fail(f"--label {value!r}: expected KEY=VALUE, e.g. --label rack=r1")
        labels[key] = label
    return labels


def agent(
    head_url: Annotated[
        str,
        typer.Option(
            "--head",
            help="The head's URL, or several comma-separated (a leader and its standbys).",
            show_default=False,
        ),
    ],
    address: Annotated[
        str,
        typer.Option(help="This node's address, as other nodes reach it.", show_default=False),
    ],
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="File holding the join token (else $PHALANX_JOIN_TOKEN). Never pass a "
            "token as an argument: every user on the machine can read it in `ps`.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(hidden=True, help="Refused: use --token-file or $PHALANX_JOIN_TOKEN."),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Node name (default: the hostname).", show_default=False)
    ] = None,
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port of the agent's API (0: any free one).")
    ] = 0,
    fake_gpus: Annotated[
        int | None,
        typer.Option(min=1, max=62, help="Pretend to have this many GPUs (no NVML needed)."),
    ] = None,
    gpu_model: Annotated[str, typer.Option(help="Model of the fake GPUs.")] = "H100",
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where the agent keeps logs and state (default: in the user's app dir).",
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(help="Topology label KEY=VALUE, repeatable (rack=r1, block=b1)."),
    ] = None,
    health_check: Annotated[
        list[Path] | None,
        typer.Option(
            help="NHC-style health-check script, repeatable: exit 0 is healthy; otherwise the "
            "first line of its output is reported and the head drains the node.",
            dir_okay=False,
        ),
    ] = None,
    health_interval: Annotated[
        float, typer.Option(help="Seconds between health-check runs (also their timeout).")
    ] = 30.0,
    cgroups: Annotated[
        bool,
        typer.Option(
            help="Confine each job in its own cgroup (memory, CPUs, pids, GPU devices); "
            "needs root and a mounted cgroup fs, else the agent says why it cannot."
        ),
    ] = True,
    cgroup_parent: Annotated[
        str, typer.Option(help="Parent cgroup of every agent's job cgroups.")
    ] = "phalanx",
    job_pids_max: Annotated[
        int, typer.Option(min=0, help="Processes and threads per job on this node (0: no limit).")
    ] = 8192,
    fake_gpu_dev_dir: Annotated[
        Path | None,
        typer.Option(
            help="Directory of the fake GPUs' device files nvidia0… (tests: made with mknod).",
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    ca_file: Annotated[
        Path | None,
        typer.Option(
            help="The head's CA certificate to pin (its STATE_DIR/tls/ca.crt; default: "
            "$PHALANX_CA_FILE, else the system's trust store).",
            envvar="PHALANX_CA_FILE",
            show_envvar=False,
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    max_outage: Annotated[
        float,
        typer.Option(
            min=0,
            max=7 * 86400,
            help="Keep jobs running through a head outage at most this long (the head's "
            "--max-outage caps it; 0: fence when the lease runs out).",
        ),
    ] = 720.0,
    telemetry_interval: Annotated[
        float,
        typer.Option(
            min=0.1,
            max=3600,
            help="Sample every GPU (and each job's CPU and memory) this often, in seconds.",
        ),
    ] = 10.0,
    telemetry_ship: Annotated[
        float,
        typer.Option(
            min=0.1,
            max=3600,
            help="Send the samples to the head this often, in seconds (and at once when a "
            "job ends here).",
        ),
    ] = 10.0,
    hpc_job_mapping_dir: Annotated[
        str | None,
        typer.Option(
            help="Keep dcgm-exporter's job-mapping files here (its --hpc-job-mapping-dir): a "
            "file per GPU index listing the ids of the jobs on that GPU. `%n`: the node's name.",
            show_default=False,
        ),
    ] = None,
    metrics_token_file: Annotated[
        Path | None,
        typer.Option(
            help="File holding the token that may scrape this agent's /metrics besides the "
            "head (e.g. one from `phalanx token create --scope metrics`).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    on_sigterm: Annotated[
        str,
        typer.Option(
            help="What SIGTERM means: `stop` ends the jobs here and exits; `leave` (an agent "
            "run as a Slurm job) drains the node and has its jobs noticed, checkpointed and "
            "requeued first, then exits (docs/slurm.md).",
        ),
    ] = "stop",
    leave_grace: Annotated[
        float,
        typer.Option(
            min=0,
            max=86400,
            help="With --on-sigterm leave: seconds the jobs get to checkpoint and requeue "
            "before the agent exits anyway (keep it below Slurm's KillWait).",
        ),
    ] = 60.0,
) -> None:
    """Run an agent on this server: join the head, run the jobs it assigns (blocks)."""
    import logging

    from phalanx.agent.main import AgentConfig, AgentError, run_agent

    # Timestamped lines (its joining, outages, fencing); without this only warnings showed,
    # without a time. httpx would log every heartbeat at INFO.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    if on_sigterm not in ("stop", "leave"):
        fail(f"--on-sigterm must be `stop` or `leave` (got {on_sigterm!r})")
    join_token = _join_token(token, token_file)
    node_name = name or socket.gethostname()
    directory = state_dir or Path(typer.get_app_dir("phalanx")) / f"agent-{node_name}"
    config = AgentConfig(
        head_url=head_url,
        token=join_token,
        address=address,
        name=node_name,
        port=port,
        fake_gpus=fake_gpus,
        gpu_model=gpu_model,
        state_dir=directory,
        labels=_labels(label or []),
        health_checks=tuple(health_check or ()),
        health_interval_s=health_interval,
        use_cgroups=cgroups,
        cgroup_parent=cgroup_parent,
        job_pids_max=job_pids_max or None,
        gpu_dev_dir=fake_gpu_dev_dir,
        ca_file=ca_file,
        max_outage_s=max_outage,
        telemetry_interval_s=telemetry_interval,
        telemetry_ship_s=telemetry_ship,
        hpc_job_mapping_dir=hpc_job_mapping_dir,
        metrics_token_file=metrics_token_file,
        on_sigterm=on_sigterm,
        leave_grace_s=leave_grace,
    )
    try:
        run_agent(config)
    except AgentError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        pass


JOIN_TOKEN_ENV = "PHALANX_JOIN_TOKEN"


def _join_token(argument: str | None, path: Path | None) -> str:
    """The join token from --token-file, else $PHALANX_JOIN_TOKEN; never from an argument
    (other users see a process's arguments in `ps` and /proc)."""
    if argument is not None:
        fail(
            "--token is refused: a token on the command line is visible to every user in "
            "`ps`. Pass it in a file (--token-file PATH, mode 0600) or in the environment "
            f"({JOIN_TOKEN_ENV}=…)"
        )
    if path is not None:
        try:
            value = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            fail(f"cannot read the join token file {path}: {exc.strerror}")
        if not value:
            fail(f"the join token file {path} is empty")
        return value
    value = os.environ.get(JOIN_TOKEN_ENV, "").strip()
    if not value:
        fail(
            f"no join token: pass --token-file PATH or set {JOIN_TOKEN_ENV} (the head writes "
            "one to STATE_DIR/join.token; `phalanx admin join-token create` makes more)"
        )
    return value


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def up(
    nodes: Annotated[int, typer.Option(min=1, max=253, help="Local agents to start.")] = 2,
    gpus_per_node: Annotated[int, typer.Option(min=1, max=62, help="Fake GPUs per agent.")] = 4,
    state_dir: Annotated[
        Path,
        typer.Option(help="Where the head and agents keep their state and logs.", file_okay=False),
    ] = Path("phalanx-state"),
    port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            envvar="PHALANX_UP_PORT",
            help="Head port (0: any free one; default also from $PHALANX_UP_PORT).",
        ),
    ] = 8265,
    db: Annotated[
        str | None,
        typer.Option(help="Database URL (default: SQLite in the state dir)."),
    ] = None,
    gpu_model: Annotated[str, typer.Option(help="Model of the fake GPUs.")] = "H100",
) -> None:
    """Start a head and local agents with fake GPUs, and point the client at them.

    Runs until Ctrl-C, then stops every process it started. While it runs, a process that
    dies does not stop the cluster: a dead agent is a failed node (its jobs are requeued on
    other nodes; `phalanx local start-node NODE` starts it again) and a dead head is
    restarted on the same state (running jobs go on). `phalanx local kill-node NODE`,
    `kill-head` and `add-node` try that on purpose; `phalanx local ps` lists the processes.

    The client config gets (or updates) a context named "local" (`--context NAME`: that
    name) and uses it; other contexts in it are kept.
    """
    from phalanx.cli.connect import selected_context
    from phalanx.client.config import ConfigError, check_context_name, save_context
    from phalanx.local.cluster import ClusterError, LocalCluster
    from phalanx.local.supervisor import Supervisor

    try:
        context = check_context_name(selected_context() or "local")
    except ConfigError as exc:
        fail(str(exc))
    signal.signal(signal.SIGTERM, _interrupt)
    # A shell starts background jobs with SIGINT ignored; `up` must still stop on it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cluster = LocalCluster(
        state_dir,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu_model=gpu_model,
        port=port or None,
        db_url=db,
    )
    agents = "1 agent" if nodes == 1 else f"{nodes} agents"
    typer.echo(f"starting a head and {agents} (state in {cluster.state_dir}) …")
    try:
        cluster.start()
    except ClusterError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        typer.echo("stopped")
        return
    supervisor = Supervisor(cluster, _say)
    try:
        supervisor.publish()  # `phalanx local …` works as soon as the banner says it is up
        ca = str(cluster.ca_file) if cluster.ca_file else None
        config = save_context(context, cluster.url, cluster.admin_token, ca=ca)
        typer.echo(
            f"Phalanx is up: head {cluster.url}, {nodes} nodes × {gpus_per_node} "
            f"fake {gpu_model} GPUs\n"
            f"{supervisor.describe()}\n"
            f"  admin token:   {cluster.admin_token_file}\n"
            f"  dashboard:     {cluster.head_url(0)}/ui/ (sign in with the admin token)\n"
            f"  client config: {config}, context {context!r} (phalanx commands now use "
            "this cluster)\n"
            "Try:\n"
            "  phalanx nodes\n"
            f"  phalanx submit -N {nodes} --gpus-per-node {gpus_per_node} --wait -- "
            "python -c \"import os; print('rank', os.environ['RANK'])\"\n"
            "  phalanx queue;  phalanx history;  phalanx logs JOBID\n"
            "  phalanx local kill-node 127.0.0.3   # a node failure: its jobs move\n"
            "Ctrl-C stops everything."
        )
        while True:
            time.sleep(0.5)
            supervisor.step()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup
        typer.echo("stopping …")
    except ClusterError as exc:
        supervisor.stop()
        cluster.stop()
        fail(str(exc), code=1)
    finally:
        supervisor.stop()
        cluster.stop()
    typer.echo("stopped")


def _say(message: str) -> None:
    """A line of `up`'s running commentary, with the time (it runs for hours)."""
    typer.echo(f"{time.strftime('%H:%M:%S')} {message}")
