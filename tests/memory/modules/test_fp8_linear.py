"""FP8 linear layers: numerics against a float64 reference of the float8 operands, and exact gradients when the
fused ReLU² MLP (with or without the activation cache) runs them."""

import copy
import inspect
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actzip
from actzip.errors import ConfigError, NothingToCompressError
from actzip.memory.cache import CacheContext as ActivationCache
from actzip.memory.modules import (
    Fp8Linear,
    Fp8LinearConfig,
    SparseGatedReLUMLP,
    SparseMLPConfig,
    SparseReLUMLP,
    compress_,
    restore_,
)
from actzip.memory.modules import fp8_linear as F8
from actzip.memory.modules.fp8_linear import E4M3, E5M2, quantize_tensorwise
from actzip_bench.models.gpt import GPT, GPTConfig

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def dequantized(q, s):
    return q.double() * s.double()


def assert_within_matmul_bound(got, a, sa, b, sb, bias=None, accum_roundoff=2.0**-24):
    """``got`` ≈ ``(q_a s_a) @ (q_b s_b)ᵀ (+ bias)``, computed in float64, within the worst-case error of any
    summation order: ``(k + 2) u_acc Σ|a_i b_i|`` for the accumulation (``u_acc`` 2^-24 for fp32) and the
    dequantized operands (CPU), plus a rounding of the result (and one more for the bias) in its dtype; times 2
    for the second-order terms. A wrong scale or a mis-laid-out operand is off by far more."""
    da, db = dequantized(a, sa), dequantized(b, sb)
    ref = da @ db.t()
    size = da.abs() @ db.abs().t()
    u_out = UNIT_ROUNDOFF[got.dtype]
    bound = 2 * (a.shape[1] + 2) * accum_roundoff * size + 2 * u_out * ref.abs()
    if bias is not None:
        ref = ref + bias.double()
        bound = bound + 2 * u_out * (ref.abs() + bias.double().abs())
    err = (got.double() - ref).abs()
    excess = (err - bound).max().item()
    assert excess <= 1e-30, f"max error {err.max().item():.3g}, exceeds the bound by {excess:.3g}"


# -- quantization ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", [E4M3, E5M2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantization_rounds_once_and_saturates_at_the_range(fp8, dtype):
    x = (torch.randn(64, 48) * 3).to(dtype)
    x[0, 0] = 0.0
    q, s = quantize_tensorwise(x, fp8)
    assert q.dtype == fp8 and q.is_contiguous() and s.dtype == torch.float32 and s.dim() == 0
    fmax = F8.FP8_MAX[fp8]
    scale = fmax / x.abs().amax().float()
    assert torch.equal(q, (x.float() * scale).clamp(-fmax, fmax).to(fp8))
    assert q.float().abs().max().item() == fmax  # the largest element lands on the top of the range
    assert q.view(torch.uint8)[0, 0].item() == 0  # +0.0 stays +0.0: zeros remain zeros for the sparse codec
    # relative error of each element: half a float8 ulp, or below the smallest normal (3 / 2 mantissa bits)
    mant = 3 if fp8 == E4M3 else 2
    tiny = torch.finfo(fp8).smallest_normal * s.double()
    err = (dequantized(q, s) - x.double()).abs()
    assert bool((err <= 2.0 ** -(mant + 1) * x.double().abs() * 1.0001 + tiny).all())


def test_quantization_edge_cases():
    q, s = quantize_tensorwise(torch.zeros(32, 16), E4M3)
    assert not q.float().any() and torch.isfinite(s)
    q, s = quantize_tensorwise(torch.empty(0, 16), E4M3)
    assert q.shape == (0, 16) and torch.isfinite(s)
    x = torch.randn(32, 16)
    q, s = quantize_tensorwise(x, E4M3, pow2=True)
    assert torch.frexp(s).mantissa.item() == 0.5  # a power of two: dequantizing is exact
    assert torch.equal(q.float() * s, dequantized(q, s).float())
    x[3, 3] = float("inf")  # a non-finite tensor gives a non-finite result (loss scalers then skip the step)
    q, s = quantize_tensorwise(x, E4M3)
    assert not torch.isfinite(dequantized(q, s)).all()


# -- the layer against a float64 reference -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(48,), (21, 64), (3, 7, 64)])  # 21 tokens: padded to 32 for grad_W
@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_backward_match_the_dequantized_reference(dtype, shape, bias):
    k = shape[-1]
    layer = Fp8Linear(k, 32, bias=bias, dtype=dtype)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    y = layer(x)
    assert y.dtype == dtype and y.shape == (*shape[:-1], 32)
    g = torch.randn_like(y)
    y.backward(g)
    assert x.grad.dtype == dtype and layer.weight.grad.dtype == dtype

    x2, g2 = x.detach().reshape(-1, k), g.reshape(-1, 32)
    xq, xs = quantize_tensorwise(x2, E4M3)
    wq, ws = quantize_tensorwise(layer.weight.detach(), E4M3)
    gq, gs = quantize_tensorwise(g2, E5M2)
    b = layer.bias.detach() if bias else None
    # exact: the very ops the layer runs
    expect = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=dtype, use_fast_accum=True)
    assert torch.equal(y.detach().reshape(-1, 32), expect + b if bias else expect)
    # numerics: within the rounding bound of the float64 product of the float8 operands
    assert_within_matmul_bound(y.detach().reshape(-1, 32), xq, xs, wq, ws, b)
    assert_within_matmul_bound(x.grad.reshape(-1, k), gq, gs, wq.t(), ws)
    assert_within_matmul_bound(layer.weight.grad, gq.t(), gs, xq.t(), xs)
    if bias:  # from the unquantized gradient, as nn.Linear's
        torch.testing.assert_close(layer.bias.grad, g2.sum(0), rtol=1e-5, atol=1e-5)


def test_output_gradient_is_quantized_to_e5m2():
    # a gradient beyond e4m3's range ratio: e5m2 keeps its small entries, e4m3 would flush them
    layer = Fp8Linear(32, 16, bias=False)
    x = torch.randn(16, 32, requires_grad=True)
    g = torch.full((16, 16), 1e-4)
    g[0, 0] = 1e3
    layer(x).backward(g)
    gq, gs = quantize_tensorwise(g, E5M2)
    wq, ws = quantize_tensorwise(layer.weight.detach(), E4M3)
    assert_within_matmul_bound(x.grad, gq, gs, wq.t(), ws)


def test_no_grad_and_autocast_paths():
    layer = Fp8Linear(64, 32)
    x = torch.randn(20, 64)
    y_grad = layer(x.clone().requires_grad_())
    with torch.no_grad():
        assert torch.equal(layer(x), y_grad.detach())  # same bits, so recomputation in backward is exact
    with torch.autocast("cpu", dtype=torch.bfloat16):
        xa = x.clone().requires_grad_()
        ya = layer(xa)
    assert ya.dtype == torch.bfloat16
    ya.float().sum().backward()
    assert xa.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32


def test_empty_batch():
    layer = Fp8Linear(32, 16)
    x = torch.randn(0, 32, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad.shape == (0, 32) and not layer.weight.grad.any()


def test_refused_scaled_mm_falls_back_once_announced(monkeypatch):
    monkeypatch.setattr(F8, "_fallbacks", {})

    def refuse(*a, **kw):
        raise RuntimeError("Multiplication of two Float8_e5m2 matrices is not supported")

    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    layer = Fp8Linear(64, 32, bias=False)
    x = torch.randn(24, 64, requires_grad=True)
    with pytest.warns(UserWarning, match="refused") as rec:
        y = layer(x)
        y.backward(torch.ones_like(y))
        layer(x)
    assert len(rec) == 2  # one per combination: e4m3 x e4m3 -> fp32, and e5m2 x e4m3 -> fp32 (both gradients)
    assert sum(F8.scaled_mm_fallbacks().values()) == 4
    xq, xs = quantize_tensorwise(x.detach(), E4M3)
    wq, ws = quantize_tensorwise(layer.weight.detach(), E4M3)
    assert_within_matmul_bound(y.detach(), xq, xs, wq, ws)


def test_operands_meet_the_cuda_rules_of_scaled_mm(monkeypatch):
    # What sm_90's torch._scaled_mm checks (cuBLASLt): checked here on the CPU, which accepts more.
    real, calls = torch._scaled_mm, []

    def checked(a, b, *, scale_a, scale_b, out_dtype, use_fast_accum):
        assert a.dim() == b.dim() == 2 and a.shape[1] == b.shape[0]
        assert a.shape[1] % 16 == 0 and b.shape[0] % 16 == 0 and b.shape[1] % 16 == 0
        assert a.stride(1) == 1 and a.stride(0) % 16 == 0, "mat1 must be row-major, rows 16-byte aligned"
        assert b.stride(0) == 1 and b.stride(1) % 16 == 0, "mat2 must be column-major, columns 16-byte aligned"
        assert a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
        assert (a.dtype, b.dtype) in ((E4M3, E4M3), (E5M2, E4M3)), "e5m2 x e5m2 is refused on CUDA"
        for s in (scale_a, scale_b):
            assert s.dtype == torch.float32 and s.numel() == 1
        calls.append((a.dtype, b.dtype, out_dtype))
        return real(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, use_fast_accum=use_fast_accum)

    monkeypatch.setattr(torch, "_scaled_mm", checked)
    for shape in [(21, 64), (3, 7, 64), (64,), (0, 64)]:
        layer = Fp8Linear(64, 32, dtype=torch.bfloat16)
        x = torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True)
        layer(x).float().sum().backward()
    xt = torch.randn(64, 40, dtype=torch.bfloat16).t().requires_grad_()  # a transposed input
    layer(xt).float().sum().backward()
    assert len(calls) == 4 * 3 and not F8.scaled_mm_fallbacks()  # the empty batch needs no matmul


def test_no_host_sync_in_the_code_path():
    # On the CPU a synchronization cannot be observed; the CUDA test below runs under sync debug mode.
    src = inspect.getsource(F8)
    for call in (".item(", ".tolist(", ".cpu(", "int(amax", "float(amax", "bool("):
        assert call not in src, call


# -- shapes and swapping ----------------------------------------------------------------------------------------


def test_bad_shapes_name_the_layer():
    with pytest.raises(ConfigError, match=r"'blocks.0.up' \(40 -> 96\).*in_features=40"):
        Fp8Linear(40, 96, name="blocks.0.up")
    with pytest.raises(ConfigError, match="out_features=10"):
        Fp8Linear.from_linear(nn.Linear(64, 10), name="head")
    with pytest.raises(ConfigError, match=r"'proj' \(64 -> 32\).*\(5, 48\)"):
        Fp8Linear(64, 32, name="proj")(torch.randn(5, 48))
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    report = compress_(model, Fp8LinearConfig())
    assert [n for n, _ in report.swapped] == ["0"]
    assert report.skipped == [("2", "kept as nn.Linear (128 -> 10): out_features=10 not a multiple of 16")]
    assert type(model[2]) is nn.Linear
    with pytest.raises(ConfigError, match=r"'0' \(64 -> 128\).*\(3, 32\)"):
        model(torch.randn(3, 32))


def tiny_gpt(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=64, **kw))


def gpt_grads(model, idx):
    logits = model(idx)[0]
    logits.float().square().mean().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_compress_swaps_shares_parameters_and_composes_with_sparse_mlps():
    model = tiny_gpt()
    params = dict(model.named_parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    report = compress_(model, Fp8LinearConfig(), filter_fn=lambda mod, name: "attn" not in name)
    swapped = [n for n, _ in report.swapped]
    assert swapped and all("attn" not in n for n in swapped)
    assert all(isinstance(model.get_submodule(n), Fp8Linear) for n in swapped)
    assert dict(model.named_parameters()).keys() == params.keys()
    assert all(p is params[n] for n, p in model.named_parameters())  # shared, not copied
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())

    idx = torch.randint(0, 256, (2, 32))
    fused_after = copy.deepcopy(model)
    actzip.compress_(fused_after, SparseMLPConfig())
    fused_before = tiny_gpt()
    actzip.compress_(fused_before, SparseMLPConfig())
    compress_(fused_before, Fp8LinearConfig(), filter_fn=lambda mod, name: "attn" not in name)
    assert isinstance(fused_before.h[0].mlp.c_fc, Fp8Linear)
    y0, g0 = gpt_grads(model, idx)
    for fused in (fused_after, fused_before):
        assert isinstance(fused.h[0].mlp, SparseReLUMLP)
        y1, g1 = gpt_grads(fused, idx)
        assert torch.equal(y0, y1)
        assert g0.keys() == g1.keys() and all(torch.equal(g0[k], g1[k]) for k in g0), "gradients differ"


def test_restore_gives_back_the_linears_with_their_trained_parameters():
    model = tiny_gpt()
    ref = copy.deepcopy(model)
    compress_(model, Fp8LinearConfig(pow2_scales=True))
    assert isinstance(model.h[0].mlp.c_fc, Fp8Linear)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.randint(0, 256, (2, 32))
    gpt_grads(model, idx)
    opt.step()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    assert restore_(model) == ["Fp8LinearConfig"]
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())
    assert model.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())  # training kept
    with torch.no_grad():
        ref.load_state_dict(trained)
        assert torch.equal(model(idx)[0], ref(idx)[0])


def test_fp8_config_fields_are_checked_and_round_trip():
    with pytest.raises(ConfigError, match="Fp8LinearConfig.pow2_scales must be True or False"):
        Fp8LinearConfig(pow2_scales="yes")
    cfg = Fp8LinearConfig(fast_accum_forward=False, recast_input=True)
    assert Fp8LinearConfig.from_dict(cfg.to_dict()) == cfg


def test_old_names_forward_and_warn_once():
    from actzip import compat
    from actzip.memory import fp8_linears_

    for old in ("actzip.memory.fp8_linears_", "actzip.memory.fp8_linear.Fp8Config"):
        compat.warned.discard(old)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    with pytest.warns(FutureWarning, match=r"actzip.memory.fp8_linears_ is deprecated.*Fp8LinearConfig"):
        with pytest.warns(UserWarning, match=r"kept 1 layer.*2 \(128 -> 10\)"):
            assert fp8_linears_(model, config=F8.Fp8Config(pow2_scales=True)) == ["0"]
    assert type(model[2]) is nn.Linear and model[0].config.pow2_scales
    assert isinstance(model[0].config, Fp8LinearConfig)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # once only
        assert fp8_linears_(nn.Sequential(nn.ReLU())) == []  # nothing to swap: the old function returned []
        F8.Fp8Config()


# -- the fused ReLU² MLP: exact, and its float8 down-projection input stored sparse ------------------------------


class PlainMLP(nn.Module):
    def __init__(self, up, down, gate=None):
        super().__init__()
        self.up, self.down, self.gate = up, down, gate

    def forward(self, x):
        if self.gate is None:
            return self.down(F.relu(self.up(x)).square())
        return self.down(F.relu(self.gate(x)).square() * self.up(x))


class Blocks(nn.Module):
    def __init__(self, mlps):
        super().__init__()
        self.mlps = nn.ModuleList(mlps)

    def forward(self, x):
        for mlp in self.mlps:
            x = x + mlp(x)
        return x


def plain_and_fused(d, h, dtype, device, gated, bias=True, fused_config=None):
    torch.manual_seed(0)
    plain = Blocks([
        PlainMLP(Fp8Linear(d, h, bias=bias), Fp8Linear(h, d, bias=bias), Fp8Linear(d, h, bias=bias) if gated else None)
        for _ in range(2)
    ]).to(device=device, dtype=dtype)
    m = copy.deepcopy(plain)
    if fused_config is not None:  # for the down projections: their input is the one the fused MLPs rebuild
        for block in m.mlps:
            block.down.config = fused_config
    fused = Blocks([
        SparseGatedReLUMLP(b.gate, b.up, b.down, square=True, names=("gate", "up", "down")) if gated
        else SparseReLUMLP(b.up, b.down, square=True, names=("up", "down"))
        for b in m.mlps
    ])  # fmt: skip
    return plain, fused


def step(model, x):
    x = x.clone().requires_grad_()
    y = model(x)
    (y.float() * torch.linspace(-1, 1, y.shape[-1], device=y.device)).sum().backward()
    return y.detach(), {"x": x.grad, **{n: p.grad for n, p in model.named_parameters()}}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("cached", [True, False])
def test_fused_relu2_mlp_gradients_equal_the_plain_module(device, dtype, gated, cached):
    plain, fused = plain_and_fused(64, 256, dtype, device, gated)
    x = torch.randn(2, 72, 64, dtype=dtype, device=device)  # 144 tokens
    y0, g0 = step(plain, x)
    cache = ActivationCache()
    if cached:
        with cache:
            y1, g1 = step(fused, x)
    else:
        y1, g1 = step(fused, x)
    assert torch.equal(y0, y1)
    assert g0.keys() == g1.keys()
    for k in g0:
        assert torch.equal(g0[k], g1[k]), k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_stores_the_down_projection_fp8_input_sparse(dtype):
    d, h, tokens = 64, 512, 256  # the float8 input of down is tokens x h bytes = 128 KiB > min_bytes
    _, fused = plain_and_fused(d, h, dtype, "cpu", gated=False, bias=False)
    x = torch.randn(tokens, d, dtype=dtype, requires_grad=True)
    cache = ActivationCache()
    with cache:
        y = fused(x)
    y.float().sum().backward()
    stats = cache.last.by_rule["sparse"]
    assert stats.tensors == 2  # one per block: the float8 relu(h)² that down saves
    assert stats.dense_bytes == 2 * tokens * h
    assert stats.stored_bytes < 0.75 * stats.dense_bytes  # about half the elements are zeros
    # the float8 weights (made every call) count as activations of the step, not as leaves; here they and the
    # float8 inputs of up are under min_bytes
    assert cache.last.by_rule["small"].dense_bytes == 4 * d * h + 2 * tokens * d


@pytest.mark.parametrize("gated", [False, True])
def test_recast_input_is_exact_and_stores_nothing_for_the_down_input(gated):
    d, h, tokens = 64, 512, 256
    plain, fused = plain_and_fused(d, h, torch.bfloat16, "cpu", gated, fused_config=Fp8LinearConfig(recast_input=True))
    x = torch.randn(tokens, d, dtype=torch.bfloat16)
    y0, g0 = step(plain, x)  # plain: the float8 inputs saved
    cache = ActivationCache()
    with cache:
        y1, g1 = step(fused, x)
    assert torch.equal(y0, y1) and all(torch.equal(g0[k], g1[k]) for k in g0)
    by_rule = cache.last.by_rule
    assert "sparse" not in by_rule  # down's input is rebuilt from the payload, then cast again
    # per block: down's input (and, gated, relu(g)² saved by the product with up(x))
    assert by_rule["rebuilt"].tensors == (4 if gated else 2) and by_rule["rebuilt"].stored_bytes == 0


# -- CUDA -------------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("fast_accum", [False, True])
def test_cuda_matches_the_dequantized_reference(fast_accum):
    before = F8.scaled_mm_fallbacks()
    layer = Fp8Linear(256, 128, dtype=torch.bfloat16, device="cuda", config=Fp8LinearConfig(fast_accum_forward=fast_accum))
    x = torch.randn(3, 37, 256, dtype=torch.bfloat16, device="cuda", requires_grad=True)  # 111 tokens
    y = layer(x)
    g = torch.randn_like(y)
    y.backward(g)
    assert F8.scaled_mm_fallbacks() == before  # sm_89+/sm_90 takes every combination used
    x2, g2 = x.detach().reshape(-1, 256), g.reshape(-1, 128)
    xq, xs = quantize_tensorwise(x2, E4M3)
    wq, ws = quantize_tensorwise(layer.weight.detach(), E4M3)
    gq, gs = quantize_tensorwise(g2, E5M2)
    # Hopper's float8 tensor cores accumulate with about 14 mantissa bits before partial sums reach fp32 (for
    # longer with fast accumulation): bound the accumulation with that roundoff for all three matmuls
    u = 2.0**-13
    assert_within_matmul_bound(y.detach().reshape(-1, 128), xq, xs, wq, ws, layer.bias.detach(), accum_roundoff=u)
    assert_within_matmul_bound(x.grad.reshape(-1, 256), gq, gs, wq.t(), ws, accum_roundoff=u)
    assert_within_matmul_bound(layer.weight.grad, gq.t(), gs, xq.t(), xs, accum_roundoff=u)


@pytest.mark.cuda
def test_cuda_fp8_layer_step_has_no_host_sync():
    layer = Fp8Linear(256, 128, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(3, 37, 256, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    layer(x).float().square().mean().backward()  # warm up cuBLASLt
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(x).float().square().mean().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.cuda
def test_cuda_fused_mlp_with_arena_and_fp8_layers_has_no_host_sync():
    pytest.importorskip("triton")
    from actzip.memory.modules.arena import Arena

    torch.manual_seed(0)
    arena = Arena(64 << 20, device="cuda")
    codec = actzip.codecs.get("sparse", kernel="triton", sign_pack=True, check=False)
    up = Fp8Linear(128, 512, dtype=torch.bfloat16, device="cuda")
    # down keeps its input, which the fused MLP rebuilds from the arena's payload: nothing of it is stored
    down = Fp8Linear(512, 128, dtype=torch.bfloat16, device="cuda", config=Fp8LinearConfig(recast_input=True))
    fused = SparseReLUMLP(up, down, square=True, codec=codec, arena=arena)
    plain = PlainMLP(copy.deepcopy(up), copy.deepcopy(down))
    x = torch.randn(1000, 128, dtype=torch.bfloat16, device="cuda")
    for _ in range(2):  # warm up: compile the kernels, fill caches
        step(fused, x)
        fused.zero_grad(set_to_none=True)
        arena.reset()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y1, g1 = step(fused, x)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert arena.overflows() == 0
    y0, g0 = step(plain, x)
    assert torch.equal(y0, y1) and all(torch.equal(g0[k], g1[k]) for k in g0)
