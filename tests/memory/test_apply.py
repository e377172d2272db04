"""compress_(model, SparseMLPConfig()): swaps ReLU / ReLU² MLPs; gradients stay bit-identical."""

import copy

import pytest
import torch

import actzip
from actzip.errors import ConfigError
from actzip.memory import ActivationCache, SparseGatedReLUMLP, SparseMLPConfig, SparseReLUMLP, compress_
from actzip_bench.models import GPT, GPTConfig

transformers = pytest.importorskip("transformers")


def grads_after(model, fn):
    model.zero_grad(set_to_none=True)
    loss = fn(model)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(a, b):
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys() and a[1]
    for k in a[1]:
        assert torch.equal(a[1][k], b[1][k]), k


@pytest.mark.parametrize("activation", ["relu2", "relu"])
def test_reference_gpt(activation):
    cfg = GPTConfig.preset("tiny", activation=activation)
    ref = GPT(cfg)
    model = copy.deepcopy(ref)
    report = compress_(model, SparseMLPConfig())
    assert [n for n, _ in report.swapped] == [f"h.{i}.mlp" for i in range(cfg.n_layer)]
    assert all(isinstance(b.mlp, SparseReLUMLP) for b in model.h)
    assert model.state_dict().keys() == ref.state_dict().keys()
    idx = torch.randint(0, 256, (2, cfg.block_size))

    def loss(m):
        return m(idx, idx)[1]

    assert_same(grads_after(ref, loss), grads_after(model, loss))


def test_gelu_gpt_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match=r"h\.0\.mlp: activation .* is not relu or relu2"):
        compress_(GPT(GPTConfig.preset("tiny", activation="gelu")), SparseMLPConfig())


def test_filter_fn_and_report():
    model = GPT(GPTConfig.preset("tiny"))
    report = compress_(model, SparseMLPConfig(), filter_fn=lambda m, name: name.startswith("h.0."))
    assert [n for n, _ in report.swapped] == ["h.0.mlp"] and len(report) == 1
    assert ("h.1.mlp", "excluded by filter_fn") in report.skipped
    again = compress_(model, SparseMLPConfig(), filter_fn=lambda m, name: True)
    assert ("h.0.mlp", "already swapped") in again.skipped


def test_bad_config():
    with pytest.raises(ConfigError, match="no option"):
        SparseMLPConfig(codec_options={"bits": 2})
    with pytest.raises(ConfigError, match="no handler for config type int"):
        compress_(torch.nn.Linear(2, 2), 3)
    with pytest.raises(ConfigError, match="nothing to swap"):
        compress_(torch.nn.Sequential(torch.nn.Linear(2, 2)), SparseMLPConfig())


def test_cache_bytes_drop_on_the_swapped_gpt():
    cfg = GPTConfig.preset("tiny")
    ref = GPT(cfg)
    model = copy.deepcopy(ref)
    compress_(model, SparseMLPConfig(codec_options={"sign_pack": True}))
    idx = torch.randint(0, 256, (4, cfg.block_size))
    counts = []
    for m in (ref, model):
        cache = ActivationCache.count_only()
        with cache:
            loss = m(idx, idx)[1]
        loss.backward()
        counts.append(cache.last)
    assert counts[0].bytes_before == counts[1].bytes_before
    assert counts[1].bytes_after < 0.8 * counts[0].bytes_after


def _llama(act):
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   hidden_act=act)
    return transformers.LlamaForCausalLM(cfg)


def _gpt2(act):
    cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                  activation_function=act, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def _nemotron_h(act):
    cfg = transformers.NemotronHConfig(
        vocab_size=128, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, mlp_hidden_act=act, hybrid_override_pattern="*-",
        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1,
    )
    return transformers.NemotronHForCausalLM(cfg)


@pytest.mark.parametrize(
    "build,act,kind",
    [(_llama, "relu2", SparseGatedReLUMLP), (_llama, "relu", SparseGatedReLUMLP), (_gpt2, "relu", SparseReLUMLP),
     (_nemotron_h, "relu2", SparseReLUMLP)],
)
def test_huggingface_models(build, act, kind):
    torch.manual_seed(0)
    try:
        ref = build(act)
    except (TypeError, ValueError, AttributeError) as e:  # config fields differ across transformers versions
        pytest.skip(f"cannot build {build.__name__} here: {e}")
    model = copy.deepcopy(ref)
    report = compress_(model, SparseMLPConfig())
    assert report.swapped and all(k == f"{kind.__name__}({act})" for _, k in report.swapped)
    ids = torch.randint(0, 128, (2, 32))

    def loss(m):
        return m(input_ids=ids, labels=ids).loss

    assert_same(grads_after(ref, loss), grads_after(model, loss))


def test_top_level_alias():
    assert actzip.compress_ is compress_
