"""Two-circuit training on 2 stages x 2 replicas of gloo ranks: replicas stay equal, bytes are metered per
axis, anchors arrive, faults end every rank with a clear error."""

import pytest
import torch
import torch.nn as nn
from gloo_ranks import run_ranks

from actzip.errors import ConfigError
from actzip.wire import PipelineConfig
from actzip.wire.anchor import AnchorConfig, SpectralConfig
from actzip.wire.dp import DPConfig, OuterConfig
from actzip.wire.mesh import Mesh, TwoCircuit, TwoCircuitConfig, fingerprint

VOCAB = 16


def _stages(seed=0):
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, 16)), nn.Sequential(nn.ReLU(), nn.Linear(16, VOCAB))]


def _batch(replica, step):
    g = torch.Generator().manual_seed(1000 * replica + step)
    x = torch.randint(0, VOCAB, (4, 6), generator=g)
    return x, x


DP_CASES = [DPConfig(method="topk", keep=0.1), DPConfig(method="powersgd", rank=2, start_iter=2),
            OuterConfig(local_steps=3, codec="quant:bits=4")]
MASK = "mask:keep=0.25,mode=random"


def _train(mesh, rank, dp, steps, anchor=None, spectral=None, seed_by_rank=False):
    stages = _stages(seed=rank if seed_by_rank else 0)
    tc = TwoCircuit(stages, mesh, PipelineConfig(microbatches=2, codec=MASK, lr=1e-2, timeout_s=40),
                    TwoCircuitConfig(dp=dp, anchor=anchor, spectral=spectral, check_every=2))
    for step in range(steps):
        tc.train_step(*_batch(mesh.replica, step))
    tc.close()
    rec = tc.record()
    return {"fp": fingerprint(tc.params).tolist(), "dp_bytes": rec["dp_bytes"], "losses": rec["losses"],
            "dp_seconds": rec["dp_seconds"], "dp_host_seconds": rec["dp_host_seconds"], "dp_wait_s": rec["dp_wait_s"],
            "anchors": rec["anchors"], "stage": mesh.stage, "replica": mesh.replica,
            "anchor_sent": None if rec["anchor_meter"] is None else
            sum(rec["anchor_meter"]["sent"][c]["total"] for c in ("fwd", "bwd"))}


def _every_case(rank, world):
    """Each data-parallel method from replicas of other seeds, then anchors: one mesh for all (its groups are
    the slow part of a start)."""
    mesh = Mesh(2, world // 2)
    runs = [_train(mesh, rank, dp, 6, seed_by_rank=True) for dp in DP_CASES]
    runs.append(_train(mesh, rank, DPConfig(), 8, AnchorConfig(every=2, delay=1), SpectralConfig(mode="shrinkage",
                                                                                                 rank=2)))
    runs.append(_train(mesh, rank, DPConfig(), 8, AnchorConfig(every=2, delay=1, codec="cast:dtype=bfloat16"),
                       SpectralConfig(mode="debias", rank=2)))
    try:  # last: replicas configured otherwise are refused before any collective of theirs
        TwoCircuit(_stages(), mesh, PipelineConfig(microbatches=2, timeout_s=40),
                   TwoCircuitConfig(dp=DPConfig(method="topk", keep=0.1 if mesh.replica == 0 else 0.2)))
        runs.append(None)
    except ConfigError as e:
        runs.append(str(e))
    return runs


@pytest.fixture(scope="module")
def every_case():
    reports = run_ranks(_every_case, 4, timeout_s=40, deadline_s=150)  # room for a loaded 2-core machine
    assert all(r[0] == "ok" for r in reports), reports
    return [r[1] for r in reports]


@pytest.mark.parametrize("case", range(len(DP_CASES)))
def test_replicas_of_each_stage_end_equal_and_dp_bytes_are_metered(every_case, case):
    dp = DP_CASES[case]
    got = [ranks[case] for ranks in every_case]
    by_stage = {}
    for g in got:
        by_stage.setdefault(g["stage"], []).append(g["fp"])
    for stage, fps in by_stage.items():
        assert fps[0] == fps[1], stage  # started from other seeds: broadcast, then synced to the bit
    steps = got[0]["dp_bytes"]
    assert len(steps) == 6
    if isinstance(dp, OuterConfig):  # bytes only at the outer syncs
        assert [bool(s) for s in steps] == [False, False, True, False, False, True]
    else:
        assert all(sum(s.values()) > 0 for s in steps)
    last = [g for g in got if g["stage"] == 1]
    assert all(len(g["losses"]) == 6 for g in last)
    for g in got:  # the sync's time: its host work apart from the time inside its collectives
        assert len(g["dp_host_seconds"]) == 6 and all(0.0 <= h <= t for h, t in zip(g["dp_host_seconds"],
                                                                                    g["dp_seconds"]))
        assert 0.0 < g["dp_wait_s"] <= sum(g["dp_seconds"])


def test_anchors_arrive_and_correct_the_fast_circuit(every_case):
    for ranks in every_case:
        a = ranks[len(DP_CASES)]["anchors"]
        assert a["launched"] == 4 and a["lost"] == 0 and a["delivered"] >= 2, a


def test_anchors_in_bf16_send_half_the_bytes_and_feed_the_debias_correction(every_case):
    for ranks in every_case:
        f32, bf16 = ranks[len(DP_CASES)], ranks[len(DP_CASES) + 1]
        assert bf16["anchors"]["launched"] == 4 and bf16["anchors"]["lost"] == 0, bf16["anchors"]
        assert 0.45 < bf16["anchor_sent"] / f32["anchor_sent"] < 0.6  # float32 -> bfloat16, headers aside


def _diverge(rank, world):
    mesh = Mesh(2, 2)
    tc = TwoCircuit(_stages(), mesh, PipelineConfig(microbatches=2, lr=1e-2, timeout_s=10),
                    TwoCircuitConfig(dp=DPConfig(), check_every=2))
    for step in range(4):
        tc.train_step(*_batch(mesh.replica, step))
        if step == 0 and rank == 2:  # a lost update on one replica's first stage
            with torch.no_grad():
                tc.params[0].add_(1e-3)


def test_diverged_replicas_raise_on_every_rank_of_the_stage():
    reports = run_ranks(_diverge, 4, timeout_s=10, deadline_s=40)
    stage0 = [reports[0], reports[2]]
    assert all(r[0] == "error" and r[1] == "WireDesyncError" and "diverged" in r[2] for r in stage0), reports
    assert all(r[0] in ("ok", "error") for r in reports), reports  # no rank hangs


def _dies(rank, world):
    import os

    mesh = Mesh(2, 2)
    tc = TwoCircuit(_stages(), mesh, PipelineConfig(microbatches=2, lr=1e-2, timeout_s=5),
                    TwoCircuitConfig(dp=DPConfig()))
    for step in range(4):
        if step == 2 and rank == 3:
            os._exit(1)  # a replica's last stage dies mid-training
        tc.train_step(*_batch(mesh.replica, step))


def test_a_dead_rank_ends_every_other_rank_with_an_error_in_bounded_time():
    reports = run_ranks(_dies, 4, timeout_s=5, deadline_s=45)
    assert reports[3][0] == "exited"
    assert all(r[0] == "error" for r in reports[:3]), reports


def test_replicas_with_other_dp_configs_are_refused_on_every_rank(every_case):
    assert all(ranks[-1] is not None and "differ" in ranks[-1] for ranks in every_case), every_case


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="dp"):
        TwoCircuitConfig(dp="powersgd")
    with pytest.raises(ConfigError, match="needs anchors"):
        TwoCircuitConfig(spectral=SpectralConfig(mode="projection"))
    with pytest.raises(ConfigError, match="initialized"):
        Mesh(2, 2)
