"""`make demo`: the Philly Oct–Nov 2017 window on its 11 VCs under several policies.

Prints a comparison table, writes out/demo/summary.json and the PNG plots.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path

from rich.console import Console

from phalanx.sim.engine import SimConfig
from phalanx.sim.layout import parse_vc_nodes, per_vc
from phalanx.sim.plots import plot_all
from phalanx.sim.report import summary_table
from phalanx.sim.runner import Scenario, run
from phalanx.sim.workload import read_philly

# A published per-VC layout for this window (8-GPU nodes, each VC simulated on its own).
PHILLY_VCS = (
    "6214e9=64,7f04ca=32,11cb48=16,b436b2=64,ee9e8c=64,e13805=16,"
    "6c71a0=32,2869ce=16,ed69ec=8,103959=8,0e4a51=32"
)
WINDOW = (datetime(2017, 10, 1), datetime(2017, 12, 1))
POLICIES = ("fifo", "priority", "las", "sjf", "srtf")


def find_trace() -> Path:
    """philly.csv from $PHALANX_TRACES or the shared/ folder beside the checkout."""
    env = os.environ.get("PHALANX_TRACES")
    roots = [Path(env)] if env else []
    repo = Path(__file__).resolve().parents[2]
    roots += [repo.parent / "shared" / "traces", repo / "shared" / "traces"]
    for root in roots:
        path = root / "philly_pollux" / "philly.csv"
        if path.is_file():
            return path
    raise FileNotFoundError(
        "philly.csv not found; set PHALANX_TRACES to the folder holding philly_pollux/"
    )


def main() -> int:
    console = Console()
    try:
        trace = find_trace()
    except FileNotFoundError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    vcs = parse_vc_nodes(PHILLY_VCS)
    workload = read_philly(trace, WINDOW[0], WINDOW[1], list(vcs))
    scenario = Scenario.per_vc(per_vc(vcs, gpus_per_node=8), workload)
    console.print(
        f"[bold]Phalanx scheduler demo[/bold]: {scenario.jobs:,} Philly jobs "
        f"({WINDOW[0]:%Y-%m-%d} – {WINDOW[1]:%Y-%m-%d}) on {len(vcs)} virtual clusters, "
        f"{sum(vcs.values()) * 8:,} GPUs, under {', '.join(POLICIES)}"
    )
    configs = {p: SimConfig(policy=p) for p in POLICIES}
    outcomes = run(scenario, configs, report=lambda line: console.print(f"  done: {line}"))
    summaries = {label: o.summary for label, o in outcomes.items()}
    console.print(summary_table(summaries, "Philly Oct–Nov 2017, 11 VCs"))
    out = Path("out/demo")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
    paths = plot_all({label: o.results for label, o in outcomes.items()}, out)
    console.print("wrote " + ", ".join(str(p) for p in [out / "summary.json", *paths]))
    fifo, sjf = summaries["fifo"], summaries["sjf"]
    console.print(
        f"FIFO queues jobs {fifo['avg_queue_s'] / max(sjf['avg_queue_s'], 1e-9):.1f}× longer "
        f"than SJF on average; non-clairvoyant LAS gets avg JCT "
        f"{summaries['las']['avg_jct_s'] / 3600:.2f} h vs FIFO {fifo['avg_jct_s'] / 3600:.2f} h."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
