"""The server's value of each coalition of modalities, for :func:`actzip.split.shapley`.

A coalition's value is the server model's negative loss on the batch just received with only the coalition's
modalities present, the others zero. Evaluated as it reads, that is one server forward a coalition (``2**n`` of
them). When the server's model begins with a ``Linear`` over the concatenated views (an ``nn.Sequential``
whose first module is ``nn.Linear``, the usual split-learning head), a zeroed modality adds nothing to that
layer's output, so each modality's part ``views[i] @ W[:, cols_i].T`` is computed once and a coalition's first
layer is the bias plus its members' parts: the first layer costs one matmul for all coalitions, and only the
(smaller) rest of the model runs once a coalition. The values are those of the masked forward up to the order
of the float additions (the sum of parts against one matmul over the concatenation).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["coalition_values"]


def _first_linear(model: nn.Module, width: int) -> tuple[nn.Linear, nn.Module] | None:
    """The model's leading ``Linear`` over ``width`` features and the rest of it, when it has that form."""
    if not isinstance(model, nn.Sequential) or len(model) == 0:
        return None
    first = model[0]
    if type(first) is not nn.Linear or first.in_features != width:  # a subclass may change what forward does
        return None
    return first, model[1:]


def coalition_values(model: nn.Module, views: Sequence[torch.Tensor], labels: torch.Tensor,
                     loss_fn: Callable = F.cross_entropy) -> Callable[[tuple[int, ...]], float]:
    """``value_fn(coalition)``: ``-loss_fn(model(cat(views present, zeros elsewhere)), labels)``, each view
    flattened to ``[batch, features]``, computed without autograd; through the first layer's parts when
    ``model`` starts with a ``Linear`` (see the module docstring)."""
    flat = [v.detach().flatten(1) for v in views]
    width = sum(v.shape[1] for v in flat)
    split = _first_linear(model, width)
    if split is None:

        def masked(coalition: tuple[int, ...]) -> float:
            with torch.no_grad():
                x = torch.cat([v if i in coalition else torch.zeros_like(v) for i, v in enumerate(flat)], dim=1)
                return -float(loss_fn(model(x), labels))

        return masked
    first, rest = split
    with torch.no_grad():
        columns = torch.split(first.weight, [v.shape[1] for v in flat], dim=1)
        parts = [v.to(w.dtype) @ w.T for v, w in zip(flat, columns)]
        bias = first.bias if first.bias is not None else torch.zeros_like(parts[0][0])

    def summed(coalition: tuple[int, ...]) -> float:
        with torch.no_grad():
            h = bias.expand_as(parts[0]).clone()
            for i in coalition:
                h += parts[i]
            return -float(loss_fn(rest(h), labels))

    return summed
