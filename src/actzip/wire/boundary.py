"""Stage-boundary compressors: a sender module at the end of stage ``i`` and a receiver at the start of ``i+1``.

Both ends are ordinary modules trained with the model. What the sender returns is the *message*, exactly what
crosses the link: a tensor (``dense``) or a dict of tensors. In a dict,

- ``code`` (batch, seq, width) is the compressed activation. It is the only tensor that carries a gradient
  back: the receiver's gradient with respect to ``code`` has the code's shape and dtype, so the backward
  pass is compressed by the same factor as the forward pass ("the same act");
- ``ids`` are the token ids (one byte each up to 256 tokens, two up to 65,536), a forward-only side channel
  from which the receiver rebuilds token-specific full-rank signal (``subspace``, ``stiefel``);
- ``cfg`` holds one 31-bit hash per config field the two ends must agree on (4 bytes each, per message).
  The receiver compares them with its own and raises :class:`ConfigError` naming the fields that differ;
- ``rvq_*`` (``stiefel`` with RVQ): packed codebook indices replace ``code`` on the link (see
  :meth:`BoundarySender.wire_encode` / :meth:`BoundaryReceiver.wire_decode`), plus the codebook's version and
  checksum and, when the sender published, the changed codebook rows.

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
import hashlib
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from actzip.codecs.rvq import RVQConfig
from actzip.codecs.sketch import derive_seed
from actzip.errors import ConfigError
from actzip.wire.stiefel import RETRACTIONS, random_stiefel

__all__ = [  # fmt: skip
    "BottleneckConfig", "BoundaryConfig", "BoundaryReceiver", "BoundarySender", "DenseConfig", "StiefelConfig",
    "SubspaceConfig", "SubspaceEmbedding", "SubspaceLinear", "code_width", "id_bytes", "make_boundary",
    "subspace_tensors",
]

_CODE_DTYPES = (None, torch.float32, torch.bfloat16, torch.float16)


def id_bytes(vocab_size: int) -> int:
    """Bytes per token id on the wire: 1 up to 256 tokens, 2 up to 65,536, else 4."""
    return 1 if vocab_size <= 256 else 2 if vocab_size <= 1 << 16 else 4


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
    """Fields every boundary has. ``compressor`` names the kind; subclasses add their own fields."""

    compressor: ClassVar[str] = "?"
    local_fields: ClassVar[tuple[str, ...]] = ()  # fields one end may set differently (not in the header)

    n_embd: int = 256  # width d of the residual stream at the boundary
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

    def header_fields(self) -> list[tuple[str, object]]:
        """``(name, value)`` of every field both ends must agree on, the compressor's name first."""
        out: list[tuple[str, object]] = [("compressor", self.compressor)]
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
        return 0.0


@dataclass
class DenseConfig(BoundaryConfig):
    """No compression: the activation itself crosses the link (``width`` is forced to ``n_embd``)."""

    compressor: ClassVar[str] = "dense"

    def __post_init__(self) -> None:
        self.width = self.n_embd
        super().__post_init__()

    def nominal_bytes_per_token(self, act_dtype: torch.dtype = torch.float32) -> dict[str, float]:
        b = float(self.n_embd * act_dtype.itemsize)
        return {"fwd": b, "bwd": b}


@dataclass
class SubspaceConfig(BoundaryConfig):
    """Subspace Networks: every boundary tensor minus a fixed embedding lies in span(U), U fixed d x k."""

    compressor: ClassVar[str] = "subspace"
    local_fields: ClassVar[tuple[str, ...]] = ("confine_last_stage",)

    vocab_size: int = 256  # token ids on the side channel index the fixed embedding
    block_size: int = 256  # rows of the fixed position embedding (positions cost nothing: 0..T-1)
    fixed_std: float = 0.02  # std of the fixed high-rank token and position embeddings
    confine_last_stage: bool = False  # also confine the last stage's blocks (no boundary follows them)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("SubspaceConfig", "vocab_size", self.vocab_size)
        _check_int("SubspaceConfig", "block_size", self.block_size)
        if isinstance(self.fixed_std, bool) or not isinstance(self.fixed_std, (int, float)) or self.fixed_std < 0:
            raise ConfigError(f"SubspaceConfig.fixed_std must be a non-negative number, got {self.fixed_std!r}")

    def side_bytes(self) -> float:
        return float(id_bytes(self.vocab_size))


@dataclass
class BottleneckConfig(BoundaryConfig):
    """ResBM: z = x[..., :b] + enc(LN(x)) on the sender, x = [z, 0] + dec(z) on the receiver."""

    compressor: ClassVar[str] = "bottleneck"


@dataclass
class StiefelConfig(BoundaryConfig):
    """MAPL: a learned orthonormal V (d x k) per end or shared (``tie``), anchors from the token ids, optional
    RVQ of the code (the modules are in :mod:`actzip.wire.stiefel_ends`)."""

    compressor: ClassVar[str] = "stiefel"
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
    def compressor_name(self) -> str:
        return "stiefel-rvq" if self.rvq is not None else "stiefel"

    def side_bytes(self) -> float:
        return float(id_bytes(self.vocab_size)) if self.anchor_rank else 0.0

    def nominal_bytes_per_token(self, act_dtype: torch.dtype = torch.float32) -> dict[str, float]:
        out = super().nominal_bytes_per_token(act_dtype)
        if self.rvq is not None:
            out["fwd"] = self.rvq.bits_per_vector / 8 + self.side_bytes()
            out["bwd"] = float(self.width * (self.code_dtype or torch.float32).itemsize)
        return out


# ---- header: one hash per shared field -----------------------------------------------------------------


def _hash31(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF


_KNOWN = {_hash31(f"compressor={name!r}"): name for name in ("dense", "subspace", "bottleneck", "stiefel")}


def _header(cfg: BoundaryConfig) -> tuple[list[str], torch.Tensor]:
    fields = cfg.header_fields()
    values = [_hash31(f"{n}={v!r}") for n, v in fields]
    return [n for n, _ in fields], torch.tensor(values, dtype=torch.int32)


def _check_header(cfg: BoundaryConfig, names: list[str], mine: torch.Tensor, got: torch.Tensor) -> None:
    theirs = got.tolist()  # a small host read per message
    own = mine.tolist()
    if theirs == own:
        return
    if not theirs or theirs[0] != own[0]:
        sender = _KNOWN.get(theirs[0] if theirs else -1, "another compressor")
        raise ConfigError(
            f"wire boundary: the sender uses compressor {sender!r} but the receiver is {cfg.compressor!r}; "
            "build both ends of a boundary from the same config"
        )
    if len(theirs) != len(own):
        raise ConfigError(f"wire boundary ({cfg.compressor}): the sender's config has {len(theirs)} shared fields, "
                          f"the receiver's {len(own)}; build both ends from the same config")
    bad = [n for n, a, b in zip(names, theirs, own) if a != b]
    raise ConfigError(
        f"wire boundary ({cfg.compressor}): the sender's and receiver's configs differ in {bad}; the receiver has "
        + ", ".join(f"{n}={getattr(cfg, n, None)!r}" for n in bad if "." not in n)
        + "; build both ends of a boundary from the same config"
    )


def _pack_ids(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    n = id_bytes(vocab_size)
    if n == 1:
        return ids.to(torch.uint8)
    if n == 2:
        return (ids - 32768).to(torch.int16)  # the offset fits 0..65535 into int16
    return ids.to(torch.int32)


def _unpack_ids(packed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    ids = packed.long()
    return ids + 32768 if id_bytes(vocab_size) == 2 else ids


def _gaussian(shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * std).float()


def subspace_tensors(cfg: SubspaceConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(U (d, k), fixed token embedding (vocab, d), fixed position embedding (block, d))`` from the seed."""
    u = random_stiefel(cfg.n_embd, cfg.width, derive_seed(cfg.seed, 0))
    tok = _gaussian((cfg.vocab_size, cfg.n_embd), derive_seed(cfg.seed, 1), cfg.fixed_std)
    pos = _gaussian((cfg.block_size, cfg.n_embd), derive_seed(cfg.seed, 2), cfg.fixed_std)
    return u, tok, pos


# ---- the two ends ----------------------------------------------------------------------------------------


class _End(nn.Module):
    exact_keys: ClassVar[tuple[str, ...]] = ()  # message items a lossy byte codec must not touch (synced state)

    def __init__(self, cfg: BoundaryConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.header_names, header = _header(cfg)
        self.register_buffer("header", header, persistent=False)


class BoundarySender(_End):
    """End of stage ``i``: ``forward(x, ids)`` -> the message (a tensor or a dict of tensors)."""

    def _message(self, code: torch.Tensor, ids: torch.Tensor | None, vocab: int | None) -> dict[str, torch.Tensor]:
        msg = {"code": code, "cfg": self.header}
        if ids is not None and vocab is not None:
            msg["ids"] = _pack_ids(ids, vocab)
        return msg

    def wire_encode(self, out):
        """What actually goes on the link, given what :meth:`forward` returned (identity unless RVQ)."""
        return out

    def after_optimizer_step(self) -> None:
        """Work after the optimizer step (Stiefel retraction step, codebook update); nothing by default."""

    def request_resync(self) -> None:
        """Send the full state with the next message (after the receiver reported a desync)."""

    def wire_backward_accept(self, items: dict[str, torch.Tensor]) -> None:
        """Take what the receiver returned with its last gradient message of a step (see
        :meth:`BoundaryReceiver.wire_backward_items`); a sender that expects nothing refuses anything."""
        if items:
            raise ConfigError(
                f"wire boundary ({self.cfg.compressor}): the sender got {sorted(items)} with a gradient message "
                "but expects nothing there; build both ends of a boundary from the same config"
            )


class BoundaryReceiver(_End):
    """Start of stage ``i+1``: ``forward(message)`` -> ``(x (batch, seq, n_embd), ids or None)``."""

    def _open(self, msg) -> dict[str, torch.Tensor]:
        if not isinstance(msg, dict) or "cfg" not in msg:
            kind = "a tensor (a 'dense' sender?)" if isinstance(msg, torch.Tensor) else type(msg).__name__
            raise ConfigError(
                f"wire boundary: a {self.cfg.compressor!r} receiver expects a message dict with 'cfg', got {kind}; "
                "build both ends of a boundary from the same config"
            )
        _check_header(self.cfg, self.header_names, self.header, msg["cfg"])
        return msg

    def _ids(self, msg: dict, vocab: int) -> torch.Tensor:
        if "ids" not in msg:
            raise ConfigError(f"wire boundary ({self.cfg.compressor}): the message has no token ids ('ids')")
        return _unpack_ids(msg["ids"], vocab)

    def _code(self, msg: dict) -> torch.Tensor:
        code = msg.get("code")
        if code is None or code.dim() != 3 or code.shape[-1] != self.cfg.width:
            got = None if code is None else tuple(code.shape)
            raise ConfigError(
                f"wire boundary ({self.cfg.compressor}): expected a code of shape (batch, seq, {self.cfg.width}) "
                f"(width {self.cfg.width}), got {got}"
            )
        return code

    def wire_decode(self, msg, stale_ok: bool = False):
        """The stage input rebuilt from what arrived on the link (identity unless RVQ)."""
        return msg

    def wire_backward_items(self) -> dict[str, torch.Tensor]:
        """Tensors for the sender, sent with the last gradient message of a step, once this end's backward for
        the step is done (a shared projection's gradient); none by default."""
        return {}

    def after_optimizer_step(self) -> None:
        """Work after the optimizer step; nothing by default."""


class DenseSender(BoundarySender):
    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        return x


class DenseReceiver(BoundaryReceiver):
    def forward(self, msg) -> tuple[torch.Tensor, None]:
        if not isinstance(msg, torch.Tensor) or msg.dim() != 3 or msg.shape[-1] != self.cfg.n_embd:
            got = tuple(msg.shape) if isinstance(msg, torch.Tensor) else f"a {type(msg).__name__}"
            raise ConfigError(
                f"wire boundary (dense): expected an activation of shape (batch, seq, {self.cfg.n_embd}), got {got}; "
                "build both ends of a boundary from the same config"
            )
        return msg, None


# ---- subspace --------------------------------------------------------------------------------------------


class _SubspaceFixed(nn.Module):
    def __init__(self, cfg: SubspaceConfig) -> None:
        super().__init__()
        u, tok, pos = subspace_tensors(cfg)
        # Rebuilt from the seed on every end, so not part of the state dict.
        self.register_buffer("U", u, persistent=False)
        self.register_buffer("fixed_tok", tok, persistent=False)
        self.register_buffer("fixed_pos", pos, persistent=False)

    def fixed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fixed_tok[ids] + self.fixed_pos[: ids.shape[1]]


class SubspaceEmbedding(_SubspaceFixed):
    """Stage 0's input: fixed high-rank token and position embeddings plus a learned part in span(U)."""

    def __init__(self, cfg: SubspaceConfig, dropout: float = 0.0) -> None:
        super().__init__(cfg)
        self.tok = nn.Parameter(torch.randn(cfg.vocab_size, cfg.width) * 0.02)
        self.pos = nn.Parameter(torch.randn(cfg.block_size, cfg.width) * 0.02)
        self.drop = nn.Dropout(dropout)  # applied in the k-dim coordinates, so x stays in the subspace

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        learned = self.drop(self.tok[idx] + self.pos[: idx.shape[1]])
        return self.fixed(idx) + learned @ self.U.t()


class SubspaceLinear(nn.Module):
    """A Linear ``in_features -> d`` reparameterized as ``U W'`` (``W'``: k x in), so its output is in span(U).

    Replaces the output projections of attention and MLP; dropout acts on the k coordinates.
    """

    def __init__(self, U: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dropout: float = 0.0):
        super().__init__()
        self.register_buffer("U", U, persistent=False)
        # Start from the projection of the dense layer's initial weights onto the subspace.
        self.weight = nn.Parameter(U.t() @ weight.detach())
        self.bias = None if bias is None else nn.Parameter(U.t() @ bias.detach())
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.drop(F.linear(h, self.weight, self.bias)) @ self.U.t()


class SubspaceSender(BoundarySender):
    def __init__(self, cfg: SubspaceConfig) -> None:
        super().__init__(cfg)
        self.basis = _SubspaceFixed(cfg)

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if ids is None:
            raise ConfigError("wire boundary (subspace): the sender needs the token ids of the batch")
        code = (x - self.basis.fixed(ids)) @ self.basis.U
        return self._message(code.to(self.cfg.code_dtype or code.dtype), ids, self.cfg.vocab_size)


class SubspaceReceiver(BoundaryReceiver):
    def __init__(self, cfg: SubspaceConfig) -> None:
        super().__init__(cfg)
        self.basis = _SubspaceFixed(cfg)

    def forward(self, msg) -> tuple[torch.Tensor, torch.Tensor]:
        msg = self._open(msg)
        ids = self._ids(msg, self.cfg.vocab_size)
        code = self._code(msg)
        return self.basis.fixed(ids) + code.to(self.basis.U.dtype) @ self.basis.U.t(), ids


# ---- bottleneck (ResBM) ----------------------------------------------------------------------------------


class BottleneckSender(BoundarySender):
    def __init__(self, cfg: BottleneckConfig) -> None:
        super().__init__(cfg)
        self.ln = nn.LayerNorm(cfg.n_embd)
        self.enc = nn.Linear(cfg.n_embd, cfg.width)
        nn.init.zeros_(self.enc.weight)  # start as the pure identity path
        nn.init.zeros_(self.enc.bias)

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        z = x[..., : self.cfg.width] + self.enc(self.ln(x))
        return self._message(z.to(self.cfg.code_dtype or z.dtype), None, None)


class BottleneckReceiver(BoundaryReceiver):
    def __init__(self, cfg: BottleneckConfig) -> None:
        super().__init__(cfg)
        self.dec = nn.Linear(cfg.width, cfg.n_embd)
        nn.init.zeros_(self.dec.weight)
        nn.init.zeros_(self.dec.bias)

    def forward(self, msg) -> tuple[torch.Tensor, None]:
        z = self._code(self._open(msg)).to(self.dec.weight.dtype)
        return F.pad(z, (0, self.cfg.n_embd - self.cfg.width)) + self.dec(z), None


_PAIRS = {
    "dense": (DenseSender, DenseReceiver),
    "subspace": (SubspaceSender, SubspaceReceiver),
    "bottleneck": (BottleneckSender, BottleneckReceiver),
}


def make_boundary(cfg: BoundaryConfig) -> tuple[BoundarySender, BoundaryReceiver]:
    """The sender and receiver modules of one boundary."""
    if not isinstance(cfg, BoundaryConfig) or cfg.compressor not in _PAIRS:
        raise ConfigError(f"make_boundary: expected one of {sorted(_PAIRS)} configs, got {cfg!r}")
    sender, receiver = _PAIRS[cfg.compressor]
    return sender(cfg), receiver(cfg)


# The Stiefel ends subclass the ends above, so they come last.
from actzip.wire.stiefel_ends import StiefelReceiver, StiefelSender  # noqa: E402

_PAIRS["stiefel"] = (StiefelSender, StiefelReceiver)

