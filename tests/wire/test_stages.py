"""Stages around any user's modules: the token-id side channel, boundary ends, chaining, named errors."""

import pytest
import torch
from torch import nn

from actzip.errors import ConfigError, WireConfigMismatchError
from actzip.wire import (
    Pipeline,
    PipelineConfig,
    Stage,
    WireMeter,
    boundary_config,
    confine_to_subspace,
    exchange_backward,
    make_boundary,
    run_chain,
)
from actzip.wire.boundaries import SubspaceEmbedding

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see tests/conftest.py

D, V, T = 16, 32, 8


class Mix(nn.Module):
    """A user block that writes into its residual stream through one projection."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(D, 2 * D)
        self.out = nn.Linear(2 * D, D)

    def forward(self, x):
        return x + self.out(torch.relu(self.inner(x)))


def _ids(b=2):
    return torch.randint(0, V, (b, T))


def test_token_ids_travel_from_the_first_stage_input_to_every_sender():
    cfg = boundary_config("stiefel:4,anchor_rank=4", n_embd=D, vocab_size=V, block_size=T)
    (s0, r0), (s1, r1) = make_boundary(cfg), make_boundary(cfg)
    seen = []
    s1.register_forward_hook(lambda m, args, out: seen.append(args[1]))
    stages = [Stage(nn.Embedding(V, D), sender=s0, input_ids=True), Stage(Mix(), receiver=r0, sender=s1),
              Stage(nn.Linear(D, V), receiver=r1)]
    idx = _ids()
    out = run_chain(stages, idx)
    assert out.shape == (2, T, V) and torch.equal(seen[0], idx)  # rebuilt by the middle stage's receiver
    with pytest.raises(ConfigError, match="token ids"):  # without input_ids the first sender has none
        run_chain([Stage(nn.Embedding(V, D), sender=s0), stages[1], stages[2]], idx)


def test_a_user_model_confined_to_a_subspace_crosses_the_boundary_exactly():
    cfg = boundary_config("subspace:8", n_embd=D, vocab_size=V, block_size=T)
    sender, receiver = make_boundary(cfg)
    embed = SubspaceEmbedding(cfg)
    body = nn.Sequential(embed, Mix())
    confine_to_subspace(body, embed.U, ["1.out"])
    got = {}
    receiver.register_forward_hook(lambda m, args, out: got.update(rebuilt=out[0]))
    stages = [Stage(body, sender=sender, input_ids=True), Stage(nn.Linear(D, V), receiver=receiver)]
    idx = _ids()
    with torch.no_grad():
        run_chain(stages, idx)
        torch.testing.assert_close(got["rebuilt"], body(idx), rtol=0, atol=1e-5)


def test_chained_user_stages_train_and_meter_the_code_only():
    sender, receiver = make_boundary(boundary_config("bottleneck:4", n_embd=D))
    stages = [Stage(nn.Sequential(nn.Embedding(V, D), Mix()), sender=sender), Stage(nn.Linear(D, V),
                                                                                     receiver=receiver)]
    opt = [s.configure_optimizer(lr=1e-2) for s in stages]
    meter = WireMeter()
    losses = []
    for _ in range(30):
        idx = _ids(8)
        loss = nn.functional.cross_entropy(run_chain(stages, idx, meter).flatten(0, 1), idx.flatten())
        loss.backward()
        exchange_backward(stages, meter)
        for o, s in zip(opt, stages):
            o.step()
            o.zero_grad(set_to_none=True)
            s.after_optimizer_step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3
    assert meter.bwd_bytes == [30 * 8 * T * 4 * 4]  # float32 gradients of the 4-wide code
    assert stages[0].boundary == stages[1].boundary == "bottleneck"


def test_stage_arguments_are_checked():
    sender, receiver = make_boundary(boundary_config("bottleneck:4", n_embd=D))
    with pytest.raises(ConfigError, match="sender must be a BoundarySender"):
        Stage(nn.Identity(), sender=receiver)
    with pytest.raises(ConfigError, match="input_ids=True is for a first stage"):
        Stage(nn.Identity(), receiver=receiver, input_ids=True)
    with pytest.raises(ConfigError, match="body must be an nn.Module"):
        Stage(lambda x: x)


def test_the_pipeline_checks_the_boundary_it_is_given_and_each_links_two_ends():
    sender, receiver = make_boundary(boundary_config("bottleneck:4", n_embd=D))
    stages = [Stage(nn.Sequential(nn.Embedding(V, D), Mix()), sender=sender), Stage(nn.Linear(D, V),
                                                                                     receiver=receiver)]
    with pytest.raises(ConfigError, match="stage 0 holds 'bottleneck' boundary ends"):
        Pipeline(stages, PipelineConfig(boundary="stiefel:4"))
    pipe = Pipeline(stages, PipelineConfig(microbatches=2, boundary="bottleneck:4", codec="quant:bits=8"))
    assert pipe.train_step(_ids(4), _ids(4)) > 0
    assert pipe.workers[0].fwd_send.describe()["codec"] == pipe.workers[0].bwd_recv.describe()["codec"] == "quant"
    with pytest.raises(WireConfigMismatchError, match="boundary: rank 0 has 'bottleneck', rank 1 has 'dense'"):
        Pipeline([stages[0], nn.Linear(D, V)], PipelineConfig(microbatches=2))
