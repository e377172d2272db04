"""A small GPT (nanoGPT-style), written to be read top to bottom.

It is the reference model for actzip's experiments: a decoder-only transformer whose MLP activation
(``relu``, ``relu2`` or ``gelu``) and per-block activation checkpointing are switchable, so the
activations autograd saves can be studied and compressed. Pieces, in order: :class:`GPTConfig`,
:class:`CausalSelfAttention`, :class:`MLP`, :class:`Block`, :class:`GPT`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from actzip.memory.cache.rebuild import rebuild_saved, recompute

from actzip.compat import warn_once
from actzip.core.optim import make_optimizer
from actzip.errors import ConfigError

__all__ = ["GPTConfig", "CausalSelfAttention", "MLP", "Block", "GPT", "ACTIVATIONS"]


def _relu2(h: torch.Tensor) -> torch.Tensor:
    # Squared ReLU (Primer): as sparse as ReLU, but smooth at zero's right side.
    return F.relu(h).square()


#: MLP activations by config name.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "relu2": _relu2,
    "gelu": F.gelu,
}

# Named sizes; every other field keeps its default unless overridden.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=64),  # seconds on a CPU, for tests
    "small": dict(n_layer=4, n_head=4, n_embd=256, block_size=128),
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),
    # Four blocks at the width of a 7B model (Llama-2 7B: d=4096, 32 heads): per-token cost ratios of compute,
    # activation bytes and kernel time as at that scale, in a model that fits one GPU with room to spare.
    "d4096x4": dict(n_layer=4, n_head=32, n_embd=4096, block_size=1024, vocab_size=50304),
}


@dataclass
class GPTConfig:
    """Shape and behaviour of a :class:`GPT`. Checked on construction."""

    block_size: int = 256  # longest sequence the model accepts (size of the position table)
    vocab_size: int = 256  # 256: one token per byte, so no tokenizer is needed
    n_layer: int = 4  # number of transformer blocks
    n_head: int = 4  # attention heads per block; must divide n_embd
    n_embd: int = 256  # width of the residual stream
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio * n_embd
    activation: str = "relu2"  # MLP activation: one of ACTIVATIONS ("relu", "relu2", "gelu")
    bias: bool = False  # biases in Linear and LayerNorm; off is slightly faster and no worse
    dropout: float = 0.0  # dropout probability in [0, 1); 0 keeps runs deterministic
    checkpoint_blocks: bool = False  # recompute each block in backward instead of saving its activations
    # Keep no copy of the layer-norm outputs nor of the attention projection's input: backward makes them again
    # (a LayerNorm forward, a copy) from the norm inputs and the attention output, which it keeps anyway
    # (actzip.memory.rebuild; bit-identical). True: all of REBUILD_TARGETS; or a tuple of some of them
    # ("ln_2" alone: one LayerNorm forward more per block). Under an ActivationCache that compresses those
    # sources it saves nothing: the rebuild keeps them whole.
    rebuild_saved: bool | tuple[str, ...] = False
    tie_weights: bool = True  # share the token embedding with the output head (fewer params)
    # >0: with targets, run the output head and the loss over this many tokens at a time, each chunk's logits
    # recomputed in backward, so the step never holds the full (tokens x vocab) logits in float32; forward
    # then returns no logits. 0: the plain head (logits returned).
    loss_chunk: int = 0

    def __post_init__(self) -> None:
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "mlp_ratio"):
            value = getattr(self, name)
            # bool is an int subclass; True as a size is almost certainly a mistake.
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.loss_chunk, int) or isinstance(self.loss_chunk, bool) or self.loss_chunk < 0:
            raise ConfigError(f"GPTConfig.loss_chunk must be an int >= 0, got {self.loss_chunk!r}")
        for name in ("bias", "checkpoint_blocks", "tie_weights"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(f"GPTConfig.{name} must be a bool, got {value!r}")
        rebuild_targets(self.rebuild_saved)  # raises on a bad value
        if self.n_embd % self.n_head != 0:
            raise ConfigError(
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by GPTConfig.n_head ({self.n_head}) "
                "so every head gets the same width"
            )
        if self.activation not in ACTIVATIONS:
            raise ConfigError(
                f"GPTConfig.activation {self.activation!r} is unknown; choose one of {sorted(ACTIVATIONS)}"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not (
            0.0 <= self.dropout < 1.0
        ):
            raise ConfigError(f"GPTConfig.dropout must be a float in [0, 1), got {self.dropout!r}")

    @classmethod
    def of_size(cls, name: str, **overrides: Any) -> "GPTConfig":
        """A model size by name ("tiny", "small", "gpt2-124m", "d4096x4"), with fields replaced by ``overrides``."""
        if name not in SIZES:
            raise ConfigError(f"GPTConfig size {name!r} is unknown; known sizes: {sorted(SIZES)}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ConfigError(f"GPTConfig has no field(s) {unknown} (override of size {name!r})")
        return cls(**{**SIZES[name], **overrides})

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "GPTConfig":
        """Deprecated name of :meth:`of_size` ("preset" now means only an activation-cache preset)."""
        warn_once("GPTConfig.preset", "GPTConfig.of_size")
        return cls.of_size(name, **overrides)

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.n_embd // self.n_head


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through PyTorch's fused attention kernel."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config  # read at each call: rebuild_saved can be switched on a built model
        self.n_head = config.n_head
        self.dropout = config.dropout
        # One matmul for q, k and v together: fewer kernel launches than three.
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim), the layout scaled_dot_product_attention expects.
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        merged = _merge_heads(y)
        if not _rebuilding(self.config, "attn_out"):
            return self.resid_dropout(self.c_proj(merged))
        with rebuild_saved([(merged, recompute(_merge_heads, y))]):  # y: kept by the attention's backward
            return self.resid_dropout(self.c_proj(merged))


REBUILD_TARGETS = ("ln_1", "attn_out", "ln_2")  # what GPTConfig.rebuild_saved can name: the norms' outputs, c_proj's input


def rebuild_targets(value: bool | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The targets a ``GPTConfig.rebuild_saved`` value names (True: all); a :class:`ConfigError` if it is neither
    a bool nor names from :data:`REBUILD_TARGETS`."""
    if isinstance(value, bool):
        return REBUILD_TARGETS if value else ()
    if isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value):
        unknown = [v for v in value if v not in REBUILD_TARGETS]
        if not unknown:
            return tuple(value)
    raise ConfigError(
        f"GPTConfig.rebuild_saved must be a bool or a tuple of names from {REBUILD_TARGETS}, got {value!r}"
    )


def _rebuilding(config: GPTConfig, target: str) -> bool:
    # Checkpointed blocks keep nothing of their inside anyway; rebuild hooks there would keep what they save.
    return (target in rebuild_targets(config.rebuild_saved) and not config.checkpoint_blocks
            and torch.is_grad_enabled())


def _merge_heads(y: torch.Tensor) -> torch.Tensor:
    """(B, n_head, T, head_dim) -> (B, T, C), contiguous."""
    B, H, T, D = y.shape
    return y.transpose(1, 2).contiguous().view(B, T, H * D)


class MLP(nn.Module):
    """Position-wise feed-forward: c_fc -> activation -> c_proj."""

    # What actzip's SparseMLPConfig reads: forward is exactly dropout(c_proj(act(c_fc(x)))), and the
    # activation's name (act itself is a plain function for relu2).
    actzip_mlp_layout = ("c_fc", "act", "c_proj")

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = config.mlp_ratio * config.n_embd
        self.activation = config.activation
        self.actzip_mlp_activation = config.activation
        self.act = ACTIVATIONS[config.activation]
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, norm, sub in (("ln_1", self.ln_1, self.attn), ("ln_2", self.ln_2, self.mlp)):
            n = norm(x)
            if not _rebuilding(self.config, name):
                x = x + sub(n)
                continue
            with rebuild_saved([(n, recompute(norm, x))]):  # x: kept by the norm's backward
                x = x + sub(n)
        return x


class GPT(nn.Module):
    """Decoder-only transformer language model.

    ``forward(idx, targets=None)`` returns ``(logits, loss)``: logits of shape
    ``(batch, seq, vocab_size)`` and the mean cross entropy over every position (``None`` without
    targets).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # Same Parameter object, so one tensor is stored, updated and counted.
            self.wte.weight = self.lm_head.weight

        self.apply(self._init_weights)
        # Scale the projections that write into the residual stream so its variance does not grow
        # with depth (GPT-2 paper: one residual add per attention and per MLP, hence 2 * n_layer).
        proj_std = 0.02 / math.sqrt(2 * config.n_layer)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(param, mean=0.0, std=proj_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if idx.dim() != 2:
            raise ConfigError(f"GPT.forward: idx must have shape (batch, seq), got {tuple(idx.shape)}")
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ConfigError(
                f"GPT.forward: idx has sequence length {T}, longer than block_size {self.config.block_size}"
            )
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))

        # Checkpointing only pays off when a backward will follow.
        use_ckpt = self.config.checkpoint_blocks and self.training and torch.is_grad_enabled()
        for block in self.h:
            if use_ckpt:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)

        if targets is not None and self.config.loss_chunk:
            return None, self._chunked_loss(self.ln_f(x), targets)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        # Low-precision logits lose too much in log-softmax over the vocabulary.
        loss_logits = logits if logits.dtype == torch.float32 else logits.float()
        loss = F.cross_entropy(loss_logits.view(-1, loss_logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def _chunked_loss(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy computed ``loss_chunk`` tokens at a time; each chunk's logits are recomputed in
        backward rather than kept (the same arithmetic per token as the plain head; the sum order differs)."""
        h, targets = h.reshape(-1, h.size(-1)), targets.reshape(-1)
        total = h.new_zeros((), dtype=torch.float32)
        for i in range(0, h.size(0), self.config.loss_chunk):
            j = i + self.config.loss_chunk
            total = total + checkpoint(self._loss_sum, h[i:j], targets[i:j], use_reentrant=False)
        return total / targets.numel()

    def _loss_sum(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Low-precision logits lose too much in log-softmax over the vocabulary.
        return F.cross_entropy(self.lm_head(h).float(), targets, reduction="sum")

    def num_params(self, non_embedding: bool = True) -> int:
        """Number of parameters (shared ones once).

        With ``non_embedding`` the position table is left out, and the token table too unless it is
        tied to the output head (then it does real work as the head's weight and is kept, as in GPT-2).
        """
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wpe.weight.numel()
            if not self.config.tie_weights:
                n -= self.wte.weight.numel()
        return n

    def configure_optimizer(
        self,
        lr: float = 3e-4,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on matrices and embeddings (>= 2 dims) only, never on biases/norms, fused on CUDA
        (:func:`actzip.core.optim.make_optimizer`)."""
        return make_optimizer(self, "adamw", lr=lr, weight_decay=weight_decay, betas=betas)
