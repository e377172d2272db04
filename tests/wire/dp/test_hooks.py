"""Compressed data-parallel sync as DDP comm hooks, on two gloo ranks: exact where it says so, metered."""

import pytest
import torch
import torch.nn as nn
from gloo_ranks import run_ranks

from actzip.errors import ConfigError
from actzip.wire.dp import DPConfig, attach


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))


def _train(rank, world, method, steps, options, bucket_cap_mb=0.004):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model(), bucket_cap_mb=bucket_cap_mb)  # several buckets by default
    meter = attach(ddp, DPConfig(method=method, **options)) if method else None
    torch.manual_seed(100 + rank)  # each replica its own batches
    grads = []
    for _ in range(steps):
        x = torch.randn(8, 16)
        ddp.zero_grad()
        ddp(x).square().mean().backward()
        grads.append([p.grad.numpy().copy() for p in ddp.parameters()])  # arrays: pickled by value
    return grads, (meter.payload_bytes, meter.dense_bytes, dict(meter.by_collective)) if meter else None


def _ok(reports):
    assert all(r[0] == "ok" for r in reports), reports
    return [r[1] for r in reports]


def _three_ways(rank, world):
    return [_train(rank, world, method, 3, options) for method, options in ((None, {}), ("allreduce", {}),
                                                                           ("topk", {"keep": 1.0}))]


def test_plain_hook_and_topk_keeping_everything_equal_ddps_own_allreduce():
    runs = _ok(run_ranks(_three_ways, 2))  # per rank: DDP's own, the plain hook, top-k keeping all
    for rank in range(2):
        ref = runs[rank][0]
        for method, got in zip(("allreduce", "topk"), runs[rank][1:]):
            for a, b in zip(ref[0], got[0]):
                assert all((x == y).all() for x, y in zip(a, b)), method
    payload, dense, _ = runs[0][1][1]
    assert payload == dense  # the plain hook contributes the bucket itself


def _accounting(rank, world, steps, config):
    """The synced gradients summed over steps, this replica's own (unsynced) gradients summed, the last synced
    gradients, and the meter's bytes."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model(), bucket_cap_mb=0.004)
    meter = attach(ddp, config)
    local = _model()  # the same weights (no optimizer step changes them): this replica's gradient alone
    synced_sum = [torch.zeros_like(p) for p in ddp.parameters()]
    local_sum = [torch.zeros_like(p) for p in ddp.parameters()]
    torch.manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(8, 16)
        ddp.zero_grad()
        local.zero_grad()
        ddp(x).square().mean().backward()
        local(x).square().mean().backward()
        for acc, p in zip(synced_sum, ddp.parameters()):
            acc += p.grad
        for acc, p in zip(local_sum, local.parameters()):
            acc += p.grad
    last = [p.grad.numpy().copy() for p in ddp.parameters()]
    return ([s.numpy().copy() for s in synced_sum], [s.numpy().copy() for s in local_sum], last,
            meter.payload_bytes, meter.dense_bytes, dict(meter.by_collective))


def test_topk_error_feedback_and_its_bytes():
    reports = _ok(run_ranks(_accounting, 2, 4, DPConfig(method="topk", keep=0.1)))
    (sent0, local0, _, payload, dense, _), (_, local1, _, _, _, _) = reports
    # the synced gradients summed over steps are the mean over replicas of what each sent; the parameters do not
    # change (no optimizer), so every replica's local sums are exact and the residuals close the difference
    mean_local = [(a + b) / 2 for a, b in zip(local0, local1)]
    diff = sum(float(abs(s - m).sum()) for s, m in zip(sent0, mean_local))
    total = sum(float(abs(m).sum()) for m in mean_local)
    assert 0 < diff < 0.5 * total  # the residuals hold back part of the sum, most of it has been sent
    # 10% of the elements as value + int32 index: 0.2 of the dense fp32 bytes, per bucket rounding aside
    assert payload == pytest.approx(0.2 * dense, rel=0.05)


def test_quant_sends_4_bit_codes_with_error_feedback():
    reports = _ok(run_ranks(_accounting, 2, 32, DPConfig(method="quant", codec="quant:bits=4")))
    (sent0, local0, last0, payload, dense, kinds), (sent1, local1, last1, _, _, _) = reports
    for a, b in zip(last0, last1):  # both replicas decode the same payloads in the same order
        assert (a == b).all()
    # what was sent over the steps is the replicas' summed gradients but for the last residuals, which hold at
    # most a code step of each group: a fifth of one step's gradient here, where the 32 steps' rounding errors
    # left uncorrected would add up to about one step's
    mean_local = [(a + b) / 2 for a, b in zip(local0, local1)]
    diff = sum(float(abs(s - m).sum()) for s, m in zip(sent0, mean_local))
    step = sum(float(abs(m).sum()) for m in mean_local) / 32
    assert 0 < diff < 0.5 * step
    # 4-bit codes of float32 gradients and each group's scale and offset: about an eighth of the bytes
    assert 1 / 8 < payload / dense < 1 / 5
    assert set(kinds) == {"all_gather"}


def test_powersgd_through_torchs_hook_sends_less_after_its_plain_steps():
    # one bucket (matrices and vectors together), as gloo needs for torch's hook
    got = _ok(run_ranks(_train, 2, "powersgd", 6, {"rank": 2, "start_iter": 2}, 25))
    payload, dense, by = got[0][1]
    assert payload < dense and set(by) == {"all_reduce"}
    for a, b in zip(got[0][0][-1], got[1][0][-1]):
        assert (a == b).all()  # replicas agree


def _powersgd_on_gloo(rank, world, bias, bucket_cap_mb):
    import warnings

    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64, bias=bias), nn.ReLU(), nn.Linear(64, 32, bias=bias))
    try:
        ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
        meter = attach(ddp, DPConfig(method="powersgd", rank=2, start_iter=2))
    except ConfigError as e:
        return str(e)
    torch.manual_seed(100 + rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            ddp.zero_grad()
            ddp(torch.randn(8, 16)).square().mean().backward()
    said = [str(w.message) for w in caught if "powersgd" in str(w.message)]
    return meter.fallback_buckets, said, [p.grad.numpy().copy() for p in ddp.parameters()]


def test_powersgd_on_gloo_refuses_several_buckets_and_sends_a_vectorless_one_plain():
    refused = _ok(run_ranks(_powersgd_on_gloo, 2, True, 0.001))
    assert all("one DDP bucket" in r and "bucket_cap_mb>=" in r for r in refused)
    (n0, said0, g0), (n1, said1, g1) = _ok(run_ranks(_powersgd_on_gloo, 2, False, 25))
    assert n0 == n1 == 2 and len(said0) == 1 and "58467" in said0[0]  # steps 3 and 4, announced once
    assert all((a == b).all() for a, b in zip(g0, g1))  # replicas agree


def test_bf16_sends_half():
    got = _ok(run_ranks(_train, 2, "bf16", 2, {}))
    payload, dense, _ = got[0][1]
    assert payload * 2 == dense
    for a, b in zip(got[0][0][-1], got[1][0][-1]):
        assert (a == b).all()


def test_bad_config_and_model():
    for bad in ({"method": "dct"}, {"keep": 0.0}, {"rank": 0}, {"start_iter": -1}):
        with pytest.raises(ConfigError):
            DPConfig(**bad)
    with pytest.raises(ConfigError, match="lossless"):
        DPConfig(method="quant", codec="sparse")
    with pytest.raises(ConfigError, match="one registry codec"):
        DPConfig(method="quant", codec="quant:bits=4+cast:dtype=bfloat16")
    with pytest.raises(ConfigError, match="DistributedDataParallel"):
        attach(nn.Linear(2, 2), DPConfig())
