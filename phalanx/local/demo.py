"""`make demo`: a local cluster (2 nodes × 4 fake GPUs), one 2-node data-parallel job, live.

Starts a real head and two real agents (127.0.0.2 and 127.0.0.3), submits a gloo
data-parallel job over both nodes through the REST API, shows its state and rank 0's
progress while it runs, and ends with a summary. Everything is torn down at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from phalanx.api.models import JobDetail, JobSpec
from phalanx.api.states import TERMINAL_JOB_STATES
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


def run(state_dir: Path, steps: int, console: Console) -> int:
    console.print(f"[bold]Starting a head and 2 agents[/] (state in {state_dir}) …")
    with LocalCluster(state_dir, nodes=2, gpus_per_node=4) as cluster:
        client: PhalanxClient = cluster.client()
        for node in client.nodes().nodes:
            console.print(f"  node {node.name}: {len(node.gpus)} × {node.gpus[0].model}")
        console.print(
            f"  dashboard {cluster.head_url(0)}/ui/ (sign in with the token in "
            f"{cluster.admin_token_file})"
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
        console.print(
            "By hand: `source .venv/bin/activate` (puts `phalanx` and the venv's python on "
            "PATH), `phalanx up --nodes 2 --gpus-per-node 4`, then in another terminal "
            "`phalanx submit -N 2 --gpus-per-node 2 -- python -m phalanx.local.demo_workload` "
            "and `phalanx queue`, `phalanx logs JOB -f`, `phalanx history` (README)."
        )
        return 0 if job.state == "CD" else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args()
    console = Console()
    if args.state_dir is not None:
        raise SystemExit(run(args.state_dir.resolve(), args.steps, console))
    with tempfile.TemporaryDirectory(prefix="phalanx-demo-") as tmp:
        raise SystemExit(run(Path(tmp), args.steps, console))


if __name__ == "__main__":
    main()
