import pytest
import torch

from actzip.errors import ConfigError
from actzip.wire.stiefel import (
    StiefelOptimizer,
    StiefelStepper,
    orthonormality_error,
    random_stiefel,
    retract,
    tangent_project,
)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see tests/conftest.py


def test_random_stiefel_is_orthonormal_and_seeded():
    a = random_stiefel(64, 8, seed=3)
    assert a.shape == (64, 8) and a.dtype == torch.float32
    assert orthonormality_error(a) < 1e-6
    assert torch.equal(a, random_stiefel(64, 8, seed=3))
    assert not torch.equal(a, random_stiefel(64, 8, seed=4))


def test_random_stiefel_leaves_global_rng_alone():
    state = torch.get_rng_state()
    random_stiefel(16, 4, seed=0)
    assert torch.equal(state, torch.get_rng_state())


def test_tangent_projection_is_tangent_and_idempotent():
    v = retract(torch.randn(32, 5, dtype=torch.float64))
    g = torch.randn(32, 5, dtype=torch.float64)
    xi = tangent_project(v, g)
    skew = v.t() @ xi
    assert torch.allclose(skew + skew.t(), torch.zeros(5, 5, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(tangent_project(v, xi), xi, atol=1e-12)


@pytest.mark.parametrize("method", ["qr", "polar"])
def test_retractions_land_on_the_manifold_and_fix_its_points(method):
    v = random_stiefel(40, 6, seed=1).double()
    y = v + 0.1 * torch.randn(40, 6, dtype=torch.float64)
    assert orthonormality_error(retract(y, method)) < 1e-12
    assert torch.allclose(retract(v, method), v, atol=1e-12)


def _pca_problem(d=24, k=3):
    g = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    eig = torch.linspace(5.0, 0.1, d, dtype=torch.float64)
    a = (basis * eig) @ basis.t()
    return a.float(), float(eig[:k].sum())


@pytest.mark.parametrize(
    "method,lr,extra,retraction", [("adam", 0.02, {}, "qr"), ("sgd", 0.02, {"momentum": 0.9}, "polar")]
)
def test_optimizer_decreases_loss_and_keeps_orthonormal(method, lr, extra, retraction):
    a, best = _pca_problem()
    v = torch.nn.Parameter(random_stiefel(24, 3, seed=0))
    opt = StiefelOptimizer([v], lr=lr, method=method, retraction=retraction, **extra)
    losses = []
    for _ in range(400):
        loss = -torch.trace(v.t() @ a @ v)  # minimized by the top-3 eigenvectors
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert orthonormality_error(v) < 1e-5
    assert losses[-1] < losses[0]
    assert -losses[-1] > 0.98 * best


def test_optimizer_rejects_bad_options():
    v = torch.nn.Parameter(random_stiefel(8, 2, seed=0))
    with pytest.raises(ConfigError, match="retraction"):
        StiefelOptimizer([v], retraction="cayley-ish")
    with pytest.raises(ConfigError, match="method"):
        StiefelOptimizer([v], method="lbfgs")
    with pytest.raises(ConfigError, match="lr"):
        StiefelOptimizer([v], lr=0)
    with pytest.raises(ConfigError, match="k <= d"):
        StiefelOptimizer([torch.nn.Parameter(torch.zeros(2, 8))])


def test_stepper_hides_the_gradient_from_other_optimizers_and_sums_microbatches():
    torch.manual_seed(0)
    v = torch.nn.Parameter(random_stiefel(16, 4, seed=0))
    w = torch.nn.Parameter(torch.randn(4))
    stepper = StiefelStepper(v, lr=0.05, method="sgd")
    other = torch.optim.AdamW([v, w], lr=0.1)
    x = torch.randn(8, 16)
    before = v.detach().clone()

    def loss_of(rows):
        return ((x[rows] @ v) * w).square().sum()

    loss_of(slice(0, 4)).backward()
    loss_of(slice(4, 8)).backward()
    assert v.grad is None and stepper.pending
    # Summed micro-batch gradients equal the full-batch gradient.
    full = torch.func.grad(lambda p: ((x @ p) * w.detach()).square().sum())(v.detach())
    assert torch.allclose(stepper._grad, full, rtol=1e-5, atol=1e-5)
    other.step()  # steps w only
    assert torch.equal(v.detach(), before)
    assert stepper.step()
    assert not torch.equal(v.detach(), before)
    assert orthonormality_error(v) < 1e-5
    assert not stepper.step()  # nothing pending


def test_stepper_adds_a_far_ends_gradient_and_hands_its_own_over():
    p = torch.nn.Parameter(random_stiefel(16, 4, seed=0))
    stepper = StiefelStepper(p, lr=1e-2)
    (p.sum() * 2).backward()
    stepper.add_grad(torch.ones(16, 4))
    taken = stepper.take_grad()
    assert torch.equal(taken, torch.full((16, 4), 3.0)) and stepper.take_grad() is None and not stepper.pending
    with pytest.raises(ConfigError, match=r"shape \(16, 4\), got \(4, 16\)"):
        stepper.add_grad(torch.ones(4, 16))
