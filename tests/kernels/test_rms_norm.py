"""The exact RMSNorm's Triton kernels (:mod:`actzip.kernels.rms_norm`) against their PyTorch references
(:mod:`actzip.kernels.rms_norm_reference`).

On CUDA bit for bit (the kernels round as PyTorch's ops do); under Triton's CPU interpreter, which computes
in NumPy and rounds to bf16 its own way, results from fp16 inputs bit for bit, from bf16 inputs close (within 2^-5 of each row's largest value).
"""

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

from actzip.errors import ConfigError  # noqa: E402
from actzip.kernels import rms_norm as K  # noqa: E402
from actzip.kernels import rms_norm_reference as R  # noqa: E402

from kernel_cases import DEVICES, assert_bit_equal  # noqa: E402

SHAPES = [(1, 17), (7, 64), (33, 96), (5, 1000), (64, 1024), (3, 3072)]


def inputs(n, d, dtype, device, seed):
    """x with rows of very different scales (a zero row among them), w near 1, gy, r as transformers makes it,
    and a per-row g_p."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-4, 4, n)[:, None] if n > 1 else torch.ones(1, 1)
    x = torch.randn(n, d, generator=g) * scale
    if n > 2:
        x[1] = 0.0
    w = 1 + torch.randn(d, generator=g) / 3
    gy = torch.randn(n, d, generator=g)
    gp = torch.randn(n, generator=g) * 1e-3
    x, w, gy = (t.to(device=device, dtype=dtype) for t in (x, w, gy))
    r = torch.rsqrt(R.squares(x).mean(-1) + 1e-6)
    return x, w, gy, r, gp.to(device)


def same(got, want, device, dtype):
    if device == "cuda" or dtype != torch.bfloat16:
        assert_bit_equal(got, want)
    else:  # the interpreter rounds to bf16 its own way, before sums that may cancel: close within each row
        tol = want.float().abs().amax(-1, keepdim=True) * 2.0**-5
        assert ((got.float() - want.float()).abs() <= tol).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", K.FORMS)
def test_every_kernel_equals_its_reference(device, dtype, form):
    for i, (n, d) in enumerate(SHAPES):
        x, w, gy, r, gp = inputs(n, d, dtype, device, seed=i)
        assert_bit_equal(K.squares(x), R.squares(x))  # one float32 product: exact everywhere
        same(K.tail(x, r, w, form), R.tail(x, r, w, form), device, dtype)
        for got, want in zip(K.grad_parts(x, r, w, gy, form), R.grad_parts(x, r, w, gy, form)):
            same(got, want, device, dtype)
        same(K.grad_input(x, r, w, gy, gp, form), R.grad_input(x, r, w, gy, gp, form), device, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_are_refused_by_name(device):
    x, w, gy, r, gp = inputs(4, 32, torch.bfloat16, device, seed=0)
    with pytest.raises(ConfigError, match="form"):
        K.tail(x, r, w, "gemma")
    with pytest.raises(ConfigError, match="x must be"):
        K.tail(x.float(), r, w, K.FORMS[0])
    with pytest.raises(ConfigError, match="x must be"):
        K.tail(x.t(), r, w, K.FORMS[0])
    with pytest.raises(ConfigError, match="w must be"):
        K.tail(x, r, w[:-1], K.FORMS[0])
    with pytest.raises(ConfigError, match="w must be"):
        K.grad_parts(x, r, w.half(), gy, K.FORMS[1])


@pytest.mark.parametrize("device", DEVICES)
def test_no_rows_is_no_launch(device):
    x, w, gy, r, gp = inputs(4, 32, torch.float16, device, seed=0)
    assert K.tail(x[:0], r[:0], w, K.FORMS[0]).shape == (0, 32)
    assert K.squares(x[:0]).shape == (0, 32)
