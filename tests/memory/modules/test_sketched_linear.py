"""SketchedLinear: exact output, input and bias gradients; unbiased, exactly rank-k weight gradient."""

import copy
import math
import warnings

import pytest
import torch
import torch.nn as nn

import actzip.codecs.sketch  # noqa: F401  (registers the codec)
from actzip.codecs.sketch import derive_seed, sketch_matrix
from actzip.errors import ConfigError, NothingToCompressError
from actzip.memory.cache import CacheConfig, CacheContext as ActivationCache
from actzip.memory.modules import SketchedLinear, SketchedLinearConfig, compress_, restore_


def pair(d_in, d_out, bias=True, **kw):
    ref = nn.Linear(d_in, d_out, bias=bias)
    return ref, SketchedLinear(copy.deepcopy(ref), **kw)


def run(module, x, g):
    x = x.clone().requires_grad_()
    y = module(x)
    y.backward(g)
    return y.detach(), x.grad, module.bias.grad if module.bias is not None else None, module.weight.grad


@pytest.mark.parametrize("shape", [(33, 48), (4, 9, 48), (2, 3, 5, 48)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", ["gaussian", "sign"])
def test_output_and_exact_grads_bit_identical(shape, bias, kind):
    ref, sk = pair(48, 80, bias=bias, rank=6, kind=kind)
    x = torch.randn(shape)
    g = torch.randn(*shape[:-1], 80)
    y0, gx0, gb0, _ = run(ref, x, g)
    y1, gx1, gb1, gw1 = run(sk, x, g)
    assert torch.equal(y0, y1)
    assert torch.equal(gx0, gx1)
    if bias:
        assert torch.equal(gb0, gb1)
    # the weight gradient is the product of the two factors, with the S of the seed used
    s = sketch_matrix(48, 6, sk.last_seed, kind)
    xs = x.reshape(-1, 48) @ s
    expected = (g.reshape(-1, 80).t() @ xs) @ s.t()
    assert gw1.shape == sk.weight.shape
    assert torch.allclose(gw1, expected, rtol=1e-5, atol=1e-5)


def test_no_grad_and_frozen_paths():
    ref, sk = pair(16, 8, rank=4)
    x = torch.randn(5, 16)
    with torch.no_grad():
        assert torch.equal(ref(x), sk(x))
    assert sk.calls == 0
    sk.weight.requires_grad_(False)
    ref.weight.requires_grad_(False)
    _, gx0, gb0, _ = run(ref, x, torch.ones(5, 8))
    _, gx1, gb1, gw1 = run(sk, x, torch.ones(5, 8))
    assert torch.equal(gx0, gx1) and torch.equal(gb0, gb1) and gw1 is None


@pytest.mark.parametrize("kind, dtype", [("gaussian", torch.float64), ("sign", torch.float64),
                                         ("sign", torch.bfloat16)])  # bf16: the 16-bit sign route
def test_weight_grad_unbiased(kind, dtype):
    torch.manual_seed(3)
    d_in, d_out, n, k = 10, 4, 1500, 3
    lin = nn.Linear(d_in, d_out, bias=False).to(dtype)
    sk = SketchedLinear(lin, rank=k, kind=kind, seed=11)
    x = torch.randn(6, d_in, dtype=dtype)
    g = torch.randn(6, d_out, dtype=dtype)
    exact = g.double().t() @ x.double()
    samples = []
    for _ in range(n):
        sk.weight.grad = None
        sk(x).backward(g)
        samples.append(sk.weight.grad.double())
    samples = torch.stack(samples)
    assert len({float(s[0, 0]) for s in samples[:20]}) == 20  # a fresh S each step
    se = samples.std(0) / n**0.5
    z = (samples.mean(0) - exact) / se
    assert z.abs().max() < 4.5
    assert z.abs().mean() < 1.2


def test_seeds_per_call():
    _, sk = pair(8, 4, rank=2, seed=5)
    x = torch.randn(3, 8)
    seeds = []
    for _ in range(3):
        sk(x).sum().backward()
        seeds.append(sk.last_seed)
    assert seeds == [derive_seed(5, i) for i in range(3)]
    assert sk.calls == 3


def test_factored_grad():
    ref, sk = pair(24, 12, rank=5, factored_grad=True)
    x = torch.randn(2, 7, 24)
    sk(x).backward(torch.randn(2, 7, 12))
    left, right = sk.weight.actzip_factors
    assert left.shape == (12, 5) and right.shape == (5, 24)
    assert torch.equal(left @ right, sk.weight.grad)
    # used twice in one pass: factors of both uses, concatenated
    sk.zero_grad()
    (sk(x).square().sum() + sk(x[:, :3]).sum()).backward()
    left, right = sk.weight.actzip_factors
    assert left.shape == (12, 10) and right.shape == (10, 24)
    assert torch.allclose(left @ right, sk.weight.grad, atol=1e-4)
    # gradient accumulation without zeroing: factors keep up with weight.grad
    sk(x).sum().backward()
    left, right = sk.weight.actzip_factors
    assert left.shape == (12, 15)
    assert torch.allclose(left @ right, sk.weight.grad, atol=1e-4)
    # zero_grad() (set_to_none) restarts them
    sk.zero_grad()
    sk(x).sum().backward()
    assert sk.weight.actzip_factors[0].shape == (12, 5)


def test_no_factors_by_default():
    _, sk = pair(8, 4, rank=2)
    sk(torch.randn(3, 8)).sum().backward()
    assert not hasattr(sk.weight, "actzip_factors")


def test_saved_bytes_recorded():
    _, sk = pair(64, 32, rank=8)
    x = torch.randn(4, 10, 64, requires_grad=True)
    cache = ActivationCache(CacheConfig())
    with cache:
        y = sk(x)
    y.sum().backward()
    stats = cache.last.by_rule["sketch"]
    assert stats.tensors == 1 and stats.dense_bytes == x.numel() * 4
    assert stats.stored_bytes == x.numel() * 4 * 8 // 64


def test_saves_no_input():
    _, sk = pair(64, 32, rank=8)
    x = torch.randn(20, 64, requires_grad=True)
    y = sk(x)
    saved = [t for t in y.grad_fn.saved_tensors if t is not None]
    assert all(t.data_ptr() != x.data_ptr() for t in saved)
    assert sum(t.numel() for t in saved if t.shape != sk.weight.shape) == 20 * 8


def test_state_dict_and_parameters_shared():
    ref = nn.Linear(6, 3)
    sk = SketchedLinear(ref, rank=2)
    assert list(sk.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    assert sk.weight is ref.weight and sk.bias is ref.bias
    assert list(SketchedLinear(nn.Linear(6, 3, bias=False), rank=2).state_dict()) == ["weight"]
    assert "rank=2" in repr(sk)


@pytest.mark.parametrize("kw", [{"rank": 0}, {"rank": 2, "kind": "x"}, {"rank": 2, "seed": -3}])
def test_bad_options(kw):
    with pytest.raises(ConfigError):
        SketchedLinear(nn.Linear(4, 4), **kw)
    with pytest.raises(ConfigError):
        SketchedLinear(nn.Conv1d(1, 1, 1), rank=1)


def test_compress_with_sketched_linear_config():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Sequential(nn.Linear(64, 16), nn.Linear(16, 3)))
    keys = list(model.state_dict())
    ref = copy.deepcopy(model)
    report = compress_(model, SketchedLinearConfig(), filter_fn=lambda m, n: m.out_features != 3)
    assert [n for n, _ in report.swapped] == ["0", "2.0"] and ("2.1", "excluded by filter_fn") in report.skipped
    assert isinstance(model[0], SketchedLinear) and model[0].rank == 4
    assert isinstance(model[2][0], SketchedLinear) and model[2][0].rank == 8
    assert type(model[2][1]) is nn.Linear
    assert list(model.state_dict()) == keys
    x = torch.randn(5, 32)
    assert torch.equal(model(x), ref(x))
    assert model[0].seed != model[2][0].seed
    report = compress_(model, SketchedLinearConfig(rank=2, kind="sign"))
    assert [n for n, _ in report.swapped] == ["2.1"] and model[2][1].rank == 2 and model[2][1].kind == "sign"
    with pytest.raises(ConfigError, match="rank_ratio"):
        SketchedLinearConfig(rank_ratio=0)
    with pytest.raises(NothingToCompressError, match="model itself is an nn.Linear"):
        compress_(nn.Linear(2, 2), SketchedLinearConfig())


def test_restore_after_training_keeps_the_trained_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    compress_(model, SketchedLinearConfig(rank=4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(10, 16)).square().mean().backward()
    opt.step()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 16)
    y = model(x)
    assert restore_(model) == ["SketchedLinearConfig"]
    assert type(model[0]) is nn.Linear and type(model[2]) is nn.Linear
    assert model.state_dict().keys() == trained.keys()
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    assert torch.equal(model(x), y)


def test_sketch_linears_alias_keeps_the_old_signature_and_warns_once():
    from actzip import compat
    from actzip.memory import sketch_linears_

    compat.warned.discard("actzip.memory.sketch_linears_")
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Sequential(nn.Linear(64, 16), nn.Linear(16, 3)))
    with pytest.warns(FutureWarning, match=r"actzip.memory.sketch_linears_ is deprecated.*SketchedLinearConfig"):
        names = sketch_linears_(model, filter_fn=lambda n, m: m.out_features != 3)  # the old (name, module) order
    assert names == ["0", "2.0"] and model[0].rank == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        assert sketch_linears_(model, rank=2, kind="sign") == ["2.1"] and model[2][1].rank == 2
        assert sketch_linears_(model) == []  # nothing left: the old function returned an empty list
    with pytest.raises(ConfigError):
        sketch_linears_(nn.Sequential(nn.Linear(2, 2)), rank_ratio=0)


def test_chunked_rows_match_the_whole_product(monkeypatch):
    # Inputs whose float32 copy would pass CHUNK_BYTES are cast a slice of rows at a time: the same sketch and
    # the same gradient factors, up to float32 summation order.
    from actzip.memory.modules import sketched_linear as lin_mod

    torch.manual_seed(0)
    base = nn.Linear(32, 24).to(torch.bfloat16)
    x = torch.randn(4, 50, 32, dtype=torch.bfloat16)
    grads, calls = {}, []
    real_apply = lin_mod.sketch_apply
    monkeypatch.setattr(lin_mod, "sketch_apply", lambda x, s: calls.append(x.shape) or real_apply(x, s))
    for rows in (10_000, 16):  # one slice / many slices of about 16 rows (the last one partial)
        monkeypatch.setattr(lin_mod, "CHUNK_BYTES", rows * 32 * 4)
        calls.clear()
        sk = SketchedLinear(base, rank=8, kind="gaussian", seed=3, factored_grad=True)  # sign: no float32 copy
        sk.weight.grad = None
        sk(x).float().pow(2).sum().backward()
        assert len(calls) == (1 if rows == 10_000 else 200 // 16 + 1)  # 200 rows of x in slices of 16
        grads[rows] = (sk.weight.grad.float().clone(), [f.clone() for f in sk.weight.actzip_factors])
        del sk.weight.actzip_factors
    (g_whole, f_whole), (g_chunk, f_chunk) = grads[10_000], grads[16]
    assert torch.allclose(f_whole[0], f_chunk[0], rtol=1e-5, atol=1e-5) and torch.equal(f_whole[1], f_chunk[1])
    assert torch.allclose(g_whole, g_chunk, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sign_sketch_of_16_bit_inputs_stays_16_bit(dtype, device, monkeypatch):
    # x S with the signs scaled by a power of two (exact in 16 bits) in x's own dtype, and the weight gradient
    # from it with the scale folded into the small factor: no float32 copy of x is made.
    from actzip.codecs.sketch import sign_matrix
    from actzip.memory.modules import sketched_linear as lin_mod

    monkeypatch.setattr(lin_mod, "sketch_apply", lambda *a: pytest.fail("the float32 route was taken"))
    torch.manual_seed(1)
    k, d_in, d_out = 24, 96, 40
    base = nn.Linear(d_in, d_out, bias=False).to(device, dtype)
    sk = SketchedLinear(base, rank=k, seed=7, factored_grad=True)
    x = torch.randn(3, 50, d_in, dtype=dtype, device=device) * 4
    g = torch.randn(3, 50, d_out, dtype=dtype, device=device)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = sk(x)
    y.backward(g)
    signs = sign_matrix(d_in, k, sk.last_seed, device=device, dtype=torch.float32)
    c = 2.0 ** -round(math.log2(k) / 2)
    xs = torch.matmul(x, signs.to(dtype) * c)
    assert any(t.dtype == dtype and t.shape == (3, 50, k) and torch.equal(t, xs) for t in saved)
    left = g.reshape(-1, d_out).float().t() @ xs.reshape(-1, k).float() / (k * c)
    left_f, right_f = sk.weight.actzip_factors
    assert torch.allclose(left_f, left, rtol=1e-4, atol=1e-4) and torch.equal(right_f, signs.t())
    expect = (left_f @ right_f).to(dtype)
    if device == "cpu":
        assert torch.equal(sk.weight.grad, expect)
    else:  # the backward thread's cuBLAS handle may pick another kernel: a last-bit flip in 16 bits
        torch.testing.assert_close(sk.weight.grad, expect)
