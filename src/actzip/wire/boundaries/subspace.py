"""The ``subspace`` boundary (Subspace Networks): what crosses is the activation's coordinates in a fixed span(U).

Every tensor at a boundary is a fixed high-rank token and position embedding (rebuilt from the token ids on
both ends) plus a part in span(U), ``U`` a fixed ``d x k`` orthonormal matrix drawn from the seed. The sender
sends ``(x - fixed(ids)) U`` and the ids; the receiver rebuilds ``fixed(ids) + code U^T``, exactly ``x`` when
the model keeps its residual stream in the subspace. Two pieces make it do so: :class:`SubspaceEmbedding` as
the model's input, and :func:`confine_to_subspace` on the linear layers that write into the residual stream
(each becomes a :class:`SubspaceLinear`, ``U W'``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from actzip.codecs.sketch import derive_seed
from actzip.errors import ConfigError
from actzip.wire.boundaries.config import SubspaceConfig
from actzip.wire.boundaries.ends import BoundaryReceiver, BoundarySender
from actzip.wire.stiefel import random_stiefel

__all__ = [
    "SubspaceEmbedding", "SubspaceLinear", "SubspaceReceiver", "SubspaceSender", "confine_to_subspace",
    "subspace_tensors",
]


def _gaussian(shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * std).float()


def subspace_tensors(cfg: SubspaceConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(U (d, k), fixed token embedding (vocab, d), fixed position embedding (block, d))`` from the seed."""
    u = random_stiefel(cfg.n_embd, cfg.width, derive_seed(cfg.seed, 0))
    tok = _gaussian((cfg.vocab_size, cfg.n_embd), derive_seed(cfg.seed, 1), cfg.fixed_std)
    pos = _gaussian((cfg.block_size, cfg.n_embd), derive_seed(cfg.seed, 2), cfg.fixed_std)
    return u, tok, pos


class SubspaceBasis(nn.Module):
    """``U`` and the fixed embeddings of a :class:`SubspaceConfig`, rebuilt from its seed on every end."""

    def __init__(self, cfg: SubspaceConfig) -> None:
        super().__init__()
        u, tok, pos = subspace_tensors(cfg)
        # Rebuilt from the seed on every end, so not part of the state dict.
        self.register_buffer("U", u, persistent=False)
        self.register_buffer("fixed_tok", tok, persistent=False)
        self.register_buffer("fixed_pos", pos, persistent=False)

    def fixed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fixed_tok[ids] + self.fixed_pos[: ids.shape[1]]


class SubspaceEmbedding(SubspaceBasis):
    """A model's input: fixed high-rank token and position embeddings plus a learned part in span(U)."""

    def __init__(self, cfg: SubspaceConfig, dropout: float = 0.0) -> None:
        super().__init__(cfg)
        self.tok = nn.Parameter(torch.randn(cfg.vocab_size, cfg.width) * cfg.learned_std)
        self.pos = nn.Parameter(torch.randn(cfg.block_size, cfg.width) * cfg.learned_std)
        self.drop = nn.Dropout(dropout)  # applied in the k-dim coordinates, so x stays in the subspace

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        learned = self.drop(self.tok[idx] + self.pos[: idx.shape[1]])
        return self.fixed(idx) + learned @ self.U.t()


class SubspaceLinear(nn.Module):
    """A Linear ``in_features -> d`` reparameterized as ``U W'`` (``W'``: k x in), so its output is in span(U).

    Dropout acts on the k coordinates (so the output stays in the subspace).
    """

    def __init__(self, U: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dropout: float = 0.0,
                 zero_init: bool = False):
        super().__init__()
        self.register_buffer("U", U, persistent=False)
        # Start from the projection of the dense layer's initial weights onto the subspace, or from zero.
        scale = 0.0 if zero_init else 1.0
        self.weight = nn.Parameter(U.t() @ weight.detach() * scale)
        self.bias = None if bias is None else nn.Parameter(U.t() @ bias.detach() * scale)
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.drop(F.linear(h, self.weight, self.bias)) @ self.U.t()


def confine_to_subspace(module: nn.Module, U: torch.Tensor, linears: Iterable[str], dropout: float = 0.0,
                        zero_init: bool = False) -> None:
    """Replace each ``nn.Linear`` of ``module`` named in ``linears`` (fqns) by a :class:`SubspaceLinear` on ``U``.

    Give it the layers that write into the residual stream (a transformer block's attention and MLP output
    projections), so that the stream stays in span(U) and a ``subspace`` boundary passes it exactly. ``dropout``
    moves into the new layers (on the k coordinates); a dropout after them must then be removed by the caller.
    ``zero_init``: the new layers start at zero (``SubspaceConfig.proj_init="zero"``), else at the projection
    of the old ones.
    """
    if not isinstance(U, torch.Tensor) or U.dim() != 2:
        raise ConfigError(f"confine_to_subspace: U must be a (d, k) matrix, got {getattr(U, 'shape', U)!r}")
    for fqn in linears:
        parent_name, _, child = fqn.rpartition(".")
        try:
            parent = module.get_submodule(parent_name) if parent_name else module
            lin = getattr(parent, child)
        except AttributeError:
            raise ConfigError(f"confine_to_subspace: {type(module).__name__} has no module {fqn!r}") from None
        if not isinstance(lin, nn.Linear) or lin.out_features != U.shape[0]:
            raise ConfigError(f"confine_to_subspace: {fqn!r} must be an nn.Linear with out_features = U's "
                              f"{U.shape[0]} rows, got {lin!r}")
        setattr(parent, child, SubspaceLinear(U, lin.weight, lin.bias, dropout, zero_init))


class SubspaceSender(BoundarySender):
    def __init__(self, cfg: SubspaceConfig) -> None:
        super().__init__(cfg)
        self.basis = SubspaceBasis(cfg)

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if ids is None:
            raise ConfigError("wire boundary (subspace): the sender needs the token ids of the batch")
        code = (x - self.basis.fixed(ids)) @ self.basis.U
        return self._message(code.to(self.cfg.code_dtype or code.dtype), ids, self.cfg.vocab_size)


class SubspaceReceiver(BoundaryReceiver):
    def __init__(self, cfg: SubspaceConfig) -> None:
        super().__init__(cfg)
        self.basis = SubspaceBasis(cfg)

    def forward(self, msg) -> tuple[torch.Tensor, torch.Tensor]:
        msg = self._open(msg)
        ids = self._ids(msg, self.cfg.vocab_size)
        code = self._code(msg)
        return self.basis.fixed(ids) + code.to(self.basis.U.dtype) @ self.basis.U.t(), ids
