"""Start latency of a job process as another Unix user vs as the agent's own user.

    sudo python bench/launch_as_user.py [--user phxtest-bob] [--n 200]

Runs the agent's real ProcessManager.start (root agent) `--n` times each way, interleaved:
- own: the job runs as the agent's user (no wrapper; the agent opens the log files);
- as_user: the job runs as `--user` (the agent creates its log files owned by it, and a
  /bin/sh wrapper, already that user, enters the working directory and opens an -o file
  before it execs the command).
- as_user_shim: as as_user, under the shim that records the exit status for an agent
  restarted meanwhile (phalanx/agent/shim.py: what every rank and step task runs under).
Latency is from the start call to the job's command running: the command is `date +%s%N`,
whose own clock reading is compared with the wall clock before the call. Prints one JSON
object with p50/p99 in milliseconds for each and the ratios to own.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from phalanx.agent.identity import RunAs, resolve
from phalanx.agent.processes import ProcessManager


def _once(
    pm: ProcessManager,
    key: str,
    d: Path,
    run_as: RunAs | None,
    output: Path | None,
    status: Path | None = None,
) -> int:
    """Nanoseconds from start() to the job's command reading the clock."""
    out, err = d / f"{key}.out", d / f"{key}.err"
    t0 = time.time_ns()
    pm.start(
        key,
        ["date", "+%s%N"],
        env={"PATH": "/usr/bin:/bin"},
        cwd=str(d),
        stdout=out,
        stderr=err,
        run_as=run_as,
        outputs=(output, None),
        status=status,
    )
    while (s := pm.get(key)) is not None and s.running:
        time.sleep(0.001)
    text = (output or out).read_text().strip()
    if not text.isdigit():
        raise SystemExit(f"the job did not run: {text!r} {err.read_text()!r}")
    return int(text) - t0


def _stats(ns: list[int]) -> dict[str, float]:
    ms = sorted(x / 1e6 for x in ns)
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--user", default="phxtest-bob")
    p.add_argument("--n", type=int, default=200)
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: only a root agent starts jobs as another user")
    try:
        pwd.getpwnam(args.user)
    except KeyError:
        sys.exit(f"no Unix user {args.user!r}: useradd --system {args.user}")
    other = resolve(args.user, None, None)
    root = Path(tempfile.mkdtemp(prefix="phx-bench-launch-"))
    root.chmod(0o755)
    own_dir, user_dir = root / "own", root / "user"
    own_dir.mkdir()
    user_dir.mkdir()
    os.chown(user_dir, other.uid, other.gid)
    pm = ProcessManager()
    own: list[int] = []
    as_user: list[int] = []
    shimmed: list[int] = []
    status_dir = root / "status"  # the agent's, as procs/ in a launch dir
    status_dir.mkdir(mode=0o700)
    try:
        for i in range(args.n):
            own.append(_once(pm, f"own-{i}", own_dir, None, None))
            as_user.append(_once(pm, f"user-{i}", user_dir, other, user_dir / f"o-{i}"))
            shim_out = user_dir / f"s-{i}"
            status = status_dir / f"s-{i}"
            shimmed.append(_once(pm, f"shim-{i}", user_dir, other, shim_out, status))
    finally:
        pm.stop_all(1.0)
        shutil.rmtree(root, ignore_errors=True)
    a, b, c = _stats(own), _stats(as_user), _stats(shimmed)
    print(
        json.dumps(
            {
                "n": args.n,
                "user": args.user,
                "own": a,
                "as_user": b,
                "as_user_shim": c,
                "ratio_p50": round(b["p50_ms"] / a["p50_ms"], 2),
                "ratio_p99": round(b["p99_ms"] / a["p99_ms"], 2),
                "shim_ratio_p50": round(c["p50_ms"] / a["p50_ms"], 2),
                "shim_ratio_p99": round(c["p99_ms"] / a["p99_ms"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
