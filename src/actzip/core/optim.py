"""The optimizers a stage trains with: AdamW, or Muon on the hidden matrices with AdamW on the rest.

Muon (``torch.optim.Muon``) orthogonalizes each matrix's momentum by Newton-Schulz iterations, so every direction
of a matrix learns at the same rate. That matters for the narrow matrices of a compressed boundary (a ``k x in``
subspace projection, a ``d -> b`` encoder), and it is the optimizer the Subspace Networks reference and the ResBM
paper train with. Muon takes 2-D matrices only; embeddings, the output head, biases and norms stay on AdamW, as
in every public Muon recipe. ``adjust_lr_fn="match_rms_adamw"`` scales Muon's step to AdamW's update size, so
one learning rate serves both groups and a sweep of it means the same thing for either optimizer.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from actzip.errors import ConfigError

__all__ = ["OPTIMIZERS", "MuonAdamW", "make_optimizer", "muon_matrices"]

OPTIMIZERS = ("adamw", "muon")


def muon_matrices(module: nn.Module, skip: Iterable[str] = ("lm_head",)) -> list[nn.Parameter]:
    """The weights Muon steps: every trainable 2-D ``weight`` of a module that is not an embedding, outside
    modules whose name contains a word of ``skip`` (the output head)."""
    out, seen = [], set()
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Embedding) or any(s in name for s in skip):
            continue
        w = getattr(sub, "weight", None)
        if isinstance(w, nn.Parameter) and w.requires_grad and w.dim() == 2 and id(w) not in seen:
            seen.add(id(w))
            out.append(w)
    return out


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer over two: ``torch.optim.Muon`` on ``matrices``, ``torch.optim.AdamW`` on ``others``.

    Its ``param_groups`` are the two inner optimizers' groups (the same dicts), so a learning-rate scheduler
    and ``zero_grad`` act on both; ``step`` steps both. Muon's momentum is its own (0.95, Nesterov); AdamW keeps
    ``betas``. Weight decay applies to the matrices and to the other tensors of >= 2 dims, never to biases.
    """

    def __init__(self, matrices: list[nn.Parameter], others: list[nn.Parameter], lr: float = 3e-4,
                 weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95)) -> None:
        ids = {id(p) for p in matrices}
        if len(ids) < len(matrices) or any(id(p) in ids for p in others):
            raise ConfigError("MuonAdamW: a parameter is listed twice (matrices and others must be disjoint)")
        bad = [tuple(p.shape) for p in matrices if p.dim() != 2]
        if bad:
            raise ConfigError(f"MuonAdamW: Muon steps 2-D matrices only, got parameters of shapes {bad}")
        self.muon = (torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
                     if matrices else None)
        groups = [{"params": [p for p in others if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in others if p.dim() < 2], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        fused = bool(others) and all(p.is_cuda for p in others)
        self.adamw = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=fused) if groups else None
        inner = [o for o in (self.muon, self.adamw) if o is not None]
        if not inner:
            raise ConfigError("MuonAdamW: no parameters to optimize")
        super().__init__([p for o in inner for g in o.param_groups for p in g["params"]], {"lr": lr})
        self.param_groups = [g for o in inner for g in o.param_groups]
        self._inner = inner

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self._inner:
            opt.step()
        return loss

    def state_dict(self) -> dict:
        return {"inner": [o.state_dict() for o in self._inner]}

    def load_state_dict(self, state_dict: dict) -> None:
        inner = state_dict.get("inner") if isinstance(state_dict, dict) else None
        if not isinstance(inner, list) or len(inner) != len(self._inner):
            raise ConfigError("MuonAdamW.load_state_dict: not a MuonAdamW state of the same parameter split")
        for opt, sd in zip(self._inner, inner):
            opt.load_state_dict(sd)
        self.param_groups = [g for o in self._inner for g in o.param_groups]


def make_optimizer(module: nn.Module, kind: str = "adamw", lr: float = 3e-4, weight_decay: float = 0.1,
                   betas: tuple[float, float] = (0.9, 0.95)) -> torch.optim.Optimizer:
    """``kind`` ``"adamw"``: AdamW with weight decay on tensors of >= 2 dims only, fused when all are on CUDA;
    ``"muon"``: :class:`MuonAdamW` with :func:`muon_matrices` on Muon."""
    if kind not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {list(OPTIMIZERS)}, got {kind!r}")
    params = [p for p in module.parameters() if p.requires_grad]
    if kind == "muon":
        matrices = muon_matrices(module)
        ids = {id(p) for p in matrices}
        return MuonAdamW(matrices, [p for p in params if id(p) not in ids], lr=lr, weight_decay=weight_decay,
                         betas=betas)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = bool(params) and all(p.is_cuda for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=fused)
