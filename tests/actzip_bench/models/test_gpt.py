import math

import pytest
import torch
import torch.nn.functional as F

from actzip.errors import ConfigError
from actzip_bench.models import GPT, MLP, GPTConfig


def tiny(**overrides) -> GPTConfig:
    return GPTConfig.of_size("tiny", **overrides)


def batch(config: GPTConfig, B: int = 2, T: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T = config.block_size if T is None else T
    idx = torch.randint(config.vocab_size, (B, T), generator=g)
    targets = torch.randint(config.vocab_size, (B, T), generator=g)
    return idx, targets


# ---- config ---------------------------------------------------------------------------------------


def test_presets_set_documented_sizes():
    t = GPTConfig.of_size("tiny")
    assert (t.n_layer, t.n_head, t.n_embd, t.block_size, t.vocab_size) == (2, 2, 64, 64, 256)
    s = GPTConfig.of_size("small")
    assert (s.n_layer, s.n_head, s.n_embd, s.block_size) == (4, 4, 256, 128)
    g = GPTConfig.of_size("gpt2-124m")
    assert (g.n_layer, g.n_head, g.n_embd, g.block_size, g.vocab_size) == (12, 12, 768, 1024, 50304)
    w = GPTConfig.of_size("d4096x4")
    assert (w.n_layer, w.n_head, w.n_embd, w.vocab_size) == (4, 32, 4096, 50304)
    assert GPTConfig.of_size("tiny", activation="gelu", n_layer=3).activation == "gelu"
    assert GPTConfig.of_size("tiny", n_layer=3).n_layer == 3


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n_embd=65, n_head=2), "n_embd"),
        (dict(activation="swish"), "activation"),
        (dict(n_layer=0), "n_layer"),
        (dict(block_size=True), "block_size"),
        (dict(dropout=1.0), "dropout"),
        (dict(bias=1), "bias"),
    ],
)
def test_bad_config_field_raises_config_error_naming_it(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        GPTConfig(**kwargs)


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ConfigError, match="gpt2-124m") as info:
        GPTConfig.of_size("huge")
    assert "huge" in str(info.value) and "tiny" in str(info.value)


def test_preset_rejects_unknown_override():
    with pytest.raises(ConfigError, match="n_layers"):
        GPTConfig.of_size("tiny", n_layers=3)


# ---- forward / backward ---------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["relu", "relu2", "gelu"])
def test_forward_shapes_and_finite_loss(activation):
    torch.manual_seed(0)
    config = tiny(activation=activation)
    model = GPT(config)
    idx, targets = batch(config, B=3, T=17)
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 17, config.vocab_size)
    assert loss.dim() == 0 and torch.isfinite(loss)
    logits_only, no_loss = model(idx)
    assert no_loss is None
    assert torch.equal(logits_only, logits)


def test_loss_at_init_is_near_uniform():
    torch.manual_seed(0)
    config = tiny()
    model = GPT(config)
    _, loss = model(*batch(config, B=4))
    assert abs(loss.item() - math.log(256)) < 0.1


def test_idx_longer_than_block_size_is_rejected():
    config = tiny()
    model = GPT(config)
    idx = torch.zeros(1, config.block_size + 1, dtype=torch.long)
    with pytest.raises(ConfigError, match=r"idx.*65.*block_size 64"):
        model(idx)


def test_backward_reaches_every_trainable_param():
    torch.manual_seed(0)
    config = tiny(bias=True, tie_weights=False)
    model = GPT(config)
    _, loss = model(*batch(config))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        # wpe rows past T get no gradient, so check that something flowed rather than all-nonzero.
        assert p.grad.abs().sum() > 0, name


def test_checkpoint_blocks_gives_identical_loss_and_grads():
    torch.manual_seed(0)
    plain = GPT(tiny())
    ckpt = GPT(tiny(checkpoint_blocks=True))
    ckpt.load_state_dict(plain.state_dict())
    idx, targets = batch(plain.config)
    _, loss_plain = plain(idx, targets)
    loss_plain.backward()
    _, loss_ckpt = ckpt(idx, targets)
    loss_ckpt.backward()
    assert torch.equal(loss_plain, loss_ckpt)
    ckpt_params = dict(ckpt.named_parameters())
    for name, p in plain.named_parameters():
        assert torch.equal(p.grad, ckpt_params[name].grad), name


def test_checkpoint_blocks_actually_recomputes():
    # A pre-hook counts block calls: checkpointing runs each block again during backward. (A post
    # hook would miss the rerun, which stops as soon as the saved tensors are rebuilt.)
    torch.manual_seed(0)
    model = GPT(tiny(checkpoint_blocks=True))
    calls = []
    model.h[0].register_forward_pre_hook(lambda *_: calls.append(1))
    _, loss = model(*batch(model.config))
    assert len(calls) == 1
    loss.backward()
    assert len(calls) == 2
    # Under no_grad there is no backward to save memory for, so nothing is checkpointed.
    calls.clear()
    with torch.no_grad():
        model(*batch(model.config))
    assert len(calls) == 1


def test_tied_weights_share_storage():
    tied = GPT(tiny())
    assert tied.wte.weight is tied.lm_head.weight
    assert tied.wte.weight.data_ptr() == tied.lm_head.weight.data_ptr()
    untied = GPT(tiny(tie_weights=False))
    assert untied.wte.weight.data_ptr() != untied.lm_head.weight.data_ptr()
    # The shared matrix is counted once.
    table = 256 * 64
    assert untied.num_params(non_embedding=False) - tied.num_params(non_embedding=False) == table


def test_num_params_non_embedding_drops_position_table():
    model = GPT(tiny())
    assert model.num_params(non_embedding=False) - model.num_params() == 64 * 64


def test_residual_projection_init_is_scaled_by_depth():
    torch.manual_seed(0)
    model = GPT(tiny(n_layer=8))
    expected = 0.02 / math.sqrt(16)
    mlp = model.h[0].mlp
    assert mlp.c_proj.weight.std().item() == pytest.approx(expected, rel=0.05)
    assert model.h[0].attn.c_proj.weight.std().item() == pytest.approx(expected, rel=0.05)
    assert mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_mlp_relu2_is_squared_relu():
    torch.manual_seed(0)
    config = tiny(activation="relu2", bias=True)
    mlp = MLP(config)
    torch.nn.init.normal_(mlp.c_fc.bias)
    x = torch.randn(3, 5, config.n_embd)
    h = mlp.c_fc(x)
    assert (h < 0).any()  # the negative side must be exercised
    expected = mlp.c_proj(F.relu(h) ** 2)
    torch.testing.assert_close(mlp(x), expected, rtol=0, atol=0)


def test_bf16_model_forward_backward():
    torch.manual_seed(0)
    config = tiny()
    model = GPT(config).to(torch.bfloat16)
    logits, loss = model(*batch(config))
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32  # cross entropy runs on float32 logits
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == torch.bfloat16, name
        assert torch.isfinite(p.grad.float()).all(), name


def test_autocast_bf16_forward_backward():
    torch.manual_seed(0)
    config = tiny()
    model = GPT(config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(*batch(config))
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


# ---- optimizer ------------------------------------------------------------------------------------


def test_optimizer_decays_only_matrices():
    model = GPT(tiny(bias=True))
    opt = model.configure_optimizer(lr=1e-3, weight_decay=0.2)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.2 and no_decay["weight_decay"] == 0.0
    assert decay["params"] and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["params"] and all(p.dim() < 2 for p in no_decay["params"])
    n_opt = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n_opt == model.num_params(non_embedding=False)
    assert not decay["fused"]  # CPU parameters


def test_few_adamw_steps_reduce_loss_on_repeated_batch():
    torch.manual_seed(0)
    config = tiny()
    model = GPT(config)
    opt = model.configure_optimizer(lr=3e-3)
    idx, targets = batch(config, B=4, T=32)
    losses = []
    for _ in range(15):
        _, loss = model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


def test_chunked_loss_matches_the_plain_head():
    torch.manual_seed(0)
    plain = GPT(GPTConfig.of_size("tiny"))
    chunked = GPT(GPTConfig.of_size("tiny", loss_chunk=48))
    chunked.load_state_dict(plain.state_dict())
    idx, targets = torch.randint(0, 256, (3, 64)), torch.randint(0, 256, (3, 64))
    logits, loss = plain(idx, targets)
    none, chunked_loss = chunked(idx, targets)
    assert none is None and logits is not None
    torch.testing.assert_close(chunked_loss, loss)
    loss.backward()
    chunked_loss.backward()
    for p, q in zip(plain.parameters(), chunked.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7)
    assert chunked(idx)[0].shape == logits.shape  # without targets: the plain head


def test_loss_chunk_must_be_a_non_negative_int():
    with pytest.raises(ConfigError, match="loss_chunk"):
        GPTConfig(loss_chunk=-1)


@pytest.mark.parametrize("activation", ["relu2", "gelu"])
@pytest.mark.parametrize("targets, per_block", [(True, 3), (("ln_2",), 1), (("ln_1", "attn_out"), 2)])
def test_rebuild_saved_gives_identical_grads_and_keeps_less(activation, targets, per_block):
    from actzip.memory.cache import CacheContext as ActivationCache

    torch.manual_seed(0)
    model = GPT(GPTConfig.of_size("tiny", activation=activation))
    idx = torch.randint(0, 256, (2, 33))
    x, y = idx[:, :-1], idx[:, 1:]
    runs = {}
    for flag in (False, targets):
        model.config.rebuild_saved = flag
        model.zero_grad(set_to_none=True)
        with ActivationCache.count_only() as cache:
            _, loss = model(x, y)
        loss.backward()
        runs[bool(flag)] = ([p.grad.clone() for p in model.parameters()], cache.last)
    assert all(torch.equal(a, b) for a, b in zip(runs[False][0], runs[True][0]))
    rebuilt = runs[True][1].by_rule["rebuilt"]
    assert rebuilt.tensors == per_block * model.config.n_layer and rebuilt.stored_bytes == 0
    assert runs[True][1].bytes_after < runs[False][1].bytes_after


@pytest.mark.parametrize("bad", ["yes", ("ln_3",), 1])
def test_rebuild_saved_names_known_targets(bad):
    with pytest.raises(ConfigError, match="rebuild_saved.*ln_1"):
        GPTConfig(rebuild_saved=bad)


def test_rebuild_saved_stands_aside_inside_checkpointed_blocks():
    from actzip.memory.cache import CacheContext as ActivationCache

    torch.manual_seed(0)
    model = GPT(GPTConfig.of_size("tiny", checkpoint_blocks=True, rebuild_saved=True))
    idx = torch.randint(0, 256, (2, 33))
    with ActivationCache.count_only() as cache:
        _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert "rebuilt" not in cache.last.by_rule  # the checkpoint keeps nothing of a block: nothing to rebuild


def test_size_by_name_and_its_old_name():
    import warnings

    from actzip import compat

    cfg = GPTConfig.of_size("tiny", dropout=0.1)
    assert (cfg.n_layer, cfg.n_embd, cfg.dropout) == (2, 64, 0.1)
    with pytest.raises(ConfigError, match="size 'huge' is unknown"):
        GPTConfig.of_size("huge")
    compat.warned.discard("GPTConfig.preset")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert GPTConfig.preset("tiny") == GPTConfig.of_size("tiny")
        GPTConfig.preset("tiny")
    assert [str(w.message) for w in caught if w.category is FutureWarning] == [
        "GPTConfig.preset is deprecated and will be removed in the next release; use GPTConfig.of_size"
    ]
