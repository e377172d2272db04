"""CARE-LoRA's fit: the ridge solve, Cholesky QR, float32 moments of 16-bit input, robustness to bad input."""

import torch

from actzip.memory.lora import fit_reconstruction, orthonormal_rows, solve_ridge

D_IN, D_OUT, R = 48, 40, 4


def test_orthonormal_rows():
    a = torch.randn(5, 40, dtype=torch.float64)
    w = orthonormal_rows(a)
    torch.testing.assert_close(w @ w.t(), torch.eye(5, dtype=torch.float64))
    # the same row space: projecting a onto w's rows gives a back
    torch.testing.assert_close(a @ w.t() @ w, a)
    assert orthonormal_rows(torch.full((2, 8), float("nan"))).isnan().all()


def test_fit_is_robust_and_never_silently_finite_on_bad_input():
    h = torch.randn(50, D_IN)
    assert torch.equal(fit_reconstruction(torch.zeros(50, R), h, 1e-6), torch.zeros(R, D_IN))
    z = torch.randn(50, 1).repeat(1, R)  # rank one: ZᵀZ singular
    m = fit_reconstruction(z, h, 1e-6)
    assert torch.isfinite(m).all()
    torch.testing.assert_close(z @ m, z[:, :1] @ torch.linalg.lstsq(z[:, :1], h).solution, rtol=1e-3, atol=1e-4)
    bad = h.clone()
    bad[3, 4] = float("nan")
    assert torch.isnan(fit_reconstruction(torch.randn(50, R), bad, 1e-6)).any()
    g = torch.full((1, R, R), float("nan"))
    assert torch.isnan(solve_ridge(g, torch.ones(1, R, D_IN), 1e-6)).all()


def test_fit_in_float32_for_bfloat16_and_chunked():
    z, h = torch.randn(100, R).bfloat16(), torch.randn(100, D_IN).bfloat16()
    m = fit_reconstruction(z, h, 1e-6, chunk_rows=7)
    assert m.dtype == torch.float32
    torch.testing.assert_close(m, fit_reconstruction(z.float(), h.float(), 1e-6), rtol=1e-4, atol=1e-5)
