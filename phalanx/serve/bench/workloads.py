"""Benchmark workloads: prompts of given token lengths, and when each request is sent.

Prompts are built from a fixed list of common English words, each one token with its
leading space in the BPE tokenizers of the small models used here (SmolLM2, Llama), so a
prompt of N words is about N tokens; the engine's `usage.prompt_tokens` gives the exact
count in the results.

- `random`: input and output lengths uniform in [len·(1−range), len·(1+range)], as
  `vllm bench serve --dataset-name random` draws them.
- `prefix`: `prefix_len` shared tokens (one of `num_prefixes` prefixes) + a random suffix,
  like vLLM's prefix-repetition dataset.
- `mooncake`: the Mooncake conversation trace; every hash id maps to a fixed block of
  `512·scale` words, so equal ids give equal text and the trace's prefix sharing is kept.
- `azure-conv`, `azure-code`: the Azure 2023 traces' lengths.

Trace lengths are multiplied by `scale` (Mooncake's average input of 12,035 tokens is far
beyond what a small model on a CPU serves quickly); arrivals are Poisson at `rate`, or the
trace's own times multiplied by `time_scale`.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from phalanx.serve.bench import traces

WorkloadName = Literal["random", "prefix", "mooncake", "azure-conv", "azure-code"]
WORKLOADS: tuple[WorkloadName, ...] = ("random", "prefix", "mooncake", "azure-conv", "azure-code")

# One-token words (with the leading space) in BPE vocabularies of the small models.
_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we can has been if more when "
    "will would who so no time up out into than them only its new some could these two "
    "may first then do any like my now over such our man me even most made after also did "
    "many before must through back years where much your way well down should because "
    "each just those people how too little state good very make world still own see men "
    "work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three"
)
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt: str
    prompt_len: int  # tokens the workload meant (usage.prompt_tokens is the truth)
    max_tokens: int
    arrival_s: float  # when to send it, seconds after the run starts


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: WorkloadName = "random"
    num: int = 100
    seed: int = 0
    rate: float | None = None  # requests/s, Poisson; None with trace_time: the trace's times
    trace_time: bool = False
    time_scale: float = 1.0  # trace time × this (2: half the trace's rate)
    scale: float = 1.0  # trace lengths × this
    input_len: int = 128  # random / prefix
    output_len: int = 32
    range_ratio: float = 0.0
    prefix_len: int = 64
    num_prefixes: int = 4
    max_input: int = 32_768  # after scaling: longer prompts are cut to this
    max_output: int = 4096

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"unknown workload {self.name!r}; known: {', '.join(WORKLOADS)}")
        if not 1 <= self.num <= 1_000_000:
            raise ValueError("num must be between 1 and 1,000,000")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError("rate must be a positive number of requests/s")
        if self.trace_time and self.name in ("random", "prefix"):
            raise ValueError(
                "--trace-time needs a trace workload (mooncake, azure-conv, azure-code)"
            )
        if self.trace_time and self.rate is not None:
            raise ValueError("give a rate or trace time, not both")
        for key in ("time_scale", "scale"):
            value = getattr(self, key)
            if not (math.isfinite(value) and 0 < value <= 1000):
                raise ValueError(f"{key} must be in (0, 1000]")
        if not 0 <= self.range_ratio < 1:
            raise ValueError("range_ratio must be in [0, 1)")
        if min(self.input_len, self.output_len, self.prefix_len, self.num_prefixes) < 1:
            raise ValueError("lengths and num_prefixes must be at least 1")
        if self.max_input < 1 or self.max_output < 1:
            raise ValueError("max_input and max_output must be at least 1")


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


@functools.lru_cache(maxsize=4096)
def block_text(hash_id: int, count: int) -> str:
    """The fixed text of one Mooncake block: the same id always gives the same words."""
    return words(random.Random(f"block-{hash_id}"), count)


def build(spec: WorkloadSpec) -> list[BenchRequest]:
    """The requests of a workload, in sending order."""
    rng = random.Random(spec.seed)
    shapes: list[tuple[str, int, int]]
    times: Sequence[float] | None = None
    if spec.name == "random":
        shapes = []
        for _ in range(spec.num):
            n_in = _around(rng, spec.input_len, spec.range_ratio)
            shapes.append((words(rng, n_in), n_in, _around(rng, spec.output_len, spec.range_ratio)))
    elif spec.name == "prefix":
        prefixes = [words(rng, spec.prefix_len) for _ in range(spec.num_prefixes)]
        shapes = []
        for i in range(spec.num):
            suffix = max(1, spec.input_len - spec.prefix_len)
            text = prefixes[i % spec.num_prefixes] + " " + words(rng, suffix)
            shapes.append((text, spec.prefix_len + suffix, spec.output_len))
    else:
        rows = traces.load("mooncake" if spec.name == "mooncake" else spec.name, limit=spec.num)
        if not rows:
            raise ValueError(f"the {spec.name} trace has no rows")
        shapes = [_trace_prompt(row, spec, rng) for row in rows]
        times = [row.time_s * spec.time_scale for row in rows]
    if spec.trace_time:
        assert times is not None
        arrivals = list(times)
    else:
        arrivals = poisson_times(rng, spec.rate, len(shapes))
    return [
        BenchRequest(prompt=text, prompt_len=n_in, max_tokens=n_out, arrival_s=t)
        for (text, n_in, n_out), t in zip(shapes, arrivals, strict=True)
    ]


def poisson_times(rng: random.Random, rate: float | None, count: int) -> list[float]:
    """Send times of a Poisson process at `rate` (None: all at once, vLLM's rate inf)."""
    if rate is None:
        return [0.0] * count
    t, out = 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _around(rng: random.Random, length: int, ratio: float) -> int:
    lo, hi = max(1, math.floor(length * (1 - ratio))), math.ceil(length * (1 + ratio))
    return rng.randint(lo, hi)


def _trace_prompt(
    row: traces.TraceRow, spec: WorkloadSpec, rng: random.Random
) -> tuple[str, int, int]:
    n_in = min(spec.max_input, max(1, round(row.input_tokens * spec.scale)))
    n_out = min(spec.max_output, max(1, round(row.output_tokens * spec.scale)))
    if not row.hash_ids:
        return words(rng, n_in), n_in, n_out
    per_block = max(1, round(traces.MOONCAKE_BLOCK_TOKENS * spec.scale))
    parts: list[str] = []
    left = n_in
    for hash_id in row.hash_ids:
        if left <= 0:
            break
        take = min(per_block, left)
        # A partial last block is the start of the full block: still shared by equal ids.
        parts.append(" ".join(block_text(hash_id, per_block).split()[:take]))
        left -= take
    if left > 0:
        parts.append(words(rng, left))
    return " ".join(parts), n_in, n_out
