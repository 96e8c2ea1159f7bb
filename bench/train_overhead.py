"""phalanx.train's DDP training loop against a plain hand-written DDP loop, side by side.

What it measures: wall time per optimizer step of the same GPT (preset "small": 4 blocks,
d=128, seq 256, byte vocabulary; 0.9M parameters), the same global batch, AdamW, LR
schedule and gradient clipping, under DistributedDataParallel on gloo (CPU), in the same
processes, interleaved:

* runtime — `Trainer.train_step()` of phalanx.train with ParallelConfig() (plain DDP),
  which adds its data loader, per-step preemption poll (an async all-reduce), throughput
  meter and checkpoint poll (no checkpoint directory: nothing is saved);
* baseline — the loop a person writes by hand: index a random batch, forward, loss,
  backward, clip_grad_norm_, AdamW step, LambdaLR step on a `DistributedDataParallel`.

Each of --rounds rounds times --steps step(s) of one loop then of the other (the order
alternates between rounds; the ranks meet at a barrier around each timing), after
--warmup steps of each. overhead_ratio = median step time of the runtime / median step
time of the baseline (target ≤ 1.02): medians, because other work on a shared machine
lands in random rounds; also the ratio of the means and of this process's CPU time
(time.process_time, which other processes do not inflate).

Run:  .venv/bin/python bench/train_overhead.py            (spawns --world processes itself)
      .venv/bin/python bench/train_overhead.py --help
Prints one JSON object on stdout (rank 0); progress on stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    """Flags; the defaults finish in well under a minute on 2 CPU cores."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world", type=int, default=2, help="processes (DDP ranks)")
    p.add_argument("--preset", default="small")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--steps", type=int, default=1, help="steps of each loop per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    return p.parse_args()


def spawn(args: argparse.Namespace) -> int:
    """Start --world copies of this script as ranks; relay rank 0's JSON."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(args.world):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(args.world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(args.world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS=str(args.threads),
            PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, *sys.argv[1:]],
                env=env,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                text=True,
            )
        )
    out, _ = procs[0].communicate()
    codes = [p.wait() for p in procs]
    sys.stdout.write(out)
    return max(abs(c) for c in codes)


def rank_main(args: argparse.Namespace) -> None:
    """One DDP rank: build both loops on identical models, time them interleaved."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import phalanx.train as pt
    from phalanx.train.trainer import cosine_schedule, default_optimizer

    torch.set_num_threads(args.threads)
    rt = pt.init(pt.ParallelConfig())
    cfg = pt.preset(args.preset)
    data = pt.ByteDataset.generated(cfg.seq_len, n_bytes=1 << 20)
    steps_total = args.warmup + args.rounds * args.steps + 10
    train_cfg = pt.TrainConfig(steps=steps_total, global_batch=args.global_batch, log_every=10**9)

    torch.manual_seed(0)
    trainer = pt.Trainer(pt.GPT(cfg), rt, data, train_cfg)
    trainer.resume()

    torch.manual_seed(0)
    model = DistributedDataParallel(pt.GPT(cfg), process_group=rt.mesh["dp"].get_group())
    opt = default_optimizer(train_cfg)(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_schedule(train_cfg))
    local = args.global_batch // rt.world_size
    gen = torch.Generator().manual_seed(rt.rank)

    def hand_step() -> None:
        idx = torch.randint(0, data.num_samples, (local,), generator=gen)
        x, y = data.batch(idx)
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward is untyped
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()

    def timed(step: Any, n: int) -> tuple[float, float]:
        dist.barrier(group=rt.control_group)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            step()
        dist.barrier(group=rt.control_group)
        return time.perf_counter() - wall, time.process_time() - cpu

    timed(trainer.train_step, args.warmup)
    timed(hand_step, args.warmup)
    runtime: list[tuple[float, float]] = []
    hand: list[tuple[float, float]] = []
    for r in range(args.rounds):
        order = [(trainer.train_step, runtime), (hand_step, hand)]
        for step, bucket in order if r % 2 == 0 else reversed(order):
            bucket.append(timed(step, args.steps))
        if rt.is_main and r % 10 == 9:
            print(f"{r + 1} rounds", file=sys.stderr)
    trainer.close()
    if rt.is_main:
        run_wall = [a[0] / args.steps for a in runtime]
        hand_wall = [b[0] / args.steps for b in hand]
        ratio = statistics.median(run_wall) / statistics.median(hand_wall)
        result = {
            "benchmark": "train_overhead",
            "overhead_ratio": round(ratio, 4),
            "mean_time_ratio": round(sum(run_wall) / sum(hand_wall), 4),
            "cpu_time_ratio": round(sum(a[1] for a in runtime) / sum(b[1] for b in hand), 4),
            "runtime_step_ms": round(statistics.median(run_wall) * 1e3, 2),
            "baseline_step_ms": round(statistics.median(hand_wall) * 1e3, 2),
            "target_ratio": 1.02,
            "meets_target": ratio <= 1.02,
            "world_size": rt.world_size,
            "model": args.preset,
            "params": sum(p.numel() for p in model.module.parameters()),
            "global_batch": args.global_batch,
            "seq_len": cfg.seq_len,
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "threads_per_rank": args.threads,
            "device": "cpu (gloo)",
            "torch": torch.__version__,
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
            "date": datetime.date.today().isoformat(),
        }
        print(json.dumps(result))
    rt.shutdown()


def main() -> None:
    """Spawn the ranks, or be one."""
    args = parse_args()
    if "RANK" not in os.environ:
        sys.exit(spawn(args))
    rank_main(args)


if __name__ == "__main__":
    main()
