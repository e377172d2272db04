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


def _mean_masked(model, views, labels, coalition):
    flat = [v.flatten(1) for v in views]
    x = torch.cat([v if i in coalition else v.mean(0, keepdim=True).expand_as(v) for i, v in enumerate(flat)], 1)
    return -float(F.cross_entropy(model(x), labels))


def test_absent_views_can_stand_in_as_their_batch_mean_on_both_paths():
    g = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    views, labels = _views(g), torch.randint(0, 4, (32,), generator=g)
    for model in (nn.Sequential(nn.Linear(53, 24), nn.ReLU(), nn.Linear(24, 4)),  # through the parts
                  nn.Sequential(nn.Tanh(), nn.Linear(53, 4))):  # run masked
        value = coalition_values(model, views, labels, absent="mean")
        for coalition in [(), (0,), (1, 2), (0, 1, 2)]:
            assert value(coalition) == pytest.approx(_mean_masked(model, views, labels, coalition), rel=1e-5)


def test_a_view_the_model_ignores_is_worth_nothing_with_mean_stand_ins_but_not_with_zeros():
    # the model reads view 1 only through a constant it learned around (its mean), view 0 carries the labels
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 2, (64,), generator=g)
    signal = torch.nn.functional.one_hot(labels, 2).float() * 4
    noise = 5 + 0.01 * torch.randn(64, 2, generator=g)
    model = nn.Sequential(nn.Linear(4, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, -1.0]]))
        model[0].bias.zero_()
    from actzip.split import shapley

    zeros = shapley(coalition_values(model, [signal, noise], labels), 2).values
    mean = shapley(coalition_values(model, [signal, noise], labels, absent="mean"), 2).values
    assert abs(mean[1]) < 0.01 * mean[0]
    assert abs(zeros[1]) > 0.1 * zeros[0]


def test_an_unknown_stand_in_is_refused_by_name():
    from actzip.errors import ConfigError

    with pytest.raises(ConfigError, match="absent"):
        coalition_values(nn.Linear(3, 2), [torch.zeros(2, 3)], torch.zeros(2, dtype=torch.long), absent="noise")
