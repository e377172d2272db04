"""ExactRMSNorm: transformers' RMSNorms with the same bits forward and backward, keeping only the input and one
float32 scale per row; swapped in by compress_(SparseMLPConfig()) where the probe recognizes the class's form."""

import copy
import warnings

import pytest
import torch
import torch.nn as nn

from actzip.kernels import runtime
from actzip.memory.cache import CacheContext
from actzip.memory.modules.rms_norm import ExactRMSNorm, exact_form

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHRMSNorm  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def norm(cls, d, dtype, device, seed=0):
    torch.manual_seed(seed)
    m = cls(d, eps=1e-5).to(device=device, dtype=dtype)
    with torch.no_grad():
        m.weight.copy_(1 + torch.randn(d) / 3)
    return m


def forward_backward(m, x, gy):
    x = x.clone().requires_grad_()
    y = m(x)
    return [y, *torch.autograd.grad(y, (x, m.weight), gy)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls", [LlamaRMSNorm, NemotronHRMSNorm])
def test_output_and_gradients_are_bit_identical_to_transformers(device, dtype, cls):
    for i, (shape, scale) in enumerate([((2, 9, 64), 1.0), ((3, 5, 1000), 1e-3), ((1, 4, 2048), 30.0)]):
        ref = norm(cls, shape[-1], dtype, device, seed=i)
        form = exact_form(ref)
        assert form is not None
        exact = ExactRMSNorm(copy.deepcopy(ref), form)
        g = torch.Generator().manual_seed(i)
        x = (torch.randn(shape, generator=g) * scale).to(device=device, dtype=dtype)
        gy = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
        for a, b in zip(forward_backward(ref, x, gy), forward_backward(exact, x, gy)):
            assert torch.equal(a, b)


def test_it_keeps_its_input_and_one_scale_per_row_and_its_output_is_a_rebuild_handle():
    ref = norm(NemotronHRMSNorm, 256, torch.bfloat16, "cpu")
    exact = ExactRMSNorm(copy.deepcopy(ref), exact_form(ref))
    proj = nn.Linear(256, 8, bias=False).to(torch.bfloat16)
    x = torch.randn(4, 32, 256, dtype=torch.bfloat16, requires_grad=True) * 1.0  # not a leaf: the account counts it
    kept = {}
    for name, m in (("transformers", ref), ("exact", exact)):
        counter = CacheContext.count_only()
        with counter:
            m(x)
        kept[name] = counter.last.bytes_after
    rows = x.numel() // 256
    # x (bf16) and r (float32 a row, small enough that the account may leave it out); the weight is a parameter
    assert x.numel() * 2 <= kept["exact"] <= x.numel() * 2 + rows * 4
    assert kept["transformers"] >= x.numel() * (4 + 2)  # at least its float32 copy of x and the normalized x
    # a projection fed its output keeps a handle instead of it once the projection hooks are on
    from actzip.memory.modules.norm_rebuild import rebuild_projection_inputs

    model = nn.Sequential(exact, proj)
    rebuild_projection_inputs(model)
    counter = CacheContext.count_only()
    with counter:
        model(x)
    assert counter.last.bytes_after == kept["exact"]


def test_a_class_of_another_form_is_left_as_it_is():
    class ScaledRMSNorm(LlamaRMSNorm):
        def forward(self, hidden_states):
            return super().forward(hidden_states) * 2

    ScaledRMSNorm.__module__ = "transformers.models.fake"
    m = ScaledRMSNorm(32).to(torch.bfloat16)
    assert exact_form(m) is None
    assert exact_form(LlamaRMSNorm(32)) is None  # float32 weights: left to the norm hooks


def test_inputs_it_does_not_take_go_to_the_original_forward_announced_once_and_counted():
    ref = norm(LlamaRMSNorm, 32, torch.bfloat16, "cpu")
    exact = ExactRMSNorm(copy.deepcopy(ref), exact_form(ref))
    runtime.reset_fallbacks()
    x = torch.randn(3, 32)  # float32: LlamaRMSNorm promotes against the bf16 weight
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert torch.equal(exact(x), ref(x))
    assert sum("ExactRMSNorm" in str(w.message) for w in caught) == 1
    assert sum(n for k, n in runtime.fallback_counts().items() if k.startswith("ExactRMSNorm")) == 3
    xt = torch.randn(32, 3, dtype=torch.bfloat16).t()  # not contiguous
    assert torch.equal(exact(xt), ref(xt))


@pytest.mark.cuda
def test_a_cuda_step_through_the_kernels_never_synchronizes_with_the_host():
    ref = norm(NemotronHRMSNorm, 1024, torch.bfloat16, "cuda")
    exact = ExactRMSNorm(copy.deepcopy(ref), exact_form(ref))
    proj = nn.Linear(1024, 64, bias=False, device="cuda", dtype=torch.bfloat16)
    model = nn.Sequential(exact, proj)
    from actzip.memory.modules.norm_rebuild import rebuild_projection_inputs

    rebuild_projection_inputs(model)
    x = torch.randn(8, 512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    model(x).float().square().sum().backward()  # compiles the kernels first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(x).float().square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_under_a_lossy_cache_what_it_keeps_is_treated_as_a_norm_s():
    import actzip

    ref = norm(NemotronHRMSNorm, 256, torch.bfloat16, "cpu")
    exact = ExactRMSNorm(copy.deepcopy(ref), exact_form(ref))
    x = torch.randn(4, 32, 256, dtype=torch.bfloat16, requires_grad=True) * 1.0
    with actzip.cache("2bit", min_bytes=0) as c:
        exact(x)
    rules = set(c.last.by_rule)
    # the 2bit preset stores a norm's tensors in 4 bits to nearest and "other" tensors in 2 bits
    assert any(r.startswith("norm:") for r in rules) and not any(r.startswith("other:") for r in rules)
