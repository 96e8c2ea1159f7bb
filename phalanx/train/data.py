"""Byte-level training data: text generated here (no downloads) and a resumable batch loader."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from phalanx.train.errors import TrainConfigError

_NAMES = ["Ada", "Ben", "Chen", "Dara", "Eli", "Fatma", "Goro", "Hana", "Ivo", "Jun", "Kira"]
_NOUNS = [
    "cat", "dog", "river", "lamp", "garden", "robot", "letter", "boat", "tree", "kettle",
    "window", "bridge", "cloud", "train", "violin", "market", "forest", "engine", "map",
]  # fmt: skip
_ADJS = [
    "small", "red", "quiet", "old", "bright", "heavy", "green", "strange", "warm", "tiny",
    "broken", "golden", "patient", "sleepy", "curious",
]  # fmt: skip
_VERBS = [
    "found", "painted", "carried", "followed", "watched", "fixed", "lost", "opened",
    "counted", "built", "visited", "remembered", "cleaned", "shared",
]  # fmt: skip
_PLACES = ["by the sea", "in the city", "under the bridge", "at the station", "near the hill"]
_TIMES = ["In the morning", "At night", "One day", "Later", "After the rain", "On Sunday"]


def _phrase(rng: random.Random) -> str:
    return f"the {rng.choice(_ADJS)} {rng.choice(_NOUNS)}"


def _sentence(rng: random.Random) -> str:
    who = rng.choice(_NAMES)
    kind = rng.randrange(5)
    if kind == 0:
        return f"{who} {rng.choice(_VERBS)} {_phrase(rng)} {rng.choice(_PLACES)}."
    if kind == 1:
        return f"{rng.choice(_TIMES)}, {who} {rng.choice(_VERBS)} {_phrase(rng)}."
    if kind == 2:
        a, b = rng.randrange(2, 10), rng.randrange(2, 10)
        return f"{who} counted {a} and {b} and said {a + b}."
    if kind == 3:
        return f"{_phrase(rng).capitalize()} was {rng.choice(_ADJS)}, so {who} smiled."
    other = rng.choice(_NAMES)
    return f"{who} and {other} {rng.choice(_VERBS)} {_phrase(rng)} together."


def generate_text(n_bytes: int = 1 << 19, seed: int = 0) -> str:
    """Deterministic pseudo-English stories, about n_bytes long (ASCII: one byte a char).

    Simple grammar with arithmetic facts, so a small model's loss falls visibly."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < n_bytes:
        story = " ".join(_sentence(rng) for _ in range(rng.randrange(3, 8))) + "\n"
        parts.append(story)
        size += len(story)
    return "".join(parts)[:n_bytes]


class ByteDataset:
    """A token stream cut into windows of seq_len + 1 bytes (inputs and shifted targets).

    Sample i is bytes [i·seq_len, i·seq_len + seq_len + 1): non-overlapping windows, so the
    dataset has (len − 1) // seq_len samples."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        if tokens.dim() != 1:
            raise TrainConfigError("tokens must be a 1-D tensor")
        self.tokens = tokens.to(torch.long)
        self.seq_len = seq_len
        self.num_samples = (len(tokens) - 1) // seq_len
        if self.num_samples < 1:
            raise TrainConfigError(
                f"{len(tokens)} tokens are too few for one sample of seq_len={seq_len}"
            )
        self._offsets = torch.arange(seq_len + 1)

    @classmethod
    def generated(cls, seq_len: int, n_bytes: int = 1 << 19, seed: int = 0) -> ByteDataset:
        """Over generate_text(n_bytes, seed)."""
        data = generate_text(n_bytes, seed).encode("ascii")
        return cls(torch.frombuffer(bytearray(data), dtype=torch.uint8), seq_len)

    @classmethod
    def from_file(cls, path: str | Path, seq_len: int) -> ByteDataset:
        """Over the bytes of a file (any text: UTF-8 bytes are the tokens, vocab 256)."""
        data = Path(path).read_bytes()
        return cls(torch.frombuffer(bytearray(data), dtype=torch.uint8), seq_len)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, each (len(indices), seq_len) int64, for these samples."""
        rows = self.tokens[indices[:, None] * self.seq_len + self._offsets]
        return rows[:, :-1], rows[:, 1:]


class BatchLoader:
    """Global batches in a seeded random order per epoch; each data-parallel rank takes its
    contiguous slice. Its position is checkpointable (state_dict / load_state_dict, DCP's
    Stateful protocol) and counted in global samples, so a resumed job, even on another
    number of ranks with the same global batch, reads exactly the batches an uninterrupted
    one would."""

    def __init__(
        self,
        dataset: ByteDataset,
        global_batch: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        device: torch.device | None = None,
    ) -> None:
        if global_batch % dp_size:
            raise TrainConfigError(
                f"global batch {global_batch} is not divisible by the {dp_size} "
                "data-parallel ranks (dp × fsdp)"
            )
        if global_batch > dataset.num_samples:
            raise TrainConfigError(
                f"global batch {global_batch} exceeds the {dataset.num_samples} samples"
            )
        self.dataset = dataset
        self.global_batch = global_batch
        self.local_batch = global_batch // dp_size
        self.dp_rank = dp_rank
        self.seed = seed
        self.device = device or torch.device("cpu")
        self.epoch = 0
        self.position = 0  # next sample within this epoch's order
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.dataset.num_samples, generator=gen)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (inputs, targets) of the next global batch, on the device."""
        if self.position + self.global_batch > self.dataset.num_samples:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        start = self.position + self.dp_rank * self.local_batch
        x, y = self.dataset.batch(self._order[start : start + self.local_batch])
        self.position += self.global_batch
        if self.device.type == "cuda":
            return (
                x.pin_memory().to(self.device, non_blocking=True),
                y.pin_memory().to(self.device, non_blocking=True),
            )
        return x, y

    def state_dict(self) -> dict[str, Any]:
        """Position in global samples (identical on every rank)."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position."""
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation(self.epoch)
