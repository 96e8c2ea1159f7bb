"""The ledger job of the chaos tests and benchmarks (a checkpointing step counter that
writes its life as JSON lines), the ledger's reader, and the job's processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.tls import CA_PEM_ENV, client_context

DEADLINE_EXIT = 124


def command(steps: int, delay_s: float, *flags: str) -> list[str]:
    """argv running the ledger job: `steps` steps of `delay_s` seconds each.

    It is this file run as a script with only the standard library (it starts in tens of
    milliseconds). Each step sleeps, increments the step, checkpoints it atomically to
    `$PHALANX_CHECKPOINT_DIR/rank<R>.step`, then appends a `step` line to `$LEDGER`; a run
    begins from the checkpoint (its `begin` line carries the step it resumed from) and ends
    with an `end` line. Every line: event, job, epoch, rank, pid, node, gpus
    (CUDA_VISIBLE_DEVICES), restart, step, t (unix time). Optional environment:
    LEDGER_REPORT_S (post a progress report to the head at most this often) and
    LEDGER_DEADLINE (unix time after which the job exits 124 by itself: a safety net
    against processes that outlive a broken test). The `begin` line also carries
    `deadline` (PHALANX_PREEMPT_DEADLINE); SIGUSR1/SIGUSR2 are logged as `signal` lines at
    the next step boundary.

    `flags`: `--exit-on-notice` (exit 75, "requeue me", after logging a signal),
    `--fail-rank R` (rank R exits 3 after its first step), `--report-steps N` (report
    progress for the first N steps of each run, then go silent: a hang), `--hold PATH`
    (go on stepping past `steps` until PATH exists: a job that runs while a test acts),
    `--hurry-file PATH` (once PATH exists, the remaining steps do not sleep: a job that must
    outlast something of unknown length still ends at a known step, soon after it is told to).
    """
    return [sys.executable, str(Path(__file__).resolve()), str(steps), str(delay_s), *flags]


@dataclass(frozen=True)
class Life:
    """One process of one run (job, epoch, rank), as its ledger lines show it: alive at
    least from `first` to `last` (its own clock readings), on `node`, holding `gpus`."""

    job: int
    epoch: int
    rank: int
    pid: int
    node: str
    gpus: tuple[int, ...]
    first: float
    last: float
    begin_step: int | None  # the step it resumed from (None: its begin line is missing)
    last_step: int | None  # the last step it logged as checkpointed
    end_code: int | None  # its own exit code, when it logged one


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a ledger (a missing file is empty; a torn line is skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # only a writer killed mid-write leaves one; the next lines are whole
        if isinstance(entry, dict):
            out.append(entry)
    return out


def lives(entries: list[dict[str, Any]]) -> list[Life]:
    """Group ledger lines by process (job, epoch, rank, pid), in (job, epoch, rank) order."""
    groups: dict[tuple[int, int, int, int], list[dict[str, Any]]] = {}
    for e in entries:
        groups.setdefault((e["job"], e["epoch"], e["rank"], e["pid"]), []).append(e)
    out = []
    for (job, epoch, rank, pid), lines in sorted(groups.items()):
        times = [float(e["t"]) for e in lines]
        begins = [int(e["step"]) for e in lines if e["event"] == "begin"]
        steps = [int(e["step"]) for e in lines if e["event"] == "step"]
        ends = [int(e["code"]) for e in lines if e["event"] == "end"]
        gpus = str(lines[0].get("gpus") or "")
        out.append(
            Life(
                job=job,
                epoch=epoch,
                rank=rank,
                pid=pid,
                node=str(lines[0].get("node")),
                gpus=tuple(int(g) for g in gpus.split(",") if g.strip().isdigit()),
                first=min(times),
                last=max(times),
                begin_step=begins[0] if begins else None,
                last_step=max(steps) if steps else None,
                end_code=ends[-1] if ends else None,
            )
        )
    return out


# ----------------------------------------------------------------------------- its processes
def is_running(entry: dict[str, Any], head_url: str) -> bool:
    """Whether the process of a ledger line is alive and still that run's, of the head at
    `head_url` (a pid may have been reused since)."""
    env = _environ(int(entry["pid"]))
    want = (
        f"PHALANX_JOB_ID={entry['job']}",
        f"PHALANX_EPOCH={entry['epoch']}",
        f"PHALANX_HEAD={head_url}",
    )
    return env is not None and all(w.encode() in env for w in want)


def _environ(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def kill_job_processes(head_url: str) -> int:
    """SIGKILL every process started for the head at `head_url` (PHALANX_HEAD in its
    environment) that is still alive; how many there were."""
    want = f"PHALANX_HEAD={head_url}".encode()
    killed = 0
    for entry in os.listdir("/proc"):
        env = _environ(int(entry)) if entry.isdigit() else None
        if env is not None and want in env and int(entry) != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
    return killed


# ----------------------------------------------------------------------------- the job
def _main(argv: list[str]) -> int:
    steps, delay, flags = int(argv[0]), float(argv[1]), argv[2:]
    fail_rank = int(flags[flags.index("--fail-rank") + 1]) if "--fail-rank" in flags else None
    report_steps = int(flags[flags.index("--report-steps") + 1]) if "--report-steps" in flags else 0
    hold = Path(flags[flags.index("--hold") + 1]) if "--hold" in flags else None
    hurry = Path(flags[flags.index("--hurry-file") + 1]) if "--hurry-file" in flags else None
    notices: list[int] = []
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: notices.append(signum))
    env = os.environ
    rank = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
    ledger = Path(env.get("LEDGER", "ledger.jsonl"))
    ckpt = Path(env["PHALANX_CHECKPOINT_DIR"]) / f"rank{rank}.step"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    deadline = float(env.get("LEDGER_DEADLINE", "inf"))
    report_s = float(env["LEDGER_REPORT_S"]) if env.get("LEDGER_REPORT_S") else None
    fixed = {
        "job": int(env["PHALANX_JOB_ID"]),
        "epoch": int(env["PHALANX_EPOCH"]),
        "rank": rank,
        "pid": os.getpid(),
        "node": env.get("SLURMD_NODENAME"),
        "gpus": env.get("CUDA_VISIBLE_DEVICES", ""),
        "restart": int(env.get("PHALANX_RESTART_COUNT", "0")),
    }

    def log(event: str, step: int, **extra: object) -> None:
        line = {"event": event, **fixed, "step": step, "t": time.time(), **extra}
        # One write() per line on an O_APPEND file: concurrent ranks never interleave.
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)

    step = int(ckpt.read_text()) if ckpt.exists() else 0
    log("begin", step, deadline=env.get("PHALANX_PREEMPT_DEADLINE"))
    begun = step
    last_report = 0.0
    hurried = False
    while step < steps or (hold is not None and not hold.exists()):
        if time.time() > deadline:
            log("end", step, code=DEADLINE_EXIT)
            return DEADLINE_EXIT
        hurried = hurried or (hurry is not None and hurry.exists())
        if not hurried:
            time.sleep(delay)
        step += 1
        tmp = ckpt.with_name(f"{ckpt.name}.{os.getpid()}.tmp")
        tmp.write_text(str(step))
        tmp.replace(ckpt)  # atomic: a kill never leaves a half-written checkpoint
        log("step", step)
        if step - begun <= report_steps or (
            report_s is not None and time.monotonic() - last_report >= report_s
        ):
            last_report = time.monotonic()
            _report(rank, step)
        while notices:
            log("signal", step, signal=signal.Signals(notices.pop(0)).name)
            if "--exit-on-notice" in flags:
                log("end", step, code=75)
                return 75
        if rank == fail_rank:
            log("end", step, code=3)
            return 3
    log("end", step, code=0)
    return 0


def _report(rank: int, step: int) -> None:
    """POST a progress report with the job's step token (what phalanx.train does)."""
    import urllib.error
    import urllib.request

    env = os.environ
    body = json.dumps({"rank": rank, "step": step, "time": time.time()}).encode()
    request = urllib.request.Request(
        f"{env['PHALANX_HEAD']}/v1/jobs/{env['PHALANX_JOB_ID']}/progress",
        data=body,
        headers={
            "Authorization": f"Bearer {env['PHALANX_STEP_TOKEN']}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    # The head's TLS is pinned to the CA the agent passes in PHALANX_CA_PEM.
    context = client_context(env.get(CA_PEM_ENV))
    ssl_context = context if isinstance(context, ssl.SSLContext) else None
    # The head may be restarting: the next report tries again.
    with contextlib.suppress(urllib.error.URLError, OSError):
        urllib.request.urlopen(request, timeout=5, context=ssl_context).close()


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
