"""The reference model: a decoder-only GPT (GPT-2 layout) that knows how to be parallelized."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from phalanx.train.errors import TrainConfigError
from phalanx.train.metrics import flops_per_token


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT. d_model must divide into n_head heads; seq_len is the context."""

    vocab_size: int = 256  # byte-level tokens
    seq_len: int = 256
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.0
    tie_embeddings: bool = True  # GPT-2 ties the output head to the token embedding

    @property
    def head_dim(self) -> int:
        """Q in the FLOPs formula: the width of one attention head."""
        return self.d_model // self.n_head


# GPT-2 small is 124M parameters with its 50257-token vocabulary (padded to 50304 here,
# as nanoGPT does, for efficient matmuls); byte-level data uses only the first 256 rows.
PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(vocab_size=256, seq_len=64, n_layer=2, n_head=2, d_model=32),
    "small": GPTConfig(vocab_size=256, seq_len=256, n_layer=4, n_head=4, d_model=128),
    "gpt2-small": GPTConfig(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12, d_model=768),
    "gpt-1b": GPTConfig(vocab_size=50304, seq_len=1024, n_layer=18, n_head=16, d_model=2048),
}


def preset(name: str, **overrides: object) -> GPTConfig:
    """A named GPTConfig (tiny, small, gpt2-small, gpt-1b), with fields overridden."""
    if name not in PRESETS:
        raise TrainConfigError(f"unknown model preset {name!r}; choose from {sorted(PRESETS)}")
    try:
        # dataclasses.replace checks the field names at run time.
        return replace(PRESETS[name], **overrides)  # type: ignore[arg-type]  # values: object
    except TypeError as exc:
        raise TrainConfigError(f"bad GPTConfig override: {exc}") from None


class Attention(nn.Module):
    """Causal self-attention; q, k, v are separate linears so each can be split by heads."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.dropout = cfg.dropout
        self.wq = nn.Linear(cfg.d_model, cfg.d_model)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq, d_model) → same shape."""
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_head / tp of them.
        q = self.wq(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, -1)
        out: torch.Tensor = self.resid_dropout(self.wo(y))
        return out


class MLP(nn.Module):
    """d → 4d → d with GELU."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq, d_model) → same shape."""
        out: torch.Tensor = self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))
        return out


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual attention, then residual MLP."""
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    """Decoder-only GPT: token + position embeddings, pre-LN blocks, final norm, head.

    What phalanx.train.parallelize needs from a model, this one provides: `layers` (a
    ModuleDict of the repeated blocks, keyed "0", "1", …: the units of activation
    checkpointing, compilation and FSDP, and where pipeline stages are cut), `tp_plan()`
    and `keep_only(...)` (prune to one pipeline stage, keeping parameter names).
    A stage without the embedding takes hidden states; one without the head returns them.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise TrainConfigError(f"d_model={cfg.d_model} is not divisible by n_head={cfg.n_head}")
        self.cfg = cfg
        self.wte: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe: nn.Embedding | None = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self._embeds = True  # False on a pipeline stage after the first
        self._tied_copy = False  # True on the first and last stage of a tied pipeline
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layer)})
        self.ln_f: nn.LayerNorm | None = nn.LayerNorm(cfg.d_model)
        self.head: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.head.weight = self.wte.weight

    def _init_weights(self) -> None:
        # GPT-2: N(0, 0.02); the projections into the residual stream scaled by 1/√(2L).
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln_f"):
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.cfg.n_layer))
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) → logits (batch, seq, vocab); or hidden states for stages."""
        if self._embeds and self.wte is not None and self.wpe is not None:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.wte(x) + self.wpe(pos))
        for block in self.layers.values():
            x = block(x)
        if self.ln_f is not None and self.head is not None:
            x = self.head(self.ln_f(x))
        return x

    def num_params(self) -> int:
        """Parameters, a tied weight counted once."""
        return sum(p.numel() for p in self.parameters())

    def matmul_params(self) -> int:
        """N of the FLOPs formula: parameters that multiply activations.

        The embedding tables are lookups, not matmuls: the position table never counts;
        the token table counts once when it is tied to the head (the head is a matmul),
        and not at all when the head has its own weight (counted as the head instead).
        """
        cfg = self.cfg
        n = self.num_params() - cfg.seq_len * cfg.d_model
        if not cfg.tie_embeddings:
            n -= cfg.vocab_size * cfg.d_model
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): see phalanx.train.metrics."""
        cfg = self.cfg
        return flops_per_token(
            self.matmul_params(), cfg.n_layer, cfg.n_head, cfg.head_dim, seq_len or cfg.seq_len
        )

    def tp_plan(self) -> dict[str, object]:
        """Megatron-style tensor parallelism: q/k/v and fc split by columns (heads), wo and
        proj by rows, so each block needs one all-reduce forward and one backward. The
        embeddings, norms and head stay replicated (their gradients are equal on every
        tensor-parallel rank, because the block outputs are)."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        plan: dict[str, object] = {}
        for name in self.layers:
            for col in ("attn.wq", "attn.wk", "attn.wv", "mlp.fc"):
                plan[f"layers.{name}.{col}"] = ColwiseParallel()
            for row in ("attn.wo", "mlp.proj"):
                plan[f"layers.{name}.{row}"] = RowwiseParallel()
        return plan

    def check_tp(self, tp: int) -> None:
        """Raise TrainConfigError unless tp divides the heads and the MLP width."""
        if self.cfg.n_head % tp:
            raise TrainConfigError(f"tp={tp} does not divide n_head={self.cfg.n_head}")

    def keep_only(self, layer_names: list[str], first: bool, last: bool) -> None:
        """Prune to one pipeline stage: these blocks, the embeddings if first, the head if
        last. Names stay as in the whole model, so checkpoints are interchangeable. A tied
        head keeps the token embedding weight on the last stage too; the pipeline keeps
        the two copies equal (see `pipeline_tied_parameters`)."""
        for name in list(self.layers):
            if name not in layer_names:
                del self.layers[name]
        self._embeds = first
        self._tied_copy = self.cfg.tie_embeddings and first != last and (first or last)
        if not first:
            self.wpe = None
            if not (last and self.cfg.tie_embeddings):
                self.wte = None
        if not last:
            self.ln_f = None
            self.head = None

    def pipeline_tied_parameters(self) -> list[str]:
        """Parameters this stage shares with another stage (the tied embedding, on the
        first and last stage): their gradients are summed across those stages."""
        return ["wte.weight"] if self._tied_copy else []
