"""The server's value of each coalition of modalities, for :func:`actzip.split.shapley`.

A coalition's value is the server model's negative loss on the batch just received with only the coalition's
modalities present, the others zero (``absent="zeros"``) or each sample's features replaced by their mean over
the batch (``absent="mean"``: the batch's average of that modality, which the model was trained around, where a
zero input may be one it never saw; a modality that carries nothing the model uses is then worth about nothing,
where zeroing it can cost as much as zeroing a useful one). Evaluated as it reads, that is one server forward a
coalition (``2**n`` of them). When the server's model begins with a ``Linear`` over the concatenated views (an ``nn.Sequential``
whose first module is ``nn.Linear``, the usual split-learning head), a zeroed modality adds nothing to that
layer's output, so each modality's part ``views[i] @ W[:, cols_i].T`` is computed once and a coalition's first
layer is the bias plus its members' parts (and, with ``"mean"``, the others' parts' batch means, which is the
part of their mean, the layer being linear): the first layer costs one matmul for all coalitions, and only the
(smaller) rest of the model runs once a coalition. The values are those of the masked forward up to the order
of the float additions (the sum of parts against one matmul over the concatenation).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from actzip.core.checks import check_choice

__all__ = ["ABSENT", "coalition_values"]

ABSENT = ("zeros", "mean")  # what stands in for a modality outside the coalition


def _first_linear(model: nn.Module, width: int) -> tuple[nn.Linear, nn.Module] | None:
    """The model's leading ``Linear`` over ``width`` features and the rest of it, when it has that form."""
    if not isinstance(model, nn.Sequential) or len(model) == 0:
        return None
    first = model[0]
    if type(first) is not nn.Linear or first.in_features != width:  # a subclass may change what forward does
        return None
    return first, model[1:]


def coalition_values(model: nn.Module, views: Sequence[torch.Tensor], labels: torch.Tensor,
                     loss_fn: Callable = F.cross_entropy, absent: str = "zeros") -> Callable[[tuple[int, ...]], float]:
    """``value_fn(coalition)``: ``-loss_fn(model(cat(views present, stand-ins elsewhere)), labels)``, each view
    flattened to ``[batch, features]``, computed without autograd; the stand-in of an absent view is ``absent``
    (:data:`ABSENT`: zeros, or its batch mean); through the first layer's parts when ``model`` starts with a
    ``Linear`` (see the module docstring)."""
    check_choice("coalition_values", "absent", absent, ABSENT)
    flat = [v.detach().flatten(1) for v in views]
    width = sum(v.shape[1] for v in flat)
    split = _first_linear(model, width)
    if split is None:
        with torch.no_grad():
            stand_in = [torch.zeros_like(v) if absent == "zeros" else v.mean(0, keepdim=True).expand_as(v)
                        for v in flat]

        def masked(coalition: tuple[int, ...]) -> float:
            with torch.no_grad():
                x = torch.cat([v if i in coalition else s for i, (v, s) in enumerate(zip(flat, stand_in))], dim=1)
                return -float(loss_fn(model(x), labels))

        return masked
    first, rest = split
    with torch.no_grad():
        columns = torch.split(first.weight, [v.shape[1] for v in flat], dim=1)
        parts = [v.to(w.dtype) @ w.T for v, w in zip(flat, columns)]
        bias = first.bias if first.bias is not None else torch.zeros_like(parts[0][0])
        means = [p.mean(0) for p in parts] if absent == "mean" else None

    def summed(coalition: tuple[int, ...]) -> float:
        with torch.no_grad():
            h = bias.expand_as(parts[0]).clone()
            for i, part in enumerate(parts):
                if i in coalition:
                    h += part
                elif means is not None:
                    h += means[i]
            return -float(loss_fn(rest(h), labels))

    return summed
