"""The two ends of a stiefel boundary with one shared projection (``tie``): exact at k = d, the gradient of the
shared V, the same V on both ends in one process and across gloo ranks, and named errors."""

import pytest
import torch
import torch.nn.functional as F
from gloo_ranks import run_ranks

from actzip.errors import ConfigError, WireDesyncError
from actzip.wire import Pipeline, PipelineConfig, WireMeter, exchange_backward, run_chain
from actzip_bench.models import GPTConfig
from actzip_bench.models.gpt_stages import build_gpt_stages

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see tests/conftest.py

CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0, tie_weights=False)


def ids(seed=0, b=4, t=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (b, t), generator=g)


def chain_steps(stages, steps, lr=1e-2, exchange=True):
    opts = [s.configure_optimizer(lr=lr) for s in stages]
    meter = WireMeter()
    for step in range(steps):
        x = ids(step)
        loss = F.cross_entropy(run_chain(stages, x, meter).flatten(0, 1), x.flatten())
        loss.backward()
        if exchange:
            exchange_backward(stages, meter)
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        for s in stages:
            s.after_optimizer_step()
    return meter


def test_tied_full_width_boundary_passes_activations_through():
    x = ids()
    dense = build_gpt_stages(CFG, 2, "dense", seed=0)
    tied = build_gpt_stages(CFG, 2, "stiefel", ratio=1.0, seed=0, tie=True, anchor_rank=0)
    assert tied[0].sender.cfg.width == CFG.n_embd
    torch.testing.assert_close(run_chain(tied, x), run_chain(dense, x), rtol=0, atol=1e-5)
    chain_steps(tied, 3)
    with torch.no_grad():
        run_chain(tied, ids(9))  # carries the last step's V
    v_s, v_r = tied[0].sender.V, tied[1].receiver.V
    assert tied[0].sender.v_version == tied[1].receiver.v_version == 3
    assert torch.equal(v_s, v_r) and not torch.equal(v_s, build_gpt_stages(CFG, 2, "stiefel", ratio=1.0, seed=0).pop(0).sender.V)
    eye = torch.eye(CFG.n_embd)
    torch.testing.assert_close(v_r @ v_s.t(), eye, rtol=0, atol=1e-5)  # still the identity map


def test_untied_ends_drift_apart_at_full_width():
    stages = build_gpt_stages(CFG, 2, "stiefel", ratio=1.0, seed=0, anchor_rank=0)
    chain_steps(stages, 3)
    drift = (stages[1].receiver.V.detach() @ stages[0].sender.V.detach().t() - torch.eye(CFG.n_embd)).abs().max()
    assert drift > 1e-3  # why tie exists: separate ends make V_r V_s^T a moving rotation


def test_shared_gradient_is_the_sum_of_both_ends_shares():
    """The step's V gradient equals autograd's for one parameter used at both ends."""
    tied = build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, seed=0, tie=True)
    ref = build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, seed=0)
    ref[1].receiver.stepper.remove()
    ref[1].receiver.V = ref[0].sender.V  # one Parameter: its hook sums both uses
    for stages in (tied, ref):
        for s in range(2):  # two microbatches: the shares are summed over the step
            x = ids(s)
            F.cross_entropy(run_chain(stages, x).flatten(0, 1), x.flatten()).backward()
    exchange_backward(tied)
    got, want = tied[0].sender.stepper.take_grad(), ref[0].sender.stepper.take_grad()
    assert got is not None and got.abs().sum() > 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_v_bytes_are_metered_once_per_step_each_way():
    untied = chain_steps(build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, seed=0), 2)
    stages = build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, seed=0, tie=True)
    tied = chain_steps(stages, 2)
    v_bytes = CFG.n_embd * stages[0].sender.cfg.width * 4
    assert tied.bwd_bytes[0] - untied.bwd_bytes[0] == 2 * v_bytes  # the receiver's share, each step
    # the new V (and its two versions) in the second step's message; the first step's V is still unsent
    assert tied.fwd_bytes[0] - untied.fwd_bytes[0] == v_bytes + 16


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_runner_keeps_both_ends_on_one_v(schedule):
    stages = build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, seed=0, tie=True)
    pipe = Pipeline(stages, PipelineConfig(microbatches=2, schedule=schedule, lr=1e-2))
    for s in range(3):
        pipe.train_step(ids(s), ids(s + 10))
    pipe.eval_loss(ids(7), ids(8))
    assert stages[0].sender.v_version == stages[1].receiver.v_version == 3
    assert torch.equal(stages[0].sender.V, stages[1].receiver.V)


def test_tie_errors_are_named():
    with pytest.raises(ConfigError, match="tie must be True or False"):
        build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, tie="yes")
    stages = build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, seed=0, tie=True)
    with pytest.raises(ConfigError, match="without the receiver's share"):
        chain_steps(stages, 1, exchange=False)
    # a tied sender and an untied receiver: the header names the field
    sender = build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, seed=0, tie=True)[0]
    receiver = build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, seed=0)[1]
    with pytest.raises(ConfigError, match="tie"):
        run_chain([sender, receiver], ids())
    with pytest.raises(ConfigError, match=r"tie=False\): the sender got \['v_grad'\]"):
        build_gpt_stages(CFG, 2, "stiefel", ratio=4.0)[0].wire_backward_accept({"v_grad": torch.zeros(32, 8)})


def test_a_lost_v_update_is_a_desync_error():
    stages = build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, seed=0, tie=True)
    chain_steps(stages, 2)
    with torch.no_grad():
        stages[0](ids())  # this message carries V's update but never reaches the receiver
    chain_steps(stages, 1)  # unnoticed until the next update arrives on top of the one lost
    with pytest.raises(WireDesyncError, match="receiver's V is at version 1 .* replaces version 2"), torch.no_grad():
        run_chain(stages, ids())


def _tied_ranks(rank, world, steps):
    stages = build_gpt_stages(CFG, world, "stiefel", ratio=4.0, seed=0, tie=True)
    pipe = Pipeline(stages[rank], PipelineConfig(microbatches=2, lr=1e-2, timeout_s=10), distributed=True)
    res = pipe.run(_batches, steps)
    end = stages[rank].sender if rank == 0 else stages[rank].receiver
    return {"V": end.V.detach().tolist(), "version": end.v_version, "losses": None if res is None else res["losses"]}


def _batches(step):
    return ids(step), ids(step + 10), None


def test_gloo_ranks_share_v_and_match_the_simulated_pipeline():
    reports = run_ranks(_tied_ranks, 2, 3)
    assert [r[0] for r in reports] == ["ok"] * 2, reports
    r0, r1 = reports[0][1], reports[1][1]
    stages = build_gpt_stages(CFG, 2, "stiefel", ratio=4.0, seed=0, tie=True)
    pipe = Pipeline(stages, PipelineConfig(microbatches=2, lr=1e-2))
    want = [pipe.train_step(*_batches(s)[:2]) for s in range(3)]
    losses = r1["losses"] if r1["losses"] is not None else r0["losses"]
    assert losses == pytest.approx(want, abs=1e-5)
    # The receiver got V up to the last step it saw a message for; the sender is one step ahead.
    assert r0["version"] == 3 and r1["version"] == 2
    torch.testing.assert_close(torch.tensor(r0["V"]), stages[0].sender.V.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("boundary, ratio, options", [("stiefel", 4.0, {"tie": True}),
                                                        ("stiefel-rvq", 100.0, {"rvq_sync_every": 1})])
def test_a_lossy_byte_codec_leaves_synced_state_exact(boundary, ratio, options):
    """A 4-bit forward codec compresses the code, never the projection or codebook updates."""
    from actzip.wire import pipeline

    stages = build_gpt_stages(CFG, 2, boundary, ratio=ratio, seed=0, **options)
    pipe = Pipeline(stages, PipelineConfig(microbatches=2, fwd_codec="quant:bits=4", lr=1e-2))
    desyncs = pipeline.codebook_desyncs()
    for s in range(3):
        pipe.train_step(ids(s), ids(s + 10))
    pipe.eval_loss(ids(7), ids(8))
    sender, receiver = stages[0].sender, stages[1].receiver
    if options.get("tie"):
        assert sender.v_version == 3 and torch.equal(sender.V, receiver.V)
    else:
        assert sender.book.version > 0 and torch.equal(sender.book.codebook, receiver.book.codebook)
        assert pipeline.codebook_desyncs() == desyncs


@pytest.mark.parametrize("context", [1, 2, 3])
def test_anchor_context_embeds_the_tokens_before_each_position_at_no_byte_cost(context):
    from actzip.wire import StiefelConfig, make_boundary, message_nbytes

    cfg = StiefelConfig(n_embd=32, width=4, vocab_size=64, block_size=16, anchor_rank=8, anchor_context=context)
    sender, receiver = make_boundary(cfg)
    x = torch.randn(2, 16, 32)
    a, b = ids(0, 2), ids(0, 2).clone()
    b[:, 5] = (b[:, 5] + 1) % 64  # one token differs; the code (x V) does not depend on the ids
    msg_a, msg_b = sender(x, a), sender(x, b)
    assert message_nbytes(msg_a) == message_nbytes(make_boundary(
        StiefelConfig(n_embd=32, width=4, vocab_size=64, block_size=16, anchor_rank=8))[0](x, a))
    out_a, _ = receiver(msg_a)
    out_b, _ = receiver(msg_b)
    changed = [t for t in range(16) if not torch.equal(out_a[:, t], out_b[:, t])]
    assert changed == list(range(5, 5 + context))  # the position itself and the context - 1 after it
    out_a.sum().backward()
    if context > 1:
        assert receiver.anchor_before.grad is not None and receiver.anchor_before.grad.abs().sum() > 0
        # the first positions see the row for "before the start"
        assert receiver.anchor_before.grad[0, 64].abs().sum() > 0


def test_anchor_context_errors_are_named():
    from actzip.wire import StiefelConfig

    with pytest.raises(ConfigError, match="anchor_context"):
        StiefelConfig(anchor_context=0)
    with pytest.raises(ConfigError, match="anchor_context=2 needs anchors"):
        StiefelConfig(anchor_context=2, anchor_rank=0)
    stages = build_gpt_stages(CFG, 2, "stiefel", ratio=16.0, seed=0, anchor_rank=8, anchor_context=2)  # through the options
    assert stages[1].receiver.anchor_before.shape == (1, 65, 8)


def test_whole_anchors_on_a_tied_full_width_boundary_are_dense_plus_anchors():
    stages = build_gpt_stages(CFG, 2, "stiefel", ratio=1.0, seed=0, tie=True, width=32, anchor_rank=8, anchor_context=2,
                          anchor_whole=True)
    sender, receiver = stages[0].sender, stages[1].receiver
    x, t = torch.randn(2, 16, 32), ids(0, 2)
    out, _ = receiver(sender(x, t))
    anchor = receiver._anchor_embedding(t) @ receiver.anchor_out
    torch.testing.assert_close(out, x + anchor)  # V V^T = I up to rounding: x passes, the whole anchor is added
    with pytest.raises(ConfigError, match="anchor_whole"):
        build_gpt_stages(CFG, 2, "stiefel", ratio=1.0, seed=0, anchor_whole="yes")
    with pytest.raises(ConfigError, match="anchor_whole=True needs anchors"):
        build_gpt_stages(CFG, 2, "stiefel", ratio=1.0, seed=0, anchor_whole=True, anchor_rank=0)


def test_the_rvq_sender_measures_the_relative_error_of_its_training_codes():
    stages = build_gpt_stages(GPTConfig.of_size("tiny"), 2, "stiefel-rvq:16", seed=0)
    sender = stages[0].sender
    seen = {}
    sender.register_forward_hook(lambda m, args, out: seen.update(x=args[0]))
    assert sender.rvq_relative_error() is None  # nothing quantized yet
    with torch.no_grad():  # evaluation codes are not counted
        run_chain(stages, torch.randint(0, 256, (2, 16)))
    assert sender.rvq_relative_error() is None
    run_chain(stages, torch.randint(0, 256, (2, 16))).sum().backward()
    code = (seen["x"] @ sender.V).reshape(-1, sender.cfg.width).detach()
    q = sender.book.quantize(code)[1]
    expect = float((q - code).norm() / code.norm())
    assert sender.rvq_relative_error() == pytest.approx(expect, rel=1e-5)
    plain = build_gpt_stages(GPTConfig.of_size("tiny"), 2, "stiefel:16", seed=0)[0].sender
    assert plain.rvq_relative_error() is None
