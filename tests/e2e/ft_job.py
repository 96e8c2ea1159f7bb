"""A checkpointing job for the fault-tolerance tests: counts steps, checkpoints each one to
PHALANX_CHECKPOINT_DIR, and appends its life to a ledger (one JSON line per event), from
which the tests check resumption and that no two copies ever ran at once.

argv: STEPS DELAY_S [--exit-on-notice] [--fail-rank R] [--report]
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

STEPS, DELAY = int(sys.argv[1]), float(sys.argv[2])
ARGS = sys.argv[3:]
RANK = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
LEDGER = Path(os.environ.get("LEDGER", "ledger.jsonl"))
CKPT = Path(os.environ["PHALANX_CHECKPOINT_DIR"]) / f"rank{RANK}.step"
CKPT.parent.mkdir(parents=True, exist_ok=True)
EPOCH = int(os.environ["PHALANX_EPOCH"])
START = int(CKPT.read_text()) if CKPT.exists() else 0
notices: list[int] = []


def log(event: str, step: int, **extra: object) -> None:
    line = {
        "event": event,
        "epoch": EPOCH,
        "rank": RANK,
        "pid": os.getpid(),
        "node": os.environ.get("SLURMD_NODENAME"),
        "restart": int(os.environ.get("PHALANX_RESTART_COUNT", "0")),
        "step": step,
        "t": time.time(),
        **extra,
    }
    with LEDGER.open("a") as f:  # one write per line: O_APPEND keeps lines whole
        f.write(json.dumps(line) + "\n")


def on_signal(signum: int, _frame: object) -> None:
    notices.append(signum)


for name in ("SIGUSR1", "SIGUSR2"):
    signal.signal(getattr(signal, name), on_signal)

log("begin", START, deadline=os.environ.get("PHALANX_PREEMPT_DEADLINE"))
step = START
while step < STEPS:
    time.sleep(DELAY)
    step += 1
    tmp = CKPT.with_suffix(".tmp")
    tmp.write_text(str(step))
    tmp.replace(CKPT)  # atomic: a kill never leaves a half-written checkpoint
    log("step", step)
    if "--report" in ARGS:
        import httpx

        head, job = os.environ["PHALANX_HEAD"], os.environ["PHALANX_JOB_ID"]
        token = os.environ["PHALANX_STEP_TOKEN"]
        body = {"rank": RANK, "step": step, "time": time.time()}
        headers = {"Authorization": f"Bearer {token}"}
        httpx.post(f"{head}/v1/jobs/{job}/progress", json=body, headers=headers, timeout=10)
        if step >= 2:
            ARGS.remove("--report")  # then goes silent: a hang
    while notices:
        signum = notices.pop(0)
        log("signal", step, signal=signal.Signals(signum).name)
        if "--exit-on-notice" in ARGS:
            log("end", step, code=75)
            sys.exit(75)
    if "--fail-rank" in ARGS and int(ARGS[ARGS.index("--fail-rank") + 1]) == RANK:
        log("end", step, code=3)
        sys.exit(3)
log("end", step, code=0)
