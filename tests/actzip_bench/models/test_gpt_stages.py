"""The reference GPT as actzip.wire stages: bit-identical to the unsplit model, every boundary trains, named
errors; and the old names of the splitter."""

import pytest
import torch
import torch.nn.functional as F

from actzip.codecs.rvq import CodebookDesyncError, codebook_checksum
from actzip.errors import ConfigError
from actzip.wire import BOUNDARIES, WireMeter, run_chain
from actzip.wire.stiefel import orthonormality_error
from actzip_bench.data import Corpus
from actzip_bench.models import GPT, GPTConfig
from actzip_bench.models.gpt_stages import build_gpt_stages, gpt_boundary_config

TINY = GPTConfig.of_size("tiny")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see tests/conftest.py


@pytest.fixture(scope="module")
def corpus():
    return Corpus.from_stdlib(max_bytes=400_000)


def _idx(b=2, t=16):
    return torch.randint(0, 256, (b, t))


@pytest.mark.parametrize(
    "cfg,n_stages",
    [(TINY, 1), (TINY, 2), (GPTConfig.of_size("tiny", n_layer=5), 3), (GPTConfig.of_size("tiny", bias=True), 2)],
)
def test_dense_stages_match_the_unsplit_model_bit_for_bit(cfg, n_stages):
    state = torch.get_rng_state()
    stages = build_gpt_stages(cfg, n_stages, "dense", seed=7)
    assert torch.equal(state, torch.get_rng_state())  # the caller's RNG is untouched
    assert len(stages) == n_stages
    assert sum(len(s.body.blocks) for s in stages) == cfg.n_layer
    torch.manual_seed(7)
    model = GPT(cfg)
    idx = _idx()
    logits = run_chain(stages, idx)
    assert torch.equal(logits, model(idx)[0])
    logits.sum().backward()
    model(idx)[0].sum().backward()
    # Every block's gradients are bit-identical too (the messages' gradients pass the links unchanged).
    for i, block in enumerate(model.h):
        mine = [b for s in stages for b in s.body.blocks][i]
        for (name, p), q in zip(block.named_parameters(), mine.parameters()):
            assert torch.equal(p.grad, q.grad), name


def test_a_tied_head_becomes_an_equal_copy_owned_by_the_last_stage():
    stages = build_gpt_stages(TINY, 2, "dense")
    wte, head = stages[0].body.embed.wte.weight, stages[-1].body.lm_head.weight
    assert wte is not head and torch.equal(wte, head)


def _train(stages, corpus, steps, lr=3e-3, batch=8):
    params = [p for s in stages for p in s.parameters()]
    opt = torch.optim.AdamW(params, lr=lr)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        x, y = corpus.get_batch("train", batch, 32, generator=g)
        loss = F.cross_entropy(run_chain(stages, x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for s in stages:
            s.after_optimizer_step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_every_boundary_trains(boundary, corpus):
    stages = build_gpt_stages(TINY, 2, boundary, ratio=1 if boundary == "dense" else 32)
    losses = _train(stages, corpus, 30)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (boundary, losses)


def test_subspace_boundary_lies_in_span_u_and_is_rebuilt(corpus):
    cfg = GPTConfig.of_size("tiny", n_layer=3)
    stages = build_gpt_stages(cfg, 3, "subspace", ratio=32)
    _train(stages, corpus, 5)  # trained weights, not only the initial ones
    seen = {}
    sender = stages[1].sender
    sender.register_forward_hook(lambda m, args, out: seen.update(x=args[0], ids=args[1]))
    receiver = stages[2].receiver
    receiver.register_forward_hook(lambda m, args, out: seen.update(rebuilt=out[0]))
    with torch.no_grad():
        run_chain(stages, _idx(4, 32))
    U = sender.basis.U
    r = seen["x"] - sender.basis.fixed(seen["ids"])
    assert (r - (r @ U) @ U.t()).norm() <= 1e-5 * r.norm()
    assert torch.allclose(seen["rebuilt"], seen["x"], atol=1e-5)
    # The last stage's blocks are free (no boundary follows them), the others confined.
    assert type(stages[2].body.blocks[0].attn.c_proj).__name__ == "Linear"
    assert type(stages[1].body.blocks[0].mlp.c_proj).__name__ == "SubspaceLinear"


def test_backward_bytes_are_the_code_size():
    stages = build_gpt_stages(TINY, 2, "bottleneck", ratio=16)
    meter = WireMeter()
    idx = _idx(2, 16)
    run_chain(stages, idx, meter).sum().backward()
    width = stages[0].sender.cfg.width
    assert meter.bwd_bytes == [2 * 16 * width * 4]
    assert meter.fwd_bytes[0] == 2 * 16 * width * 4 + stages[0].sender.header.numel() * 4


def test_stiefel_projections_stay_orthonormal_and_move(corpus):
    stages = build_gpt_stages(TINY, 2, "stiefel", ratio=16, lr=1e-2)
    v0 = stages[0].sender.V.detach().clone()
    _train(stages, corpus, 25)
    for v in (stages[0].sender.V, stages[1].receiver.V):
        assert orthonormality_error(v) < 1e-5
    assert (stages[0].sender.V - v0).abs().max() > 1e-3


def test_rvq_sends_indices_and_keeps_codebooks_in_sync(corpus):
    stages = build_gpt_stages(TINY, 2, "stiefel-rvq", ratio=100, rvq_sync_every=1)
    bcfg = stages[0].sender.cfg
    _train(stages, corpus, 6)
    sender_book, receiver_book = stages[0].sender.book, stages[1].receiver.book
    run_chain(stages, _idx())  # carries the last update
    assert sender_book.version > 0
    assert torch.equal(sender_book.codebook, receiver_book.codebook)
    msg = stages[0].wire_encode(stages[0](_idx(2, 16)))
    assert "code" not in msg and msg["rvq_idx"].numel() == 2 * 16 * bcfg.rvq.levels


def test_rvq_desync_is_an_error_and_resync_repairs_it(corpus):
    stages = build_gpt_stages(TINY, 2, "stiefel-rvq", ratio=100, rvq_sync_every=1)
    _train(stages, corpus, 3)
    run_chain(stages, _idx())
    book = stages[1].receiver.book
    with torch.no_grad():
        book.codebook[0, 0] += 1.0  # a flipped row on the receiver
    book.checksum = codebook_checksum(book.codebook)
    with pytest.raises(CodebookDesyncError):
        run_chain(stages, _idx())
    stages[0].request_resync()
    run_chain(stages, _idx())
    assert torch.equal(book.codebook, stages[0].sender.book.codebook)

    # A lost message that carried an update: the next message is refused.
    _train(stages, corpus, 1)  # publishes an update
    stages[0](_idx())  # the message carrying it is sent but never received
    with pytest.raises(CodebookDesyncError, match="desync"):
        run_chain(stages, _idx())
    stages[0].request_resync()
    _train(stages, corpus, 2)
    run_chain(stages, _idx())  # carries the last update
    assert torch.equal(book.codebook, stages[0].sender.book.codebook)


def test_mismatched_stage_configs_raise():
    a = build_gpt_stages(TINY, 2, "subspace", ratio=32, seed=0)
    b = build_gpt_stages(TINY, 2, "subspace", ratio=32, seed=1)
    c = build_gpt_stages(TINY, 2, "subspace", ratio=16, seed=0)
    with pytest.raises(ConfigError, match="seed"):
        run_chain([a[0], b[1]], _idx())
    with pytest.raises(ConfigError, match="width"):
        run_chain([a[0], c[1]], _idx())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"n_stages": 3}, "n_stages"),
        ({"n_stages": 2, "boundary": "zip"}, "boundary 'zip'"),
        ({"n_stages": 1, "boundary": "subspace"}, "no boundary"),
        ({"n_stages": 2, "boundary": "stiefel", "ratio": 16, "anchors": 4}, "anchors"),
        ({"n_stages": 2, "boundary": "bottleneck", "ratio": 0.5}, "ratio"),
        ({"n_stages": 2, "boundary": "stiefel", "ratio": 16, "rvq_levels": 2}, "stiefel-rvq"),
        ({"n_stages": 2, "boundary": "stiefel-rvq:16", "rvq_level": 2}, "rvq_levels"),
    ],
)
def test_build_gpt_stages_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        build_gpt_stages(TINY, **kwargs)


def test_boundary_config_maps_ratio_to_width():
    small = GPTConfig.of_size("small")
    assert gpt_boundary_config("subspace", small, 100).width == 2  # 10.24 bytes - 1 byte of ids
    assert gpt_boundary_config("bottleneck:16", small).width == 16
    rvq = gpt_boundary_config("stiefel-rvq", small, 100).rvq
    assert (rvq.dim, rvq.levels, rvq.codebook_size) == (16, 9, 256)
    assert gpt_boundary_config("stiefel", small, 16, anchor_rank=0).width == 16
    over = gpt_boundary_config("stiefel-rvq:100", small, width=8, rvq_levels=4)
    assert (over.width, over.rvq.dim, over.rvq.levels) == (8, 8, 4)
    big = GPTConfig.of_size("small", vocab_size=50304)  # two bytes per token id
    assert gpt_boundary_config("stiefel:100", big).vocab_size == 50304


def test_every_boundary_leaves_the_callers_rng_alone_and_is_seeded():
    state = torch.get_rng_state()
    a = build_gpt_stages(TINY, 2, "subspace:32", seed=3)
    assert torch.equal(state, torch.get_rng_state())
    torch.manual_seed(123)  # another global state: the same stages
    b = build_gpt_stages(TINY, 2, "subspace:32", seed=3)
    for p, q in zip(a[0].parameters(), b[0].parameters()):
        assert torch.equal(p, q)


def test_the_old_splitters_warn_once_and_build_the_same_stages():
    from actzip import compat
    from actzip_bench.models import gpt_stages
    from actzip_bench.wire import split_gpt

    for old in ("actzip.wire.stages.build_stages", "actzip_bench.wire.split_gpt", "actzip.wire.stages.boundary_config"):
        compat.warned.discard(old)
    idx = _idx()
    want = run_chain(build_gpt_stages(TINY, 2, "stiefel:16", seed=1), idx)
    with pytest.warns(FutureWarning, match="build_stages is deprecated.*build_gpt_stages"):
        old = gpt_stages.build_stages(TINY, 2, "stiefel", 16.0, 1)
    assert torch.equal(run_chain(old, idx), want)
    with pytest.warns(FutureWarning, match="split_gpt is deprecated"):
        dense = split_gpt(TINY, 2, seed=1)
    assert torch.equal(run_chain(dense, idx), run_chain(build_gpt_stages(TINY, 2, seed=1), idx))
    with pytest.warns(FutureWarning, match="boundary_config is deprecated"):
        assert gpt_stages.boundary_config("stiefel", TINY, 16.0).width == gpt_boundary_config("stiefel:16", TINY).width
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the second call is quiet
        gpt_stages.build_stages(TINY, 2)
    with pytest.raises(AttributeError, match="moved to actzip_bench.models.gpt_stages"):
        import actzip.wire.stages as old_module

        old_module.build_stages


def test_resbm_bottleneck_takes_the_blocks_sublayers_and_trains(corpus):
    cfg = GPTConfig.of_size("tiny", n_layer=4)
    stages = build_gpt_stages(cfg, 2, "bottleneck", ratio=16, style="resbm")
    s0, s1 = stages
    # the sender encodes through the stage's last MLP, the receiver decodes into the next stage's first attention
    assert [type(b).__name__ for b in s0.body.blocks] == ["Block", "BlockHalf"]
    assert [type(b).__name__ for b in s1.body.blocks] == ["BlockHalf", "Block"]
    assert type(s0.sender.sublayer[1]).__name__ == "MLP"
    assert type(s0.body.blocks[1].sub).__name__ == "CausalSelfAttention"
    assert type(s1.receiver.sublayer[1]).__name__ == "CausalSelfAttention"
    assert type(s1.body.blocks[0].sub).__name__ == "MLP"
    # the identity path: without its projections the code is the first b features of the stage's output
    x = torch.randn(2, 8, cfg.n_embd)
    with torch.no_grad():
        s0.sender.enc.weight.zero_()
        assert torch.equal(s0.sender(x)["code"], x[..., : s0.sender.cfg.width])
    losses = _train(build_gpt_stages(cfg, 2, "bottleneck", ratio=16, style="resbm"), corpus, 30)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5


def test_resbm_single_block_stages_hand_both_halves_to_the_ends():
    cfg = GPTConfig.of_size("tiny", n_layer=3)
    stages = build_gpt_stages(cfg, 3, "bottleneck", ratio=8, style="resbm")
    assert len(stages[1].body.blocks) == 0
    meter = WireMeter()
    run_chain(stages, _idx(2, 16), meter).sum().backward()
    assert all(p.grad is not None for s in stages for p in s.parameters())


def test_subspace_options_scale_the_embedding_and_zero_the_confined_layers():
    stages = build_gpt_stages(TINY, 2, "subspace", ratio=32, proj_init="zero", fixed_std=1.0, learned_std=0.5)
    emb = stages[0].body.embed
    assert 0.9 < float(emb.fixed_tok.std()) < 1.1 and 0.4 < float(emb.tok.detach().std()) < 0.6
    confined = stages[0].body.blocks[0].attn.c_proj
    assert type(confined).__name__ == "SubspaceLinear" and not confined.weight.any()
    # the ends still agree: the model-side options are not part of the boundary's header
    plain = build_gpt_stages(TINY, 2, "subspace", ratio=32, fixed_std=1.0)
    assert torch.equal(stages[0].sender.header, plain[1].receiver.header)
    with pytest.raises(ConfigError, match="proj_init"):
        build_gpt_stages(TINY, 2, "subspace", ratio=32, proj_init="orthogonal")
    with pytest.raises(ConfigError, match="style"):
        build_gpt_stages(TINY, 2, "bottleneck", ratio=32, style="autoencoder")
