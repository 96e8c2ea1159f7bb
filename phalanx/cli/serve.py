"""`phalanx serve …`: serving deployments (apply a YAML file, list, show, scale, delete)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from phalanx.cli.connect import HeadOpt, JsonOpt, TokenOpt, connect
from phalanx.cli.output import STATE_STYLE, duration, fail, print_json, print_table, timestamp
from phalanx.cli.serve_stats import stats_lines

if TYPE_CHECKING:
    from phalanx.api.serving import DeploymentInfo, DeploymentSpec

serve_app = typer.Typer(
    help="Serving deployments: inference engines as replica pools (docs/serving.md).",
    no_args_is_help=True,
)
MAX_FILE_BYTES = 1024 * 1024


def load_spec(path: Path) -> DeploymentSpec:
    """A deployment file (YAML, the keys of DeploymentSpec) as a spec; a bad file exits 2
    with one line that names the file and the field."""
    import yaml
    from pydantic import ValidationError

    from phalanx.api.models import validation_detail
    from phalanx.api.serving import DeploymentSpec

    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        fail(f"{path}: {e.strerror or e}")
    if len(raw) > MAX_FILE_BYTES:
        fail(f"{path}: larger than {MAX_FILE_BYTES} bytes; is it a deployment file?")
    try:
        data: Any = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError:
        fail(f"{path}: not UTF-8 text")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        fail(f"{path}:{where}: not valid YAML: {problem}")
    if not isinstance(data, dict):
        fail(f"{path}: expected a mapping of deployment fields (name, engine, model, pools, …)")
    try:
        return DeploymentSpec.model_validate(data)
    except ValidationError as e:
        fail(f"{path}: {validation_detail(e.errors(), limit=3)}")


@serve_app.command("apply")
def apply(
    file: Annotated[Path, typer.Argument(help="The deployment file (YAML).", show_default=False)],
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Create or update a deployment from FILE (a changed spec rolls out replica by
    replica; only a changed replica count scales)."""
    from phalanx.client.serving import ServeClient

    spec = load_spec(file)
    with connect(head, token) as client:
        info = ServeClient(client).apply(spec)
    if json_out:
        print_json(info)
        return
    pools = ", ".join(f"{p.role} {p.ready}/{p.desired} ready" for p in info.pools)
    typer.echo(f"deployment {info.spec.name} generation {info.generation}: {pools}")


@serve_app.command("ls")
def ls(json_out: JsonOpt = False, head: HeadOpt = None, token: TokenOpt = None) -> None:
    """List the deployments you may see."""
    from phalanx.client.serving import ServeClient

    with connect(head, token) as client:
        deps = ServeClient(client).list()
    if json_out:
        print_json(deps)
        return
    now = time.time()
    rows = []
    for d in deps.deployments:
        ready = sum(p.ready for p in d.pools)
        desired = sum(p.desired for p in d.pools)
        rows.append(
            [
                d.spec.name,
                d.owner,
                d.spec.engine,
                d.spec.served_model_name or d.spec.name,
                "+".join(p.role for p in d.pools),
                f"{ready}/{desired}",
                str(d.generation),
                duration(max(0.0, now - d.created_at)),
            ]
        )
    columns = [
        ("NAME", False),
        ("OWNER", False),
        ("ENGINE", False),
        ("MODEL", False),
        ("POOLS", False),
        ("READY", True),
        ("GEN", True),
        ("AGE", True),
    ]
    print_table(columns, rows)


@serve_app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="The deployment.", show_default=False)],
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """A deployment: its pools, each replica (job, state, URL, ready) and failures."""
    from phalanx.client.serving import ServeClient

    with connect(head, token) as client:
        info = ServeClient(client).get(name)
    if json_out:
        print_json(info)
        return
    _print_info(info)


def _print_info(info: DeploymentInfo) -> None:
    s = info.spec
    typer.echo(f"deployment {s.name}  owner {info.owner}  generation {info.generation}")
    typer.echo(f"  engine {s.engine} ({s.engine_path})  model {s.model}")
    typer.echo(f"  served as {s.served_model_name or s.name}  router {s.router.policy}")
    typer.echo(f"  created {timestamp(info.created_at)}")
    if info.autoscaler:
        typer.echo(f"  autoscaled by {info.autoscaler}")
    for p in info.pools:
        line = f"  pool {p.role}: {p.ready}/{p.desired} ready"
        if p.failures:
            line += f", {p.failures} failure(s) in a row"
        typer.echo(line)
        if p.last_failure:
            typer.echo(f"    last failure: {p.last_failure}")
        if p.backoff_until is not None and p.backoff_until > time.time():
            typer.echo(f"    next replacement at {timestamp(p.backoff_until)}")
    for line in stats_lines(info):  # the routers' latest summaries (serve_stats.py)
        typer.echo(line)
    if not info.replicas:
        typer.echo("  no replicas")
        return
    rows = [
        [
            str(r.job_id),
            r.pool,
            str(r.generation),
            r.state,
            r.node or "",
            "retiring" if r.retiring else "yes" if r.ready else "no",
            r.url or "",
        ]
        for r in info.replicas
    ]
    columns = [
        ("JOBID", True),
        ("POOL", False),
        ("GEN", True),
        ("ST", False),
        ("NODE", False),
        ("READY", False),
        ("URL", False),
    ]
    print_table(columns, rows, styles={3: STATE_STYLE})


@serve_app.command("scale")
def scale(
    name: Annotated[str, typer.Argument(help="The deployment.", show_default=False)],
    replicas: Annotated[int, typer.Option("--replicas", min=0, max=1024, help="Replicas wanted.")],
    pool: Annotated[
        str, typer.Option("--pool", help="aggregated, prefill or decode.")
    ] = "aggregated",
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set a pool's replica count."""
    from phalanx.client.serving import ServeClient

    if pool not in ("aggregated", "prefill", "decode"):
        fail(f"--pool {pool!r}: expected aggregated, prefill or decode")
    with connect(head, token) as client:
        info = ServeClient(client).scale(name, pool, replicas)  # type: ignore[arg-type]
    if json_out:
        print_json(info)
        return
    status = next(p for p in info.pools if p.role == pool)
    typer.echo(f"deployment {name} pool {pool}: {status.desired} wanted, {status.ready} ready")


@serve_app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="The deployment.", show_default=False)],
    json_out: JsonOpt = False,
    head: HeadOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete a deployment; its replica jobs are cancelled."""
    import json

    from phalanx.client.serving import ServeClient

    with connect(head, token) as client:
        ServeClient(client).delete(name)
    if json_out:
        typer.echo(json.dumps({"deleted": name}))
        return
    typer.echo(f"deployment {name} deleted; its replicas are being cancelled")
