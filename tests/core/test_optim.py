import pytest
import torch
from torch import nn

from actzip.core.lr_schedule import lr_scheduler
from actzip.core.optim import MuonAdamW, make_optimizer, muon_matrices
from actzip.errors import ConfigError


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(11, 8)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.ln = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 11, bias=False)

    def forward(self, idx):
        return self.lm_head(self.ln(self.body(self.wte(idx))))


def test_muon_takes_hidden_matrices_only():
    m = Tiny()
    got = {id(p) for p in muon_matrices(m)}
    assert got == {id(m.body[0].weight), id(m.body[2].weight)}


def test_muon_adamw_steps_every_parameter_and_shares_groups():
    torch.manual_seed(0)
    m = Tiny()
    opt = make_optimizer(m, "muon", lr=1e-2)
    assert isinstance(opt, MuonAdamW)
    before = [p.detach().clone() for p in m.parameters()]
    idx = torch.randint(0, 11, (4, 6))
    loss = nn.functional.cross_entropy(m(idx).flatten(0, 1), idx.flatten())
    loss.backward()
    opt.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, m.parameters()))
    opt.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    # a scheduler sees (and scales) both inner optimizers' groups
    sched = lr_scheduler(opt, "cosine", 100)
    opt.step()
    sched.step()
    rates = {g["lr"] for g in opt.param_groups}
    assert len(opt.param_groups) == 3 and len(rates) == 1 and rates.pop() != 1e-2
    assert opt.muon.param_groups[0] is opt.param_groups[0]


def test_muon_adamw_trains_and_round_trips_its_state():
    torch.manual_seed(1)
    m = Tiny()
    opt = make_optimizer(m, "muon", lr=3e-3)
    idx = torch.randint(0, 11, (8, 6))
    losses = []
    for _ in range(60):
        loss = nn.functional.cross_entropy(m(idx).flatten(0, 1), idx.flatten())
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < 0.5 * losses[0]
    fresh = make_optimizer(m, "muon", lr=3e-3)
    fresh.load_state_dict(opt.state_dict())
    assert fresh.state_dict()["inner"][0]["state"].keys() == opt.state_dict()["inner"][0]["state"].keys()


def test_bad_optimizer_input_is_named():
    m = Tiny()
    with pytest.raises(ConfigError, match="optimizer must be one of"):
        make_optimizer(m, "sgd")
    with pytest.raises(ConfigError, match="listed twice"):
        MuonAdamW([m.body[0].weight], [m.body[0].weight])
    with pytest.raises(ConfigError, match="2-D matrices only"):
        MuonAdamW([m.body[0].bias], [])
    with pytest.raises(ConfigError, match="same parameter split"):
        make_optimizer(m, "muon").load_state_dict({"inner": []})
