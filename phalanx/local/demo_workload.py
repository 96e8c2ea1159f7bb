"""The demo's data-parallel job: least squares on synthetic data, gradients all-reduced over gloo.

Every rank holds a shard of the data; each step all-reduces the gradient (real
torch.distributed traffic between the nodes) and applies it. Rank 0 prints progress.
Runs under `phalanx submit` (torchrun launcher), plain `torchrun`, or as one process.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(1)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    truth = torch.randn(args.dim, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.samples // world, args.dim, generator=g)
    y = x @ truth + 0.01 * torch.randn(x.shape[0], generator=g)
    w = torch.zeros(args.dim, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        opt.zero_grad()
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves backward untyped
        assert w.grad is not None
        if distributed:
            dist.all_reduce(w.grad)
            w.grad /= world
            dist.all_reduce(loss.detach())
        if rank == 0 and (step % 10 == 0 or step == args.steps):
            avg = loss.item() / world if distributed else loss.item()
            print(f"step {step}/{args.steps} loss {avg:.6f} world {world}", flush=True)
        opt.step()
    error = (w.detach() - truth).norm().item()
    if rank == 0:
        rate = args.steps / (time.perf_counter() - t0)
        print(f"done: {args.steps} steps, {rate:.0f} steps/s, |w - w*| = {error:.4f}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Done and reported: leave without the interpreter's teardown, in which gloo's C++
    # threads can outlive the process group and abort the process (SIGABRT, "terminate
    # called without an active exception") after the work succeeded — seen under load.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
