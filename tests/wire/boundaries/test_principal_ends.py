"""The ``pca`` boundary: its basis is the sender's top principal directions, both ends hold it, and the gradient
is the compressed model's own."""

import pytest
import torch
from gloo_ranks import run_ranks

from actzip.errors import ConfigError, WireDesyncError
from actzip.wire.boundaries import PCAConfig, boundary_config, make_boundary, principal_basis
from actzip.wire.pipeline import Pipeline, PipelineConfig
from actzip_bench.models import GPTConfig
from actzip_bench.models.gpt_stages import build_gpt_stages

D, B, T = 32, 4, 16

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see tests/conftest.py


def _low_rank(k: int, seed: int = 0, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations ``mu + z A`` with ``A`` of rank ``k`` (returns them and A's orthonormal basis)."""
    g = torch.Generator().manual_seed(seed)
    a, _ = torch.linalg.qr(torch.randn(D, k, generator=g))
    z = torch.randn(B, T, k, generator=g) * scale * torch.linspace(3, 1, k)
    return 0.5 + z @ a.T, a


def _ends(width: int, **options):
    return make_boundary(PCAConfig(n_embd=D, width=width, **options))


def test_spec_gives_the_width_of_the_ratio_and_refuses_bad_fields():
    cfg = boundary_config("pca:8,refresh=4,decay=0.25", n_embd=64)
    assert isinstance(cfg, PCAConfig) and (cfg.width, cfg.refresh, cfg.decay) == (8, 4, 0.25)
    assert boundary_config("pca:8", n_embd=64, code_dtype=torch.bfloat16).width == 16  # 2-byte codes: twice as many
    for bad in ({"refresh": 0}, {"decay": 1.0}, {"decay": -0.1}, {"width": D + 1}):
        with pytest.raises(ConfigError):
            PCAConfig(**{"n_embd": D, "width": 4, "refresh": 8, "decay": 0.5, **bad})


def test_activations_in_a_k_dim_affine_subspace_cross_a_width_k_boundary_whole():
    x, a = _low_rank(4)
    sender, receiver = _ends(4)
    msg = sender(x)
    assert tuple(msg["code"].shape) == (B, T, 4)
    got, ids = receiver(msg)
    assert ids is None and torch.allclose(got, x, atol=1e-4)
    u = sender.basis
    assert torch.allclose(u.T @ u, torch.eye(4), atol=1e-5)
    assert torch.allclose(a @ (a.T @ u), u, atol=1e-4)  # the basis spans the data's directions


def test_the_basis_is_the_covariances_top_eigenvectors_in_order():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4096, D, generator=g, dtype=torch.float64) * torch.linspace(4, 0.5, D, dtype=torch.float64)
    mean, second = x.mean(0), x.T @ x / x.shape[0]
    u = principal_basis(mean, second, 3).double()
    values, vectors = torch.linalg.eigh(torch.cov(x.T, correction=0))
    for i in range(3):  # each column is the i-th largest eigenvector (up to sign)
        assert abs(float(u[:, i] @ vectors[:, -1 - i])) > 1 - 1e-6


def test_at_full_width_the_boundary_passes_anything_through():
    sender, receiver = _ends(D)
    x = torch.randn(B, T, D)
    assert torch.allclose(receiver(sender(x))[0], x, atol=1e-5)


def test_the_basis_crosses_once_then_again_after_each_refresh_and_versions_are_checked():
    sender, receiver = _ends(4, refresh=2)
    x, _ = _low_rank(4)
    first = sender(x)
    assert "pca_sync" in first and first["pca_state"].tolist() == [0, 1]
    receiver(first)
    second = sender(x)
    assert "pca_sync" not in second
    receiver(second)
    sender.after_optimizer_step()
    assert "pca_sync" not in sender(x)  # one step: still the same basis
    sender.after_optimizer_step()
    third = sender(x)
    assert third["pca_state"].tolist() == [1, 2]
    receiver(third)
    assert receiver.version == 2 and torch.equal(receiver.basis, sender.basis)
    assert torch.equal(receiver.mean, sender.mean)
    sender.after_optimizer_step()
    sender.after_optimizer_step()
    sender(x)  # version 3's message is lost
    sender.after_optimizer_step()
    sender.after_optimizer_step()
    with pytest.raises(WireDesyncError, match="version 2 but the update that arrived replaces version 3"):
        receiver(sender(x))


def test_a_code_before_any_basis_and_a_wrong_shape_are_named():
    sender, receiver = _ends(4)
    x, _ = _low_rank(4)
    sender(x)
    with pytest.raises(WireDesyncError, match="before any basis"):
        receiver(sender(x))  # the first message (with the basis) never reached this receiver
    with pytest.raises(ConfigError, match=r"shape \(batch, seq, 32\)"):
        sender(torch.randn(B, 8))


def test_statistics_come_from_training_forwards_only_and_fold_with_the_decay():
    sender, _ = _ends(2, refresh=1, decay=0.25)
    x1, _ = _low_rank(2, seed=1)
    x2, _ = _low_rank(2, seed=2, scale=3.0)
    sender(x1)  # the first forward takes its basis from its own input at once
    assert sender.version == 1 and float(sender.rows) == 0
    sender.eval()
    with torch.no_grad():
        sender(x2)  # evaluation: not observed
    assert float(sender.rows) == 0
    sender.train()
    sender(x2)
    sender.after_optimizer_step()
    f1, f2 = (t.reshape(-1, D).double() for t in (x1, x2))
    want = 0.25 * f1.mean(0) + 0.75 * f2.mean(0)
    assert torch.allclose(sender.avg_mean, want, atol=1e-6)
    want2 = 0.25 * f1.T @ f1 / f1.shape[0] + 0.75 * f2.T @ f2 / f2.shape[0]
    assert torch.allclose(sender.avg_second, want2, atol=1e-5)
    assert torch.allclose(sender.mean, want.float(), atol=1e-6)


def test_the_gradient_is_the_compressed_models_exact_one():
    sender, receiver = _ends(3)
    x, _ = _low_rank(6)
    x.requires_grad_(True)
    receiver(sender(x.detach()))  # the basis first
    w = torch.randn(D)
    loss = (receiver(sender(x))[0] * w).square().sum()
    loss.backward()
    u, mu = sender.basis, sender.mean
    ref = x.detach().clone().requires_grad_(True)
    ((mu + (ref - mu) @ u @ u.T) * w).square().sum().backward()
    assert torch.allclose(x.grad, ref.grad, atol=1e-5)
    assert torch.allclose(x.grad @ (torch.eye(D) - u @ u.T), torch.zeros(B, T, D), atol=1e-4)  # in span(U)


CFG = GPTConfig.of_size("tiny", n_layer=2, tie_weights=False, dropout=0.0)


def _batch(step: int):
    g = torch.Generator().manual_seed(step % 2)  # two batches, repeated
    return torch.randint(0, 256, (4, 16), generator=g), torch.randint(0, 256, (4, 16), generator=g), None


def _pca_pipe(refresh: int):
    stages = build_gpt_stages(CFG, 2, f"pca:8,refresh={refresh}", seed=0)
    return stages, Pipeline(stages, PipelineConfig(microbatches=2, fwd_codec="quant:bits=8",
                                                   bwd_codec="quant:bits=8", lr=3e-3))


def test_a_pipeline_trains_through_it_with_eight_bit_codes_and_meters_the_basis():
    stages, pipe = _pca_pipe(2)
    losses = [pipe.train_step(*_batch(s)[:2]) for s in range(6)]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert stages[0].sender.version == 1 + 6 // 2  # the first forward's basis, then one every two steps
    assert stages[1].receiver.version == 3  # the last one crosses with the next message
    sent = pipe.meters()[0].as_dict()["sent"]
    _, rare = _pca_pipe(1000)
    for s in range(6):
        rare.train_step(*_batch(s)[:2])
    once = rare.meters()[0].as_dict()["sent"]
    extra = sent["fwd"]["body_bytes"] - once["fwd"]["body_bytes"]
    basis_bytes = 64 * (8 + 1) * 4 + 2 * 8  # d x (k + 1) float32 and the two versions
    assert 2 * basis_bytes <= extra <= 2 * basis_bytes + 256  # the two later bases that crossed, counted
    dense = 6 * 4 * 16 * 64 * 2  # six steps of bf16 activations, each way
    assert sent["fwd"]["total"] < dense / 4 and sent["bwd"]["total"] < dense / 8
    assert pipe.eval_loss(*_batch(0)[:2]) > 0
    assert stages[1].receiver.version == 4 and torch.equal(stages[0].sender.basis, stages[1].receiver.basis)


def _pca_ranks(rank, world):
    stages = build_gpt_stages(CFG, world, "pca:8,refresh=2", seed=0)
    pipe = Pipeline(stages[rank], PipelineConfig(microbatches=2, fwd_codec="quant:bits=8", timeout_s=20),
                    distributed=True)
    res = pipe.run(_batch, 4)
    return None if res is None else res["losses"]


def test_processes_train_through_it_as_one_process_does():
    reports = run_ranks(_pca_ranks, 2)
    assert [r[0] for r in reports] == ["ok"] * 2, reports
    pipe = Pipeline(build_gpt_stages(CFG, 2, "pca:8,refresh=2", seed=0),
                    PipelineConfig(microbatches=2, fwd_codec="quant:bits=8"))
    want = [pipe.train_step(*_batch(s)[:2]) for s in range(4)]
    assert reports[0][1] == pytest.approx(want, abs=1e-5)
