"""The configs of the stage-boundary ends: one dataclass per kind (``dense``, ``subspace``, ``bottleneck``,
``stiefel``, ``pca``; ``stiefel`` with ``rvq`` is ``stiefel-rvq``).

Compression ratio, as reported everywhere in actzip: *dense bytes per token / compressed bytes per token*,
forward direction, where dense bytes = ``n_embd * itemsize(activation dtype)`` and compressed bytes = code
bytes + side-channel bytes per token (per-message headers and codebook updates are amortized over the
message's tokens by the meters that measure them). Code width for a ratio: ``floor((n_embd * dense_itemsize /
ratio - side_bytes) / code_itemsize)``, at least 1 (so the nominal ratio is at least the one asked for unless the
width hits 1): ``n_embd = 768``, float32, ratio 100 leaves 30.7 bytes; two bytes of ids leave 7 float32 values
(102x). A bfloat16 ``code_dtype`` halves code and gradient; an RVQ code costs ``levels * ceil(log2
codebook_size)`` bits per token forward (its gradient still has ``width`` values per token).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from actzip.codecs.rvq import RVQConfig
from actzip.compat import warn_once
from actzip.errors import ConfigError
from actzip.wire.protocol import id_bytes
from actzip.wire.stiefel import RETRACTIONS

__all__ = ["BottleneckConfig", "BoundaryConfig", "DenseConfig", "PCAConfig", "StiefelConfig", "SubspaceConfig",
           "code_width"]

BOTTLENECK_STYLES = ("linear", "resbm")
_CODE_DTYPES = (None, torch.float32, torch.bfloat16, torch.float16)


def code_width(
    n_embd: int,
    ratio: float,
    *,
    dense_dtype: torch.dtype = torch.float32,
    code_dtype: torch.dtype | None = None,
    side_bytes: float = 0.0,
) -> int:
    """Code values per token for a forward compression ``ratio`` (see the module docstring), in ``[1, n_embd]``."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio >= 1.0:
        raise ConfigError(f"compression ratio must be a number >= 1, got {ratio!r}")
    code_size = (code_dtype or dense_dtype).itemsize
    budget = n_embd * dense_dtype.itemsize / ratio - side_bytes
    return int(min(n_embd, max(1, math.floor(budget / code_size + 1e-9))))


def _check_int(owner: str, name: str, value, lo: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ConfigError(f"{owner}.{name} must be an int >= {lo}, got {value!r}")


@dataclass
class BoundaryConfig:
    """Fields every boundary has. ``kind`` names it; subclasses add their own fields."""

    kind: ClassVar[str] = "?"
    local_fields: ClassVar[tuple[str, ...]] = ()  # fields one end may set differently (not in the header)

    n_embd: int = 256  # width d of the activation at the boundary
    width: int = 256  # code values per token on the link (k, or b for the bottleneck)
    code_dtype: torch.dtype | None = None  # dtype of the code and of its gradient; None: the activation's
    seed: int = 0  # seeds every fixed or initial matrix both ends must share

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _check_int(owner, "n_embd", self.n_embd)
        _check_int(owner, "width", self.width)
        _check_int(owner, "seed", self.seed, lo=0)
        if self.width > self.n_embd:
            raise ConfigError(f"{owner}.width ({self.width}) must not exceed n_embd ({self.n_embd})")
        if self.code_dtype not in _CODE_DTYPES:
            raise ConfigError(f"{owner}.code_dtype must be one of {list(_CODE_DTYPES)}, got {self.code_dtype!r}")

    @property
    def name(self) -> str:
        """The boundary's spec name (``stiefel-rvq`` for a stiefel boundary with RVQ)."""
        return self.kind

    @property
    def compressor(self) -> str:
        warn_once("BoundaryConfig.compressor", "BoundaryConfig.kind")
        return self.kind

    @property
    def needs_ids(self) -> bool:
        """Does the sender need the batch's token ids (and send them on)?"""
        return False

    def header_fields(self) -> list[tuple[str, object]]:
        """``(name, value)`` of every field both ends must agree on, the boundary's kind first."""
        out: list[tuple[str, object]] = [("boundary", self.kind)]
        for f in dataclasses.fields(self):
            if f.name in self.local_fields:
                continue
            value = getattr(self, f.name)
            if isinstance(value, RVQConfig):
                out += [(f"rvq.{n}", getattr(value, n)) for n in ("dim", "levels", "codebook_size", "seed")]
                out.append(("rvq.delta_dtype", value.delta_dtype))
            else:
                out.append((f.name, value))
        return out

    def nominal_bytes_per_token(self, act_dtype: torch.dtype = torch.float32) -> dict[str, float]:
        """Forward (code + side channel) and backward (code gradient) bytes per token, headers left out."""
        code = self.width * (self.code_dtype or act_dtype).itemsize
        return {"fwd": float(code + self.side_bytes()), "bwd": float(code)}

    def side_bytes(self) -> float:
        """Side-channel bytes per token (the token ids)."""
        return 0.0


@dataclass
class DenseConfig(BoundaryConfig):
    """No compression: the activation itself crosses the link (``width`` is forced to ``n_embd``)."""

    kind: ClassVar[str] = "dense"

    def __post_init__(self) -> None:
        self.width = self.n_embd
        super().__post_init__()

    def nominal_bytes_per_token(self, act_dtype: torch.dtype = torch.float32) -> dict[str, float]:
        b = float(self.n_embd * act_dtype.itemsize)
        return {"fwd": b, "bwd": b}


@dataclass
class SubspaceConfig(BoundaryConfig):
    """Subspace Networks: every boundary tensor minus a fixed embedding lies in span(U), U fixed d x k."""

    kind: ClassVar[str] = "subspace"
    # only the model's side uses them (the learned embedding, the confined layers), not the boundary's ends
    local_fields: ClassVar[tuple[str, ...]] = ("confine_last_stage", "learned_std", "proj_init")

    vocab_size: int = 256  # token ids on the side channel index the fixed embedding
    block_size: int = 256  # rows of the fixed position embedding (positions cost nothing: 0..T-1)
    fixed_std: float = 0.02  # std of the fixed high-rank token and position embeddings
    learned_std: float = 0.02  # initial std of the learned token and position embeddings in span(U) (k values)
    # initial W' of the confined layers (U W'): "projected", U^T times the dense layer's initial weights;
    # "zero", as the Subspace Networks reference starts every residual writer
    proj_init: str = "projected"
    confine_last_stage: bool = False  # also confine the last stage's blocks (no boundary follows them)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("SubspaceConfig", "vocab_size", self.vocab_size)
        _check_int("SubspaceConfig", "block_size", self.block_size)
        for name in ("fixed_std", "learned_std"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"SubspaceConfig.{name} must be a non-negative number, got {v!r}")
        if self.proj_init not in ("projected", "zero"):
            raise ConfigError(f"SubspaceConfig.proj_init must be 'projected' or 'zero', got {self.proj_init!r}")

    @property
    def needs_ids(self) -> bool:
        return True

    def side_bytes(self) -> float:
        return float(id_bytes(self.vocab_size))


@dataclass
class BottleneckConfig(BoundaryConfig):
    """ResBM: an encoder added to the identity path ``x[..., :b]`` on the sender, a decoder on the receiver (the
    ends and their two styles are in :mod:`actzip.wire.boundaries.bottleneck`)."""

    kind: ClassVar[str] = "bottleneck"

    # "linear": z = x[:b] + enc(LN(x)), x = [z, 0] + dec(z), projections from zero; "resbm": the published
    # architecture, z = x[:b] + enc(SiLU(sublayer(x))), x = [z, 0] + sublayer(ReLU(dec(z))), projections from
    # normal(0, 0.02), the sublayers the model's own where a split gives them (the reference GPT's does)
    style: str = "linear"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.style not in BOTTLENECK_STYLES:
            raise ConfigError(f"BottleneckConfig.style must be one of {list(BOTTLENECK_STYLES)}, got {self.style!r}")


@dataclass
class PCAConfig(BoundaryConfig):
    """The sender's principal subspace: ``(x - mu) U`` sent, ``mu + code U^T`` rebuilt, ``U`` the top-``width``
    eigenvectors of the covariance of the sender's recent outputs (the ends are in
    :mod:`actzip.wire.boundaries.principal`)."""

    kind: ClassVar[str] = "pca"
    local_fields: ClassVar[tuple[str, ...]] = ("refresh", "decay")  # only the sender uses them

    refresh: int = 8  # optimizer steps between two bases (each sent once, d * (width + 1) float32)
    decay: float = 0.5  # weight of the old statistics when a refresh folds in the new ones (0: the new alone)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("PCAConfig", "refresh", self.refresh)
        if isinstance(self.decay, bool) or not isinstance(self.decay, (int, float)) or not 0.0 <= self.decay < 1.0:
            raise ConfigError(f"PCAConfig.decay must be a number in [0, 1), got {self.decay!r}")


@dataclass
class StiefelConfig(BoundaryConfig):
    """MAPL: a learned orthonormal V (d x k) per end or shared (``tie``), anchors from the token ids, optional
    RVQ of the code (the ends are in :mod:`actzip.wire.boundaries.stiefel`)."""

    kind: ClassVar[str] = "stiefel"
    local_fields: ClassVar[tuple[str, ...]] = ("lr", "method", "retraction")

    vocab_size: int = 256  # token ids on the side channel index the anchor table
    block_size: int = 256  # rows of the position anchor table
    anchor_rank: int = 64  # r of the factorized anchors (vocab x r)(r x d); 0: no anchors and no ids sent
    # tokens each position's anchor embeds: 1, its own; n, also the n - 1 before it. The receiver has every id
    # already, so the extra context costs no bytes, only a (vocab + 1) x r table per extra token
    anchor_context: int = 1
    # add the whole anchor, its part in span(V) too; with tie and width = n_embd the boundary is then dense plus
    # anchors: the control that tells what the anchors add apart from the compression
    anchor_whole: bool = False
    lr: float = 1e-3  # Riemannian Adam step of V (after_optimizer_step)
    method: str = "adam"  # "adam" or "sgd" (see actzip.wire.stiefel.StiefelOptimizer)
    retraction: str = "qr"  # "qr" or "polar"
    # One V for both ends (MAPL's per-boundary projection): the receiver returns its share of V's gradient
    # after each step's backward, the sender steps V and sends it with the next message; d*k*4 bytes each way
    # per step. Off: each end learns its own V, so V_r V_s^T drifts from the identity even at k = d.
    tie: bool = False
    rvq: RVQConfig | None = None  # quantize the projected code (its dim must equal width)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("StiefelConfig", "vocab_size", self.vocab_size)
        _check_int("StiefelConfig", "block_size", self.block_size)
        _check_int("StiefelConfig", "anchor_rank", self.anchor_rank, lo=0)
        _check_int("StiefelConfig", "anchor_context", self.anchor_context)
        if not isinstance(self.anchor_whole, bool):
            raise ConfigError(f"StiefelConfig.anchor_whole must be True or False, got {self.anchor_whole!r}")
        if self.anchor_context > 1 and not self.anchor_rank:
            raise ConfigError(f"StiefelConfig.anchor_context={self.anchor_context} needs anchors (anchor_rank > 0)")
        if self.anchor_whole and not self.anchor_rank:
            raise ConfigError("StiefelConfig.anchor_whole=True needs anchors (anchor_rank > 0)")
        if not isinstance(self.tie, bool):
            raise ConfigError(f"StiefelConfig.tie must be True or False, got {self.tie!r}")
        if self.retraction not in RETRACTIONS:
            raise ConfigError(f"StiefelConfig.retraction must be one of {list(RETRACTIONS)}, got {self.retraction!r}")
        if self.rvq is not None and (not isinstance(self.rvq, RVQConfig) or self.rvq.dim != self.width):
            raise ConfigError(
                f"StiefelConfig.rvq must be an RVQConfig with dim == width ({self.width}), got {self.rvq!r}"
            )

    @property
    def name(self) -> str:
        return "stiefel-rvq" if self.rvq is not None else "stiefel"

    @property
    def compressor_name(self) -> str:
        warn_once("StiefelConfig.compressor_name", "StiefelConfig.name")
        return self.name

    @property
    def needs_ids(self) -> bool:
        return bool(self.anchor_rank)

    def side_bytes(self) -> float:
        return float(id_bytes(self.vocab_size)) if self.anchor_rank else 0.0

    def nominal_bytes_per_token(self, act_dtype: torch.dtype = torch.float32) -> dict[str, float]:
        out = super().nominal_bytes_per_token(act_dtype)
        if self.rvq is not None:
            out["fwd"] = self.rvq.bits_per_vector / 8 + self.side_bytes()
            out["bwd"] = float(self.width * (self.code_dtype or torch.float32).itemsize)
        return out
