"""`phalanx serve router`: the OpenAI-compatible router in front of a deployment's replicas
(docs/serving-router.md)."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from phalanx.api.serving import Engine, Policy
from phalanx.serve.router.autoscale import AutoscaleOptions, autoscale_job
from phalanx.serve.router.server import RouterOptions, RouterSetupError, serve

POLICIES = ("round-robin", "least-load", "power-of-two", "kv-aware", "kv-aware-simple")
ENGINES: tuple[Engine, ...] = ("llama.cpp", "vllm", "custom")


def _read_secret(path: Path | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise typer.BadParameter(f"cannot read {what} from {path}: {e.strerror}") from None
    if not text:
        raise typer.BadParameter(f"{path} is empty (expected {what})")
    return text


def _rates(values: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for value in values:
        team, sep, rate = value.partition("=")
        try:
            number = float(rate)
        except ValueError:
            number = -1.0
        if not sep or not team or not number > 0 or number == float("inf"):
            raise typer.BadParameter(f"--rate-limit takes TEAM=RPS with RPS > 0 (got {value!r})")
        out[team] = number
    return out


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise typer.BadParameter(f"--listen takes HOST:PORT (got {value!r})")
    return host.strip("[]") or "127.0.0.1", int(port)


def serve_router(
    listen: Annotated[str, typer.Option(help="HOST:PORT to serve the OpenAI API on.")] = (
        "127.0.0.1:8000"
    ),
    head: Annotated[
        str | None,
        typer.Option(
            help="The head's URL (endpoints, and client token checks); with --deployment, "
            "default: the client context's head and token, as other phalanx commands.",
            show_default=False,
        ),
    ] = None,
    deployment: Annotated[
        str | None, typer.Option(help="The deployment to route to.", show_default=False)
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="The router's own token (the deployment's owner's or an admin's); "
            "default: $PHALANX_TOKEN.",
            show_default=False,
        ),
    ] = None,
    ca_file: Annotated[
        Path | None,
        typer.Option(
            help="The head's CA certificate; default: $PHALANX_CA_FILE.", show_default=False
        ),
    ] = None,
    replica: Annotated[
        list[str] | None,
        typer.Option(
            help="A replica's URL instead of a deployment (repeatable).", show_default=False
        ),
    ] = None,
    prefill: Annotated[
        list[str] | None,
        typer.Option(
            help="A prefill replica's URL (repeatable; with --decode).", show_default=False
        ),
    ] = None,
    decode: Annotated[
        list[str] | None,
        typer.Option(
            help="A decode replica's URL (repeatable; with --prefill).", show_default=False
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help="With fixed replicas: llama.cpp, vllm or custom (default: custom, llama.cpp "
            "with --prefill/--decode).",
            show_default=False,
        ),
    ] = None,
    engine_key_file: Annotated[
        Path | None,
        typer.Option(
            help="With --replica: a file holding the engines' API key.", show_default=False
        ),
    ] = None,
    engine_key: Annotated[
        str | None,
        typer.Option(
            help="With --replica: the engines' API key (visible to `ps`; prefer the file).",
            show_default=False,
        ),
    ] = None,
    served_model_name: Annotated[
        str | None,
        typer.Option(
            help="With --replica: the model clients name (default: the replica's).",
            show_default=False,
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            help=f"One of {', '.join(POLICIES)} (default: the deployment's).", show_default=False
        ),
    ] = None,
    block_chars: Annotated[
        int | None,
        typer.Option(
            min=16, max=65536, help="Prefix index block size in characters.", show_default=False
        ),
    ] = None,
    slots: Annotated[
        int, typer.Option(min=1, max=1024, help="With --replica: slots per replica.")
    ] = 4,
    owner: Annotated[
        str | None,
        typer.Option(help="With --replica and --head: the user who may call.", show_default=False),
    ] = None,
    team: Annotated[
        str | None,
        typer.Option(help="With --replica and --head: the team that may call.", show_default=False),
    ] = None,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="Serve anyone who can reach the router (benches).")
    ] = False,
    rate_limit: Annotated[
        list[str] | None,
        typer.Option(help="TEAM=RPS, a team's request rate (repeatable).", show_default=False),
    ] = None,
    default_rate_limit: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Requests/s of teams without their own limit (default: none).",
            show_default=False,
        ),
    ] = None,
    max_body_bytes: Annotated[
        int, typer.Option(min=1024, max=256 * 1024 * 1024, help="Largest request body.")
    ] = 4 * 1024 * 1024,
    retries: Annotated[
        int, typer.Option(min=0, max=16, help="Other replicas tried when one fails.")
    ] = 2,
    max_in_flight: Annotated[
        int, typer.Option(min=1, max=1_000_000, help="Requests answered at once (more: 503).")
    ] = 4096,
    engine_poll: Annotated[
        float,
        typer.Option(
            min=0, max=3600, help="Seconds between scrapes of each replica's /metrics (0: never)."
        ),
    ] = 3.0,
    report_interval: Annotated[
        float,
        typer.Option(
            min=0, max=3600, help="Seconds between summaries sent to the head (0: never)."
        ),
    ] = 5.0,
    router_id: Annotated[
        str | None,
        typer.Option(
            help="Names this router's summaries at the head (default: HOST:PORT it listens on)."
        ),
    ] = None,
    autoscale: Annotated[
        bool,
        typer.Option(
            "--autoscale",
            help="Run the SLO autoscaler beside the router (head mode): pools with "
            "min/max replicas are scaled to hold their SLO. One acts per deployment (a "
            "lease on the head); other routers with --autoscale stand by.",
        ),
    ] = False,
    autoscale_interval: Annotated[
        float, typer.Option(min=0.1, max=3600, help="--autoscale: seconds between passes.")
    ] = 5.0,
    autoscale_window: Annotated[
        float, typer.Option(min=1, max=3600, help="--autoscale: seconds of measurements judged.")
    ] = 30.0,
    autoscale_up_cooldown: Annotated[
        float, typer.Option(min=0, max=86400, help="--autoscale: seconds between steps up.")
    ] = 10.0,
    autoscale_miss_cooldown: Annotated[
        float,
        typer.Option(
            min=0, max=86400, help="--autoscale: seconds after a step up before misses alone count."
        ),
    ] = 45.0,
    autoscale_down_cooldown: Annotated[
        float,
        typer.Option(
            min=0, max=86400, help="--autoscale: seconds after any change before a step down."
        ),
    ] = 60.0,
    autoscale_down_stable: Annotated[
        float,
        typer.Option(
            min=0, max=86400, help="--autoscale: seconds a pool must be idle enough to step down."
        ),
    ] = 30.0,
) -> None:
    """Serve the OpenAI API (`/v1/completions`, `/v1/chat/completions`, `/v1/models`) in
    front of a deployment's replicas, with Phalanx tokens, per-team rate limits and a
    routing policy; `/health` and Prometheus `/metrics` too."""
    if policy is not None and policy not in POLICIES:
        raise typer.BadParameter(f"--policy must be one of {', '.join(POLICIES)}")
    host, port = _listen(listen)
    token = _read_secret(token_file, "a token") or os.environ.get("PHALANX_TOKEN")
    ca = str(ca_file) if ca_file else os.environ.get("PHALANX_CA_FILE")
    if deployment is not None and (head is None or token is None):
        head, token, ca = _from_context(head, token, ca)
    options = RouterOptions(
        head=head,
        deployment=deployment,
        token=token,
        ca=ca,
        replicas=list(replica or []),
        prefill=list(prefill or []),
        decode=list(decode or []),
        engine=_engine(engine),
        engine_key=_read_secret(engine_key_file, "an API key") or engine_key,
        served_model_name=served_model_name,
        policy=_policy(policy),
        block_chars=block_chars,
        slots=slots,
        owner=owner,
        team=team,
        no_auth=no_auth,
        rate_limits=_rates(list(rate_limit or [])),
        default_rate=default_rate_limit,
        max_body_bytes=max_body_bytes,
        retries=retries,
        max_in_flight=max_in_flight,
        engine_poll_s=engine_poll,
        report_s=report_interval,
        router_id=router_id or f"{socket.gethostname()}:{port}",
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per token check otherwise
    try:
        background = []
        if autoscale:
            auto = AutoscaleOptions(
                interval_s=autoscale_interval,
                window_s=autoscale_window,
                up_cooldown_s=autoscale_up_cooldown,
                miss_cooldown_s=autoscale_miss_cooldown,
                down_cooldown_s=autoscale_down_cooldown,
                down_stable_s=autoscale_down_stable,
            )
            background.append(autoscale_job(options, port, auto))
        serve(options, host, port, background=background)
    except RouterSetupError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


def _from_context(
    head: str | None, token: str | None, ca: str | None
) -> tuple[str, str, str | None]:
    """A deployment's router with no --head/--token-file: the head, token and CA of the
    client context in use, as every `phalanx` command finds them."""
    from phalanx.cli.connect import selected_context
    from phalanx.client.config import ConfigError, resolve

    try:
        config = resolve(head, token, context=selected_context())
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    return config.head, config.token, ca or config.ca


def _engine(name: str | None) -> Engine | None:
    for e in ENGINES:
        if e == name:
            return e
    if name is not None:
        raise typer.BadParameter(f"--engine must be one of {', '.join(ENGINES)}")
    return None


def _policy(name: str | None) -> Policy | None:
    for p in POLICIES:
        if p == name:
            return p  # type: ignore[return-value]
    return None
