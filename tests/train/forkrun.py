"""Fork-server for the tests: import torch and phalanx.train once, fork one process per rank.

Each rank is a real process of its own (its own memory, gloo over TCP on 127.0.0.1),
forked before any torch op or thread exists, so the ranks of a job share only the
one-time import cost (seconds per process on a shared 2-core machine).

    python forkrun.py SPEC.json
    SPEC: {"world", "port", "argv", "logs", "env", "pids", "codes"}

Each child gets torchrun's variables, writes stdout and stderr to its log, runs `argv`
as __main__ and exits with its code; the parent writes the children's pids to `pids`
once forked and their exit codes (negative: killed by that signal) to `codes`.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from pathlib import Path

import torch.distributed.checkpoint  # the heavy imports, done once
import torch.distributed.fsdp
import torch.distributed.tensor.parallel  # noqa: F401

import phalanx.train.trainer  # noqa: F401


def _child(rank: int, world: int, port: int, argv: list[str], log: str, env: dict[str, str]) -> int:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    sys.argv = list(argv)
    try:
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    world, port = int(spec["world"]), int(spec["port"])
    argv = [str(a) for a in spec["argv"]]
    env = {str(k): str(v) for k, v in spec["env"].items()}
    for log in spec["logs"]:  # they exist once `pids` does: callers may read them at once
        Path(log).touch()
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            # os._exit: the parent's atexit handlers are not the child's to run.
            os._exit(_child(rank, world, port, argv, str(spec["logs"][rank]), env))
        pids.append(pid)
    tmp = Path(spec["pids"] + ".tmp")
    tmp.write_text(json.dumps(pids))
    tmp.replace(spec["pids"])
    codes = []
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
    Path(spec["codes"]).write_text(json.dumps(codes))


if __name__ == "__main__":
    main()
