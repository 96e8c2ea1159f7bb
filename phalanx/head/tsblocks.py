"""Telemetry blocks: a node's samples as numpy arrays, packed compactly for the store.

A raw block holds N sampling instants of G GPUs of one node (arrays G×N, GPU-major so
each GPU's series is contiguous and compresses well), plus the job CPU/memory readings
taken with them. A rollup block holds the same GPUs bucketed by minute or hour (mean and
max utilisation, peak memory, energy, the job holding the GPU, samples). `pack` writes any
block as fixed-width integers (times and energy delta-encoded) under zlib; `unpack` reads
it back exactly (to the stored precision: 0.1% utilisation, 1 MiB, 0.1 W, 0.1 °C, 1 J).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

# Any dtype at the type level: numpy's arithmetic widens dtypes in ways mypy cannot follow;
# the comments say what each array holds.
F64 = npt.NDArray[Any]
I64 = npt.NDArray[Any]
I32 = npt.NDArray[Any]

_MAGIC = b"PXT1"
_HOUR_S = 3600.0
_U16_NONE, _U32_NONE, _I16_NONE = 65535, 2**32 - 1, -32768


@dataclass
class RawBlock:
    """Samples of one node. Float arrays hold NaN where a value is unknown; `job` 0 and
    `epoch` -1 mean no job held the GPU."""

    times: F64  # N, head clock, ascending
    gpus: I32  # G GPU indices
    util: F64  # G×N %
    memory: F64  # G×N MiB
    power: F64  # G×N W
    temperature: F64  # G×N °C
    energy: F64  # G×N J, cumulative per GPU
    job: I32  # G×N
    epoch: I32  # G×N
    # Job CPU/memory readings: one row each
    u_job: I32
    u_epoch: I32
    u_time: F64
    u_cores: F64
    u_cpus: I32
    u_memory: F64

    @property
    def n(self) -> int:
        return int(self.times.shape[0])

    def window(self, t0: float, t1: float) -> RawBlock:
        """The samples with t0 ≤ time < t1 (and the usage readings likewise)."""
        return self.select(
            (self.times >= t0) & (self.times < t1), (self.u_time >= t0) & (self.u_time < t1)
        )

    def select(self, s: npt.NDArray[np.bool_], u: npt.NDArray[np.bool_]) -> RawBlock:
        """The samples where `s` holds and the usage readings where `u` does."""
        return RawBlock(
            self.times[s],
            self.gpus,
            self.util[:, s],
            self.memory[:, s],
            self.power[:, s],
            self.temperature[:, s],
            self.energy[:, s],
            self.job[:, s],
            self.epoch[:, s],
            self.u_job[u],
            self.u_epoch[u],
            self.u_time[u],
            self.u_cores[u],
            self.u_cpus[u],
            self.u_memory[u],
        )


def concat(blocks: list[RawBlock]) -> list[RawBlock]:
    """Blocks in time order, merged where they list the same GPUs."""
    out: list[RawBlock] = []
    for b in sorted(blocks, key=lambda b: float(b.times[0]) if b.n else 0.0):
        if out and np.array_equal(out[-1].gpus, b.gpus):
            a = out[-1]
            out[-1] = RawBlock(
                np.concatenate([a.times, b.times]),
                a.gpus,
                *(
                    np.concatenate([x, y], axis=1)
                    for x, y in zip(
                        (a.util, a.memory, a.power, a.temperature, a.energy, a.job, a.epoch),
                        (b.util, b.memory, b.power, b.temperature, b.energy, b.job, b.epoch),
                        strict=True,
                    )
                ),
                *(
                    np.concatenate([x, y])
                    for x, y in zip(
                        (a.u_job, a.u_epoch, a.u_time, a.u_cores, a.u_cpus, a.u_memory),
                        (b.u_job, b.u_epoch, b.u_time, b.u_cores, b.u_cpus, b.u_memory),
                        strict=True,
                    )
                ),
            )
        else:
            out.append(b)
    return out


@dataclass
class RollupBlock:
    """GPUs of one node bucketed by `bucket_s`: bucket b covers [starts[b], +bucket_s)."""

    bucket_s: float
    starts: F64  # B
    gpus: I32  # G
    mean_util: F64  # G×B (NaN: no sample)
    max_util: F64  # G×B
    max_memory: F64  # G×B
    energy: F64  # G×B J used in the bucket
    job: I32  # G×B the job holding the GPU at the bucket's last sample (0: none)
    samples: I32  # G×B samples behind the bucket


def rollup(block: RawBlock, bucket_s: float, before: F64 | None = None) -> RollupBlock:
    """Bucket a raw block by `bucket_s` seconds (aligned to multiples of it). `before`:
    each GPU's energy counter at the sample just before the block (the previous hour's
    last), so the energy used across the boundary is counted too."""
    g = block.gpus.shape[0]
    if not block.n:
        empty = np.zeros((g, 0))
        return RollupBlock(
            bucket_s, np.zeros(0), block.gpus, empty, empty, empty, empty,
            np.zeros((g, 0), np.int32), np.zeros((g, 0), np.int32),
        )  # fmt: skip
    keys = np.floor(block.times / bucket_s).astype(np.int64)
    uniq, first = np.unique(keys, return_index=True)
    bounds = [*first.tolist(), block.n]
    b = len(uniq)
    mean = np.full((g, b), np.nan)
    mx = np.full((g, b), np.nan)
    mem = np.full((g, b), np.nan)
    energy = np.zeros((g, b))
    job = np.zeros((g, b), np.int32)
    count = np.zeros((g, b), np.int32)
    steps = energy_steps(block.energy)
    if before is not None and before.shape == (g,):
        first = block.energy[:, 0] - before
        steps[:, 0] = np.where(np.isnan(first) | (first < 0), 0.0, first)
    for k in range(b):
        lo, hi = bounds[k], bounds[k + 1]
        u = block.util[:, lo:hi]
        has = ~np.isnan(u)
        count[:, k] = has.sum(axis=1)
        with np.errstate(all="ignore"):
            mean[:, k] = np.where(
                count[:, k] > 0, np.nansum(u, axis=1) / np.maximum(1, count[:, k]), np.nan
            )
            mx[:, k] = np.where(count[:, k] > 0, np.nanmax(np.where(has, u, -1.0), axis=1), np.nan)
            m = block.memory[:, lo:hi]
            mem[:, k] = np.where(
                (~np.isnan(m)).any(axis=1),
                np.nanmax(np.where(np.isnan(m), -1.0, m), axis=1),
                np.nan,
            )
        energy[:, k] = steps[:, lo:hi].sum(axis=1)
        job[:, k] = block.job[:, hi - 1]
    return RollupBlock(bucket_s, uniq * bucket_s, block.gpus, mean, mx, mem, energy, job, count)


def rollup_of_rollup(r: RollupBlock, bucket_s: float) -> RollupBlock:
    """Coarser buckets from finer ones (minutes → hours), weighting means by samples."""
    g = r.gpus.shape[0]
    keys = np.floor(r.starts / bucket_s).astype(np.int64)
    uniq, first = np.unique(keys, return_index=True)
    bounds = [*first.tolist(), r.starts.shape[0]]
    b = len(uniq)
    mean = np.full((g, b), np.nan)
    mx = np.full((g, b), np.nan)
    mem = np.full((g, b), np.nan)
    energy = np.zeros((g, b))
    job = np.zeros((g, b), np.int32)
    count = np.zeros((g, b), np.int32)
    for k in range(b):
        lo, hi = bounds[k], bounds[k + 1]
        n = r.samples[:, lo:hi]
        count[:, k] = n.sum(axis=1)
        with np.errstate(all="ignore"):
            weighted = np.nansum(np.where(n > 0, r.mean_util[:, lo:hi] * n, 0.0), axis=1)
            mean[:, k] = np.where(count[:, k] > 0, weighted / np.maximum(1, count[:, k]), np.nan)
            mx[:, k] = _nanmax(r.max_util[:, lo:hi])
            mem[:, k] = _nanmax(r.max_memory[:, lo:hi])
        energy[:, k] = r.energy[:, lo:hi].sum(axis=1)
        job[:, k] = r.job[:, hi - 1]
    return RollupBlock(bucket_s, uniq * bucket_s, r.gpus, mean, mx, mem, energy, job, count)


def _nanmax(a: F64) -> F64:
    has = (~np.isnan(a)).any(axis=1)
    return np.where(has, np.nanmax(np.where(np.isnan(a), -np.inf, a), axis=1), np.nan)


def energy_steps(energy: F64) -> F64:
    """Energy used between each sample and the one before it, per GPU (G×N; the first
    sample's step is 0; a counter that went back, a driver reload, counts 0)."""
    steps = np.zeros_like(energy)
    if energy.shape[1] > 1:
        d = np.diff(energy, axis=1)
        steps[:, 1:] = np.where(np.isnan(d) | (d < 0), 0.0, d)
    return steps


def split_hours(b: RawBlock) -> list[RawBlock]:
    """The block cut at hour boundaries: a raw chunk never spans two hours."""
    if not b.n:
        return []
    first = math.floor(float(b.times[0]) / _HOUR_S)
    last = math.floor(float(b.times[-1]) / _HOUR_S)
    if first == last:
        return [b]
    return [
        part for h in range(first, last + 1) if (part := b.window(h * _HOUR_S, (h + 1) * _HOUR_S)).n
    ]


def dedupe(b: RawBlock) -> RawBlock:
    """Samples at distinct times only (a reader may see a block both buffered and stored)."""
    if b.n < 2 or bool(np.all(np.diff(b.times) > 0)):
        return b
    _, keep = np.unique(b.times, return_index=True)
    sel = np.zeros(b.n, dtype=bool)
    sel[keep] = True
    seen: set[tuple[float, int]] = set()
    u_sel = np.zeros(b.u_time.shape[0], dtype=bool)
    for i, key in enumerate(zip(b.u_time.tolist(), b.u_job.tolist(), strict=True)):
        if key not in seen:
            seen.add(key)
            u_sel[i] = True
    return b.select(sel, u_sel)


# ----------------------------------------------------------------------------- codec
def _q(a: F64, scale: float, dtype: type[np.generic], none: int) -> npt.NDArray[np.generic]:
    """Quantise floats (NaN: `none`)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(a), none, np.round(a * scale)).astype(dtype)


def _dq(a: npt.NDArray[np.generic], scale: float, none: int) -> F64:
    f = a.astype(np.float64)
    return np.where(a == none, np.nan, f / scale)


def _delta(a: I64) -> I64:
    out = a.copy()
    if out.ndim == 1 and out.shape[0] > 1:
        out[1:] = np.diff(a)
    elif out.ndim == 2 and out.shape[1] > 1:
        out[:, 1:] = np.diff(a, axis=1)
    return out


def _undelta(a: I64) -> I64:
    return np.cumsum(a, axis=a.ndim - 1)


def _pack(arrays: dict[str, npt.NDArray[np.generic]], level: int = 6) -> bytes:
    meta = [(k, a.dtype.str, list(a.shape)) for k, a in arrays.items()]
    head = json.dumps(meta, separators=(",", ":")).encode()
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays.values())
    return _MAGIC + struct.pack("<I", len(head)) + zlib.compress(head + body, level)


def _unpack(data: bytes) -> dict[str, npt.NDArray[np.generic]]:
    if data[:4] != _MAGIC:
        raise ValueError("not a telemetry block")
    (n,) = struct.unpack("<I", data[4:8])
    raw = zlib.decompress(data[8:])
    meta = json.loads(raw[:n])
    out: dict[str, npt.NDArray[np.generic]] = {}
    at = n
    for name, dtype, shape in meta:
        dt = np.dtype(dtype)
        size = int(np.prod(shape)) * dt.itemsize
        out[name] = np.frombuffer(raw[at : at + size], dtype=dt).reshape(shape).copy()
        at += size
    return out


def _energy_int(e: F64) -> I64:
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(e), -1, np.round(e)).astype(np.int64)


def pack_raw(b: RawBlock) -> bytes:
    return _pack(
        {
            "t": _delta(np.round(b.times * 1000).astype(np.int64)),
            "g": b.gpus.astype(np.int16),
            "u": _q(b.util, 10, np.uint16, _U16_NONE),
            "m": _q(b.memory, 1, np.uint32, _U32_NONE),
            "p": _q(b.power, 10, np.uint32, _U32_NONE),
            "c": _q(b.temperature, 10, np.int16, _I16_NONE),
            "e": _delta(_energy_int(b.energy)),
            "j": b.job.astype(np.int32),
            "k": b.epoch.astype(np.int32),
            "uj": b.u_job.astype(np.int32),
            "uk": b.u_epoch.astype(np.int32),
            "ut": np.round(b.u_time * 1000).astype(np.int64),
            "uc": _q(b.u_cores, 1000, np.uint32, _U32_NONE),
            "un": b.u_cpus.astype(np.int32),
            "um": _q(b.u_memory, 1, np.uint32, _U32_NONE),
        }
    )


def unpack_raw(data: bytes) -> RawBlock:
    a = _unpack(data)
    e = _undelta(a["e"].astype(np.int64)).astype(np.float64)
    return RawBlock(
        _undelta(a["t"].astype(np.int64)) / 1000.0,
        a["g"].astype(np.int32),
        _dq(a["u"], 10, _U16_NONE),
        _dq(a["m"], 1, _U32_NONE),
        _dq(a["p"], 10, _U32_NONE),
        _dq(a["c"], 10, _I16_NONE),
        np.where(e < 0, np.nan, e),
        a["j"].astype(np.int32),
        a["k"].astype(np.int32),
        a["uj"].astype(np.int32),
        a["uk"].astype(np.int32),
        a["ut"].astype(np.float64) / 1000.0,
        _dq(a["uc"], 1000, _U32_NONE),
        a["un"].astype(np.int32),
        _dq(a["um"], 1, _U32_NONE),
    )


def pack_rollup(r: RollupBlock) -> bytes:
    return _pack(
        {
            "s": np.array([r.bucket_s]),
            "t": _delta(np.round(r.starts).astype(np.int64)),
            "g": r.gpus.astype(np.int16),
            "a": _q(r.mean_util, 10, np.uint16, _U16_NONE),
            "x": _q(r.max_util, 10, np.uint16, _U16_NONE),
            "m": _q(r.max_memory, 1, np.uint32, _U32_NONE),
            "e": np.round(r.energy).astype(np.int64),
            "j": r.job.astype(np.int32),
            "n": r.samples.astype(np.int32),
        }
    )


def unpack_rollup(data: bytes) -> RollupBlock:
    a = _unpack(data)
    return RollupBlock(
        float(a["s"][0]),
        _undelta(a["t"].astype(np.int64)).astype(np.float64),
        a["g"].astype(np.int32),
        _dq(a["a"], 10, _U16_NONE),
        _dq(a["x"], 10, _U16_NONE),
        _dq(a["m"], 1, _U32_NONE),
        a["e"].astype(np.float64),
        a["j"].astype(np.int32),
        a["n"].astype(np.int32),
    )
