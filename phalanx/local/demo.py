"""`make demo`: a local cluster (2 nodes × 4 fake GPUs), one 2-node data-parallel job, live.

Starts a real head and two real agents (127.0.0.2 and 127.0.0.3), submits a gloo
data-parallel job over both nodes through the REST API, shows its state and rank 0's
progress while it runs, and ends with a summary. Everything is torn down at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from phalanx.api.models import JobDetail, JobSpec
from phalanx.api.states import TERMINAL_JOB_STATES
from phalanx.api.usage import IdlePolicySpec
from phalanx.client.api import PhalanxClient
from phalanx.local.cluster import LocalCluster

FINAL = TERMINAL_JOB_STATES


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"


def workload(steps: int, state_dir: Path) -> list[str]:
    """Real training (phalanx.train's reference GPT, DDP over 4 ranks on 2 nodes) when run
    from a checkout; the plain gloo data-parallel workload otherwise."""
    if EXAMPLE.exists():
        return [
            sys.executable,
            str(EXAMPLE),
            "--preset",
            "tiny",
            "--steps",
            str(steps),
            "--log-every",
            "10",
            "--checkpoint-dir",
            str(state_dir / "checkpoints"),
            "--checkpoint-every",
            "20",
        ]
    return [sys.executable, "-m", "phalanx.local.demo_workload", "--steps", str(steps)]


def status(detail: JobDetail, progress: str, elapsed: float) -> Table:
    job = detail.job
    table = Table(title="Phalanx demo: 2-node data-parallel job", show_header=False)
    table.add_row("job", f"{job.id} ({job.name})")
    table.add_row("state", f"{job.state}" + (f" ({job.reason})" if job.reason else ""))
    where = ", ".join(f"{p.node} GPUs {p.gpus}" for p in job.placement) or "-"
    table.add_row("placement", where)
    table.add_row("progress (rank 0)", progress or "starting…")
    if detail.progress:
        p = detail.progress[0]
        loss = "-" if p.loss is None else f"{p.loss:.4f}"
        rate = "-" if p.tokens_per_s is None else f"{p.tokens_per_s:,.0f}"
        table.add_row("reported to the head", f"step {p.step}, loss {loss}, {rate} tokens/s")
    table.add_row("elapsed", f"{elapsed:.1f} s")
    return table


# Beside the training job, two jobs whose fake GPUs the dashboard shows as busy and idle
# (phalanx/agent/fakeload.py): a job declares its GPUs' utilisation in its environment.
SIDE_JOBS = (
    ("busy-sweep", "85"),  # a job that keeps its GPUs busy
    ("idle-notebook", "0"),  # a job that holds GPUs and does nothing with them
)
IDLE_WINDOW_S = 20.0  # the demo team's idle window, so a flag appears within the demo


def side_jobs(client: PhalanxClient, state_dir: Path) -> list[int]:
    ids = []
    for name, util in SIDE_JOBS:
        spec = JobSpec(
            name=name,
            command=["sleep", "3600"],
            workdir=str(state_dir),
            nodes=1,
            gpus_per_node=1,
            env={"PHALANX_FAKE_GPU_UTIL": util},
        )
        ids.append(client.submit(spec).job_ids[0])
    return ids


def login_link(cluster: LocalCluster) -> str:
    """The dashboard's sign-in link: the token rides in the URL's fragment, which the
    browser never sends to the server (the login page's script signs in with it)."""
    return f"{cluster.head_url(0)}/ui/login#token={cluster.admin_token}"


def summary(client: PhalanxClient, job_id: int, side: list[int], console: Console) -> None:
    """What the head measured: the training job's efficiency, the idle GPUs it flagged and
    today's accounting."""
    stats = client.job_stats(job_id)
    util = "-" if stats.mean_util_pct is None else f"{stats.mean_util_pct:.0f}%"
    energy = "-" if stats.energy_j is None else f"{stats.energy_j / 3600:.2f} Wh"
    console.print(
        f"  efficiency (phalanx jobstats {job_id}): {stats.gpus_total} GPUs, mean utilisation "
        f"{util}, energy {energy}"
    )
    for note in stats.notes:
        console.print(f"    note: {note}")
    for flag in client.idle_gpus().gpus:
        console.print(
            f"  idle GPU flagged: {flag.node} GPU {flag.index} of job {flag.job_id} "
            f"({flag.idle_s:.0f} s at ~0%)"
        )
    for job in side:
        detail = client.job(job).job
        console.print(f"  side job {job} ({detail.name}): {detail.state}")


def run(state_dir: Path, steps: int, console: Console, keep: bool) -> int:
    console.print(f"[bold]Starting a head and 2 agents[/] (state in {state_dir}) …")
    agent_args = ["--telemetry-interval", "2", "--telemetry-ship", "2"]
    with LocalCluster(state_dir, nodes=2, gpus_per_node=4, agent_args=agent_args) as cluster:
        client: PhalanxClient = cluster.client()
        for node in client.nodes().nodes:
            console.print(f"  node {node.name}: {len(node.gpus)} × {node.gpus[0].model}")
        client.set_idle_policy(
            "default", IdlePolicySpec(action="notify", window_s=IDLE_WINDOW_S, grace_s=600)
        )
        console.print(f"  dashboard: {login_link(cluster)}", soft_wrap=True)
        console.print(
            "    (the link signs you in as admin; the head's certificate is its own CA's: "
            f"{cluster.ca_file})"
        )
        side = side_jobs(client, state_dir)
        console.print(
            f"Submitted jobs {side[0]} (busy GPU) and {side[1]} (idle GPU: flagged after "
            f"{IDLE_WINDOW_S:g} s)"
        )
        spec = JobSpec(
            name="dp-demo",
            command=workload(steps, state_dir),
            workdir=str(state_dir),
            nodes=2,
            gpus_per_node=2,
            env={"OMP_NUM_THREADS": "1"},
        )
        job_id = client.submit(spec).job_ids[0]
        console.print(f"Submitted job {job_id}: 2 nodes × 2 GPUs, torchrun launcher, gloo")
        console.print(f"  {' '.join(spec.command or [])}")
        t0 = time.monotonic()
        offset, progress, lines = 0, "", []
        with Live(console=console, refresh_per_second=8) as live:
            while True:
                detail = client.job(job_id)
                if detail.job.placement:
                    chunk = client.logs(job_id, 0, "stdout", offset)
                    offset = chunk.next_offset
                    lines += [ln for ln in chunk.data.splitlines() if ln.strip()]
                    progress = lines[-1] if lines else progress
                live.update(status(detail, progress, time.monotonic() - t0))
                if detail.job.state in FINAL:
                    break
                if time.monotonic() - t0 > 300:
                    client.cancel(job_id)
                time.sleep(0.25)
        job = detail.job
        console.print()
        console.print("[bold]Summary[/]")
        console.print(f"  state {job.state}, exit {job.exit_code}")
        run_s = (job.end_time or 0) - (job.start_time or 0)
        console.print(
            f"  queued {(job.start_time or 0) - job.submit_time:.2f} s, ran {run_s:.1f} s"
        )
        for event in detail.events:
            console.print(f"  {event.time - job.submit_time:7.3f} s  {event.kind}: {event.message}")
        for line in lines[-2:]:
            console.print(f"  rank 0: {line}")
        wait_for_idle_flag(client, t0)
        summary(client, job_id, side, console)
        console.print(
            "By hand: `source .venv/bin/activate` (puts `phalanx` and the venv's python on "
            "PATH), `phalanx up --nodes 2 --gpus-per-node 4`, then in another terminal "
            "`phalanx submit -N 2 --gpus-per-node 2 -- python -m phalanx.local.demo_workload` "
            "and `phalanx queue`, `phalanx top`, `phalanx jobstats JOB`, `phalanx report` "
            "(README)."
        )
        if keep:
            console.print(
                f"[bold]The cluster stays up[/] for the dashboard ({login_link(cluster)}): "
                "press Enter to stop it.",
                soft_wrap=True,
            )
            with contextlib.suppress(EOFError, KeyboardInterrupt):
                input()
        for side_job in side:
            client.cancel(side_job)
        return 0 if job.state == "CD" else 1


def wait_for_idle_flag(client: PhalanxClient, t0: float) -> None:
    """The idle job's GPU is flagged IDLE_WINDOW_S after it started (plus a sample and a
    shipment): wait for it when the training ended sooner, at most a minute."""
    deadline = t0 + IDLE_WINDOW_S + 60
    while time.monotonic() < deadline and not client.idle_gpus().gpus:
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument(
        "--keep",
        action=argparse.BooleanOptionalAction,
        default=sys.stdin.isatty(),
        help="keep the cluster up after the job, for the dashboard, until Enter "
        "(default: when run from a terminal)",
    )
    args = parser.parse_args()
    console = Console()
    if args.state_dir is not None:
        raise SystemExit(run(args.state_dir.resolve(), args.steps, console, args.keep))
    with tempfile.TemporaryDirectory(prefix="phalanx-demo-") as tmp:
        raise SystemExit(run(Path(tmp), args.steps, console, args.keep))


if __name__ == "__main__":
    main()
