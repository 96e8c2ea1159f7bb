"""Chaos, long form: the fault-tolerance invariants under minutes of random failures.

    python bench/chaos.py --minutes 10 --seed 3

Starts a real local cluster (head + --nodes agents × --gpus-per-node fake GPUs, a short
lease: heartbeat 0.5 s, lease 2 s, requeue margin 1 s, kill grace 2 s). For --minutes,
checkpointing ledger jobs (phalanx.testing.workload: 1 or 2 nodes × 1 or 2 GPUs, 15–50
steps of 0.1 s) stream in while a driver seeded by --seed crashes nodes (agent and job
processes SIGKILLed, agent restarted later), freezes agents past the lease (SIGSTOP …
SIGCONT), SIGKILLs single ranks, SIGKILLs and restarts the head, and injects GPU faults
(XID 79: the node drains and is resumed later; XID 13). Then it lets jobs finish, cancels
what is left and checks, from the head's answers and the ranks' own ledgers:
  accounted      every accepted job is known to the head, once, and ended or queued;
  never_twice    no two epochs of a job (nor two processes of a rank) alive at once;
  no_step_back   every run resumed at its last checkpoint, and CD jobs ran every step;
  gpu_exclusive  no GPU of a node held by two jobs at once.
Prints one JSON object (counts, each invariant's result and its first violations, the
event logs of the jobs involved, the timeline of the chaos); exit 1 if an invariant broke.
The state dir (logs, ledgers) is kept when something broke, or with --keep.

    python bench/chaos.py --operations                 # ~5 min: routine operations

--operations runs the long form of tests/e2e/test_operations_chaos.py instead
(phalanx.testing.operations): a cluster of 3 nodes on a throwaway PostgreSQL with a
standby head, the head's default settings (heartbeat 2 s, lease 8 s, requeue margin 2 s,
kill grace 5 s), long ledger jobs on every node and short ones streaming in; after
--baseline s of jobs alone, in order (--only to choose): the leading head kill -9ed and
started again --outage s later (60), the leader SIGSTOPped for --outage s, the leader
kill -9ed so that the standby takes over, and each node's agent upgraded in turn to a
newer release (API 1.99). Checks 0 jobs killed (every job ends CD in its first epoch,
one process per rank) and the four invariants; per operation its timings and the jobs it
killed. Baselines: the short jobs' submit-to-end time before the operations
(turnaround_ratio: during / before) and the lease (outage_vs_lease: how many leases the
head was away without a job fenced).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from phalanx.testing.chaos import ChaosConfig, run_chaos
from phalanx.testing.operations import OPERATIONS, OperationsConfig, run_operations


def main() -> int:
    """Run the chaos; 0 when every invariant held, 1 otherwise."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the chaos runs")
    parser.add_argument("--seed", type=int, default=0, help="seeds the actions and the jobs")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus-per-node", type=int, default=2)
    parser.add_argument("--fault-every", type=float, default=3.0, help="mean s between faults")
    parser.add_argument("--submit-every", type=float, default=0.8, help="mean s between jobs")
    parser.add_argument("--settle", type=float, default=60.0, help="s for jobs to end after")
    parser.add_argument("--dir", default=None, help="state dir (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the state dir")
    parser.add_argument(
        "--operations", action="store_true", help="routine operations instead of random faults"
    )
    parser.add_argument("--outage", type=float, default=60.0, help="--operations: head away, s")
    parser.add_argument("--baseline", type=float, default=30.0, help="--operations: jobs alone")
    parser.add_argument("--only", default=",".join(OPERATIONS), help="--operations: which")
    args = parser.parse_args()
    if args.operations:
        return operations(parser, args)
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    config = ChaosConfig(
        seed=args.seed,
        duration_s=args.minutes * 60,
        settle_s=args.settle,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        fault_every_s=args.fault_every,
        submit_every_s=args.submit_every,
    )
    state = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="phalanx-chaos-"))
    try:
        report = run_chaos(state, config, say=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as exc:
        parser.error(str(exc))
    result = {
        "benchmark": "chaos",
        **report.to_json(),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "date": datetime.date.today().isoformat(),
    }
    return finish(result, report.ok, state, args)


def operations(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The routine operations' long form; 0 when no job was killed and every invariant held."""
    config = OperationsConfig(
        operations=tuple(o for o in args.only.split(",") if o),
        heartbeat_s=2.0,  # the head's defaults, which operators run
        lease_s=8.0,
        requeue_margin_s=2.0,
        kill_grace_s=5.0,
        outage_s=args.outage,
        baseline_s=args.baseline,
        settle_s=args.settle,
        seed=args.seed,
    )
    state = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="phalanx-ops-"))
    try:
        report = run_operations(state, config, say=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as exc:
        parser.error(str(exc))
    result = {
        "benchmark": "chaos-operations",
        **report.to_json(),
        "baseline": "short jobs' submit-to-end before the operations; the lease",
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "date": datetime.date.today().isoformat(),
    }
    return finish(result, report.ok, state, args)


def finish(result: dict[str, object], ok: bool, state: Path, args: argparse.Namespace) -> int:
    """Print the JSON; remove a temporary state dir unless something broke or --keep."""
    if ok and not args.keep and args.dir is None:
        shutil.rmtree(state, ignore_errors=True)
        result["state_dir"] = None
    print(json.dumps(result, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
