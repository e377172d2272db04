"""Norm outputs marked by compress_(SparseMLPConfig()): the fused MLP and the projections it feeds keep no copy
of it, exactly."""

import copy

import pytest
import torch
import torch.nn as nn

from actzip.memory.cache import CacheConfig, CacheContext
from actzip.memory.cache.rebuild import mark_rebuildable, rebuildable
from actzip.memory.modules import SparseMLPConfig, SparseReLUMLP, compress_, restore_
from actzip.memory.modules.norm_rebuild import is_norm, mark_norm_outputs, rebuild_projection_inputs
from actzip_bench.models import GPT, GPTConfig


class Block(nn.Module):
    """x + mlp(norm(x)), the pre-norm shape the marks are for."""

    def __init__(self, d=32, hidden=96, norm=nn.LayerNorm):
        super().__init__()
        self.norm = norm(d)
        self.mlp = SparseReLUMLP(nn.Linear(d, hidden, bias=False), nn.Linear(hidden, d, bias=False), square=True)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def saved_bytes(block, x):
    cache = CacheContext(CacheConfig(min_bytes=0))
    with cache:
        y = block(x)
    y.float().square().sum().backward()
    return cache.last


def gradients(models, x):
    """Input and parameter gradients of each model after one backward of the same loss from ``x``."""
    grads = []
    for m in models:
        xi = x.clone().requires_grad_()
        m(xi).float().square().sum().backward()
        grads.append([xi.grad] + [p.grad for p in m.parameters()])
    return grads


@pytest.mark.parametrize("norm", [nn.LayerNorm, nn.RMSNorm])
def test_marked_norm_output_is_rebuilt_not_kept_and_gradients_are_identical(norm):
    torch.manual_seed(0)
    ref = Block(norm=norm)
    marked = copy.deepcopy(ref)
    handles = mark_norm_outputs(marked)
    assert len(handles) == 2  # the block around the norm's forward and the mark after it
    x = torch.randn(64, 32)
    assert all(torch.equal(a, b) for a, b in zip(*gradients((ref, marked), x)))
    plain, rebuilt = saved_bytes(ref, x.clone().requires_grad_()), saved_bytes(marked, x.clone().requires_grad_())
    n_bytes = x.numel() * x.element_size()
    # the MLP's input (the norm output, saved by up and for a recompute) is a handle now: n's bytes fewer
    assert rebuilt.by_rule["rebuilt"].dense_bytes - plain.by_rule["rebuilt"].dense_bytes >= n_bytes
    assert rebuilt.bytes_after <= plain.bytes_after - n_bytes


def test_a_mark_is_dropped_once_the_tensor_is_modified_in_place():
    t = torch.randn(4, 4)
    mark_rebuildable(t, lambda: torch.zeros(4, 4))
    assert rebuildable(t) and rebuildable(t)[0][0] is t
    t.add_(1)
    assert rebuildable(t) == []
    assert rebuildable(torch.randn(2)) == []


def test_is_norm():
    assert is_norm(nn.LayerNorm(4)) and is_norm(nn.RMSNorm(4))
    assert not is_norm(nn.Linear(4, 4)) and not is_norm(nn.BatchNorm1d(4))


def test_compress_hooks_the_norms_once_and_restore_removes_them():
    model = GPT(GPTConfig.of_size("tiny"))
    report = compress_(model, SparseMLPConfig())
    norms = [m for m in model.modules() if is_norm(m)]
    assert norms and all(len(m._forward_hooks) == 1 and len(m._forward_pre_hooks) == 1 for m in norms)
    assert any("rebuild_norms" in n for n in report.notes)
    attention = [b.attn.c_attn for b in model.h]
    assert all(len(m._forward_pre_hooks) == 1 and len(m._forward_hooks) == 1 for m in attention)
    restore_(model)
    assert all(len(m._forward_hooks) == 0 for m in norms)
    assert all(len(m._forward_pre_hooks) == 0 and len(m._forward_hooks) == 0 for m in attention)
    compress_(model, SparseMLPConfig(rebuild_norms=False))
    assert all(len(m._forward_hooks) == 0 for m in norms)


def test_rebuild_norms_must_be_a_bool():
    from actzip.errors import ConfigError

    with pytest.raises(ConfigError, match="rebuild_norms"):
        SparseMLPConfig(rebuild_norms="yes")


def _kept_bytes(model, idx):
    """Activation bytes autograd keeps for one forward, counted by the cache's own account."""
    counter = CacheContext.count_only()
    with counter:
        model(idx, idx)
    return counter.last.bytes_after


def test_projections_fed_a_norm_output_rebuild_it_so_it_is_freed_and_gradients_are_identical():
    torch.manual_seed(0)
    ref = GPT(GPTConfig.of_size("tiny"))
    model = copy.deepcopy(ref)
    report = compress_(model, SparseMLPConfig())
    assert any("projection(s)" in n for n in report.notes)
    only_mlp = copy.deepcopy(ref)
    compress_(only_mlp, SparseMLPConfig(rebuild_norms=False))
    idx = torch.randint(0, ref.config.vocab_size, (2, 32))
    grads = []
    for m in (ref, model):
        _, loss = m(idx, idx)
        loss.backward()
        grads.append([p.grad for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    with_rebuild, without = _kept_bytes(model, idx), _kept_bytes(only_mlp, idx)
    n_bytes = idx.numel() * ref.config.n_embd * 4  # one norm output per norm, float32
    # ln_1 (read by c_attn) and ln_2 (read by the MLP) in every block are no longer kept
    assert without - with_rebuild >= 2 * ref.config.n_layer * n_bytes


def test_a_norm_input_changed_in_place_after_the_forward_is_an_error_not_a_wrong_gradient():
    from actzip.errors import ActzipError

    class InPlaceResidual(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.proj = nn.RMSNorm(8), nn.Linear(8, 8)

        def forward(self, x):
            x = x * 1.0
            y = self.proj(self.norm(x))
            x.add_(1.0)  # the norm's input changes after its output was consumed
            return y

    model = InPlaceResidual()
    mark_norm_outputs(model)
    rebuild_projection_inputs(model)
    y = model(torch.randn(4, 8, requires_grad=True))
    # the projection's backward runs first and rebuilds the norm output: the check there raises
    with pytest.raises(ActzipError, match="modified in place"):
        y.square().sum().backward()


def _hf_block(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    return Block(norm=LlamaRMSNorm).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_upcasting_norm_keeps_its_input_not_its_float32_copy_and_gradients_are_identical(dtype):
    ref = _hf_block(dtype)
    marked = copy.deepcopy(ref)
    mark_norm_outputs(marked)
    x = torch.randn(64, 32).to(dtype)
    assert all(torch.equal(a, b) for a, b in zip(*gradients((ref, marked), x)))
    plain, rebuilt = saved_bytes(ref, x.clone().requires_grad_()), saved_bytes(marked, x.clone().requires_grad_())
    upcast = x.numel() * 4
    # LlamaRMSNorm saves x.float() for pow and for the multiply by rsqrt: both are handles now
    assert rebuilt.by_rule["rebuilt"].dense_bytes - plain.by_rule["rebuilt"].dense_bytes >= 2 * upcast
    # what is left of them is x itself (half the float32 copy's bytes), and the MLP's input is rebuilt too
    assert rebuilt.bytes_after <= plain.bytes_after - upcast


def test_a_cast_of_another_tensor_or_a_narrowing_cast_is_not_an_upcast_of_the_input():
    from actzip.memory.cache.rebuild import is_upcast_of

    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    y = x * 2
    assert is_upcast_of(x.float(), x) and is_upcast_of(y.float(), y)
    assert not is_upcast_of(y.float(), x)  # a cast of another tensor
    assert not is_upcast_of(y.float().to(torch.bfloat16), y)  # not wider
    assert not is_upcast_of(y.float().t(), y)  # another layout
    assert not is_upcast_of((y.float() + 0), y)  # not a cast at all


def tiny_hybrid():
    from actzip_bench.hybrid_memory import build_hybrid

    torch.manual_seed(0)
    return build_hybrid("nemotron-h-tiny", 32).to(torch.bfloat16)


def identical_step_gradients(models, idx) -> bool:
    """Whether one loss.backward() of each transformers causal LM on ``idx`` gives bit-identical parameter
    gradients."""
    grads = []
    for m in models:
        m(input_ids=idx, labels=idx).loss.backward()
        grads.append([p.grad for p in m.parameters()])
    return all(all(torch.equal(a, b) for a, b in zip(grads[0], g)) for g in grads[1:])


def kept_account(m, idx):
    """The cache's count of what a transformers causal LM keeps for backward after one forward on ``idx``."""
    counter = CacheContext.count_only()
    with counter:
        m(input_ids=idx, labels=idx)
    return counter.last


def test_nemotron_h_norms_keep_their_inputs_through_compress_and_gradients_are_identical():
    ref = tiny_hybrid()
    model, without = copy.deepcopy(ref), copy.deepcopy(ref)
    torch_codec = {"kernel": "torch"}  # bf16 arithmetic is inexact in Triton's CPU interpreter
    compress_(model, SparseMLPConfig(codec_options=torch_codec))
    compress_(without, SparseMLPConfig(codec_options=torch_codec, rebuild_norms=False))
    idx = torch.randint(0, ref.config.vocab_size, (2, 32))
    assert identical_step_gradients((ref, model), idx)
    kept = {name: kept_account(m, idx).bytes_after for name, m in (("with", model), ("without", without))}
    norms = sum(is_norm(m) for m in ref.model.layers.modules())
    # every block norm: its float32 copy (4 bytes an element) gives way to its bf16 input, its output is rebuilt
    assert kept["without"] - kept["with"] >= norms * idx.numel() * ref.config.hidden_size * 4


def test_mamba_mixers_rebuild_their_in_projection_output_and_gradients_are_identical():
    from actzip.memory.modules.norm_rebuild import is_mamba_mixer

    ref = tiny_hybrid()
    torch_codec = {"kernel": "torch"}
    model, without = copy.deepcopy(ref), copy.deepcopy(ref)
    report = compress_(model, SparseMLPConfig(codec_options=torch_codec))
    compress_(without, SparseMLPConfig(codec_options=torch_codec, rebuild_mamba_projections=False))
    assert any("rebuild_mamba_projections" in n for n in report.notes)
    idx = torch.randint(0, ref.config.vocab_size, (2, 32))
    assert identical_step_gradients((ref, model), idx)
    kept = {name: kept_account(m, idx) for name, m in (("with", model), ("without", without))}
    mixers = [m for m in ref.modules() if is_mamba_mixer(m)]
    # what each mixer keeps of its in-projection output (bf16) is rebuilt instead: on the CPU, transformers' PyTorch
    # path of the mixer keeps views of it, the convolution's input among them (the fused scan keeps it whole)
    rebuilt = kept["with"].by_rule["rebuilt"].dense_bytes - kept["without"].by_rule["rebuilt"].dense_bytes
    assert rebuilt >= len(mixers) * idx.numel() * mixers[0].conv_dim * 2
    assert kept["with"].bytes_after < kept["without"].bytes_after


def test_rebuild_mamba_projections_must_be_a_bool():
    from actzip.errors import ConfigError

    with pytest.raises(ConfigError, match="rebuild_mamba_projections"):
        SparseMLPConfig(rebuild_mamba_projections=1)


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(cfg).to(torch.bfloat16)


def test_norm_rebuild_config_on_a_swiglu_llama_frees_the_norm_outputs_exactly_and_restores():
    import actzip
    from actzip.memory.modules import NormRebuildConfig
    from actzip.memory.modules.rms_norm import ExactRMSNorm

    ref = _tiny_llama()
    model = copy.deepcopy(ref)
    with pytest.raises(actzip.errors.NothingToCompressError):  # SwiGLU: no relu MLP to fuse
        compress_(copy.deepcopy(ref), SparseMLPConfig())
    report = compress_(model, NormRebuildConfig())
    n_norms = sum(type(m).__name__ == "LlamaRMSNorm" for m in ref.modules())
    assert sum(isinstance(m, ExactRMSNorm) for m in model.modules()) == n_norms == 5
    assert any("projection(s)" in n for n in report.notes)
    idx = torch.randint(0, 64, (2, 16))
    assert identical_step_gradients((ref, model), idx)
    kept = {}
    for name, m in (("plain", ref), ("rebuilt", model)):
        with actzip.cache("2bit", min_bytes=0) as c:
            m(input_ids=idx, labels=idx)
        kept[name] = c.last
    # q/k/v and the MLP's gate/up read a norm output: rebuilt (0 bytes) instead of stored in 2 bits, and the norms
    # keep their bf16 input instead of a float32 copy and the normalized input
    assert kept["rebuilt"].by_rule["rebuilt"].dense_bytes >= 4 * idx.numel() * 32 * 2
    assert kept["rebuilt"].bytes_after < kept["plain"].bytes_after
    assert len(restore_(model)) and not any(isinstance(m, ExactRMSNorm) for m in model.modules())


def test_norm_rebuild_config_needs_a_norm_and_hooks_once():
    from actzip.errors import ConfigError, NothingToCompressError
    from actzip.memory.modules import NormRebuildConfig

    with pytest.raises(NothingToCompressError, match="no norm"):
        compress_(nn.Sequential(nn.Linear(4, 4)), NormRebuildConfig())
    model = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8))
    report = compress_(model, NormRebuildConfig())
    assert report.swapped == [("0", "output marked, rebuilt in backward by its consumers")]
    with pytest.raises(NothingToCompressError, match="earlier compress_"):
        compress_(model, NormRebuildConfig())
    with pytest.raises(ConfigError, match="rebuild_mamba_projections"):
        NormRebuildConfig(rebuild_mamba_projections="no")


def test_compress_swaps_transformers_rms_norms_gradients_stay_identical_and_restore_brings_them_back():
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHRMSNorm

    from actzip.memory.modules.rms_norm import ExactRMSNorm

    ref = tiny_hybrid()
    model = copy.deepcopy(ref)
    report = compress_(model, SparseMLPConfig(codec_options={"kernel": "torch"}))
    n_norms = sum(isinstance(m, NemotronHRMSNorm) for m in ref.modules())
    assert sum(isinstance(m, ExactRMSNorm) for m in model.modules()) == n_norms > 0
    assert any("ExactRMSNorm" in note for note in report.notes)
    idx = torch.randint(0, ref.config.vocab_size, (2, 32))
    assert identical_step_gradients((ref, model), idx)
    restore_(model)
    assert sum(isinstance(m, NemotronHRMSNorm) for m in model.modules()) == n_norms
    assert not any(isinstance(m, ExactRMSNorm) for m in model.modules())
