"""The server's coalition values (actzip.split.coalitions): through the first layer's parts they are the masked
forward's values, and any other model is run masked."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from actzip.split.coalitions import coalition_values


def _views(g):
    return [torch.randn(32, 8, 4, generator=g), torch.randn(32, 16, generator=g), torch.randn(32, 5, generator=g)]


def _masked(model, views, labels, coalition):
    x = torch.cat([(v if i in coalition else torch.zeros_like(v)).flatten(1) for i, v in enumerate(views)], dim=1)
    return -float(F.cross_entropy(model(x), labels))


@pytest.mark.parametrize("bias", [True, False])
def test_first_layer_parts_give_the_masked_forwards_values(bias):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    views, labels = _views(g), torch.randint(0, 4, (32,), generator=g)
    model = nn.Sequential(nn.Linear(32 + 16 + 5, 24, bias=bias), nn.ReLU(), nn.Linear(24, 4))
    value = coalition_values(model, views, labels)
    for k in range(4):
        for coalition in itertools.combinations(range(3), k):
            assert value(coalition) == pytest.approx(_masked(model, views, labels, coalition), rel=1e-5, abs=1e-6)


def test_other_models_run_masked_and_the_value_needs_no_gradient():
    g = torch.Generator().manual_seed(1)
    views, labels = _views(g), torch.randint(0, 4, (32,), generator=g)

    class Head(nn.Module):  # not a Sequential: no parts to reuse
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(53, 4)

        def forward(self, x):
            return self.fc(x.tanh())

    for model in (Head(), nn.Sequential(nn.Tanh(), nn.Linear(53, 4))):
        value = coalition_values(model, [v.requires_grad_() for v in views], labels)
        for coalition in [(), (0,), (1, 2), (0, 1, 2)]:
            assert value(coalition) == _masked(model, views, labels, coalition)
