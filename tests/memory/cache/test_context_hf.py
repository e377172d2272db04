"""The cache context on real HuggingFace transformers models built from small local configs (no weights)."""

import pytest
import torch

import actzip

transformers = pytest.importorskip("transformers")


def _llama(act: str):
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        hidden_act=act,
    )
    return transformers.LlamaForCausalLM(cfg)


def _gpt2(act: str):
    cfg = transformers.GPT2Config(
        vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4, activation_function=act,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # dropout would make two runs differ
    )
    return transformers.GPT2LMHeadModel(cfg)


@pytest.mark.parametrize("build,act", [(_llama, "relu"), (_llama, "relu2"), (_llama, "silu"), (_gpt2, "relu")])
def test_hf_gradients_bit_identical(build, act):
    torch.manual_seed(0)
    model = build(act)
    model.config._attn_implementation = "sdpa"
    ids = torch.randint(0, 128, (2, 48))

    def run(cache):
        model.zero_grad(set_to_none=True)
        if cache is None:
            loss = model(input_ids=ids, labels=ids).loss
        else:
            with cache:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    l0, g0 = run(None)
    cache = actzip.cache(min_bytes=0)
    l1, g1 = run(cache)
    assert torch.equal(l0, l1)
    assert g0.keys() == g1.keys() and g0
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n
    if act in ("relu", "relu2"):
        assert cache.last.by_rule["sparse"].tensors >= 2
        assert cache.last.bytes_after < cache.last.bytes_before
