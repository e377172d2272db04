"""The pipeline: schedules, equivalence with the unsplit model (gradients included), codecs on the boundaries, side channels,
hooks, and multi-process runs under gloo (results, exact bytes, faults)."""

import math
import time

import pytest
import torch
from gloo_ranks import run_ranks
from torch import nn

from actzip.errors import ConfigError
from actzip.wire.link import LinkSpec
from actzip.wire.replay import simulate
from actzip.wire.pipeline import Pipeline, PipelineConfig, schedule_actions
from actzip.wire.transport import HEADER_BYTES
from actzip_bench.models import GPT, GPTConfig
from actzip_bench.models.gpt_stages import build_gpt_stages, stage_layers

CFG = GPTConfig.of_size("tiny", n_layer=3, tie_weights=False, dropout=0.0)


def batch(seed=0, b=4, t=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, t), generator=g), torch.randint(0, 256, (b, t), generator=g)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("n_stages,m", [(2, 4), (3, 2), (3, 1)])
def test_schedule_runs_every_microbatch_once_forward_before_backward(schedule, n_stages, m):
    for s in range(n_stages):
        acts = schedule_actions(schedule, n_stages, s, m)
        assert sorted(acts) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        for i in range(m):
            assert acts.index(("F", i)) < acts.index(("B", i))
    if schedule == "1f1b":  # at most n_stages - s microbatches in flight
        for s in range(n_stages):
            live = peak = 0
            for kind, _ in schedule_actions(schedule, n_stages, s, m):
                live += 1 if kind == "F" else -1
                peak = max(peak, live)
            assert peak <= min(m, n_stages - s)


def _reference_name(stage: int, name: str, n_stages: int) -> str:
    """The unsplit GPT's name of stage ``stage``'s parameter ``name``."""
    name = name.removeprefix("body.").removeprefix("embed.")
    if name.startswith("blocks."):
        _, j, rest = name.split(".", 2)
        name = f"h.{stage_layers(CFG.n_layer, n_stages)[stage].start + int(j)}.{rest}"
    return name


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [1, 2])
def test_dense_pipeline_matches_the_unsplit_model(schedule, m):
    x, y = batch()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        ref = GPT(CFG)
    _, loss = ref(x, y)
    loss.backward()
    loss = loss.detach()
    want = {n: p.grad.clone() for n, p in ref.named_parameters()}
    opt = torch.optim.AdamW([{"params": [p for p in ref.parameters() if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in ref.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95))
    opt.step()
    stages = build_gpt_stages(CFG, 3, seed=0)
    pipe = Pipeline(stages, PipelineConfig(schedule=schedule, microbatches=m, lr=1e-2))
    got = {}
    for i, w in enumerate(pipe.workers):  # each stage's gradients, as its optimizer is about to step
        named = [(_reference_name(i, n, 3), p) for n, p in w.module.named_parameters()]
        w.optimizer.register_step_pre_hook(
            lambda o, args, kwargs, named=named: got.update({n: p.grad.clone() for n, p in named}))
    step_loss = pipe.train_step(x, y)
    assert set(got) == set(want)
    for name, g in want.items():
        if m == 1:  # one microbatch: the very same arithmetic, the gradients passed the links unchanged
            assert torch.equal(got[name], g), name
        else:  # summed over two microbatches: float32 rounding of the sum only
            torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-8, msg=name)
    assert step_loss == pytest.approx(loss.item(), abs=1e-6 if m > 1 else 0)
    ref_params = dict(ref.named_parameters())
    for i, s in enumerate(stages):  # one AdamW step from the same gradients
        for n, p in s.named_parameters():
            want_p = ref_params[_reference_name(i, n, 3)]
            if m == 1:
                assert torch.equal(p, want_p), n
            elif n in ("body.embed.wte.weight", "body.blocks.0.attn.c_attn.weight", "body.lm_head.weight",
                       "body.ln_f.weight"):  # Adam's first step divides by |g|: a near-zero g amplifies rounding
                torch.testing.assert_close(p, want_p, rtol=0, atol=1e-5)


def test_every_stage_follows_the_learning_rate_schedule():
    from actzip.core.lr_schedule import lr_factor

    pipe = Pipeline(build_gpt_stages(CFG, 2), PipelineConfig(microbatches=2, lr=1e-2, lr_schedule="cosine",
                                                               lr_steps=20))
    for step in range(3):
        x, y = batch(step)
        pipe.train_step(x, y)
    for w in pipe.workers:
        assert [g["lr"] for g in w.optimizer.param_groups] == [pytest.approx(1e-2 * lr_factor("cosine", 3, 20))] * 2
    with pytest.raises(ConfigError, match="length"):
        PipelineConfig(lr_schedule="cosine")


def test_each_stage_trains_at_its_own_learning_rate_factor():
    x, y = batch()
    before = [[p.detach().clone() for p in m.parameters()] for m in build_gpt_stages(CFG, 2, seed=0)]
    pipe = Pipeline(build_gpt_stages(CFG, 2, seed=0), PipelineConfig(microbatches=2, lr=1e-2,
                                                                       stage_lr_scale=(0.5, 1e-9)))
    assert [g["lr"] for g in pipe.workers[0].optimizer.param_groups] == [pytest.approx(5e-3)] * 2
    pipe.train_step(x, y)
    moved = [max((p.detach() - b).abs().max().item() for p, b in zip(w.module.parameters(), old))
             for w, old in zip(pipe.workers, before)]
    assert moved[0] > 1e-3 > 1e-9 > moved[1]  # AdamW moves every weight by about lr on the first step
    cosine = Pipeline(build_gpt_stages(CFG, 2), PipelineConfig(microbatches=2, lr=1e-2, lr_schedule="cosine",
                                                                 lr_steps=20, stage_lr_scale=(2, 1)))
    cosine.train_step(x, y)
    lrs = [w.optimizer.param_groups[0]["lr"] for w in cosine.workers]
    assert lrs[0] == pytest.approx(2 * lrs[1])  # the schedule scales each stage's own rate


@pytest.mark.parametrize("scale,match", [((), "positive"), ((1.0, 0.0), "positive"), ((1.0, -1.0), "positive"),
                                         (("a", 1.0), "positive"), ((1.0, float("inf")), "positive"),
                                         ((1.0, 1.0, 1.0), "3 factors for 2 stages")])
def test_bad_stage_lr_scale_is_named(scale, match):
    with pytest.raises(ConfigError, match=match):
        cfg = PipelineConfig(microbatches=2, stage_lr_scale=scale)
        Pipeline(build_gpt_stages(CFG, 2), cfg)


def test_message_bytes_are_exactly_header_schema_and_buffers():
    x, y = batch(b=4, t=16)
    pipe = Pipeline(build_gpt_stages(CFG, 2), PipelineConfig(microbatches=2, fwd_codec="quant:bits=8",
                                                               bwd_codec="none"))
    pipe.train_step(x, y)
    pipe.train_step(x, y)
    fwd = [a for a in pipe.actions if a.kind == "F" and a.stage == 0]
    bwd = [a for a in pipe.actions if a.kind == "B" and a.stage == 1]
    n = 2 * 16 * CFG.n_embd  # elements of one microbatch's activation
    codes, groups = n, n // 128
    assert all(a.send_bytes == HEADER_BYTES + codes + 8 * groups for a in fwd[1:])  # steady state: no schema
    assert fwd[0].send_bytes > fwd[1].send_bytes  # the first message carries its schema
    assert all(a.send_bytes == HEADER_BYTES + 4 * n for a in bwd[1:])
    meters = pipe.meters()
    assert meters[0].total("sent", "fwd") == sum(a.send_bytes for a in fwd) == meters[1].total("received", "fwd")


@pytest.mark.parametrize("fwd,bwd", [("quant:bits=4", "quant:bits=8"), ("mask:keep=0.25", "none"),
                                     ("mask:keep=0.1,mode=topk+quant:bits=8", "quant:bits=8"),
                                     ("delta:bits=4", "quant:bits=8"), ("fp8", "fp8")])
def test_byte_codecs_train(fwd, bwd):
    pipe = Pipeline(build_gpt_stages(CFG, 2), PipelineConfig(microbatches=2, fwd_codec=fwd, bwd_codec=bwd,
                                                               lr=3e-3))
    losses = []
    for step in range(4):
        x, y = batch(seed=step % 2)  # two batches, repeated: the delta cache gets hits
        losses.append(pipe.train_step(x, y, torch.tensor([0, 1, 2, 3]) + 4 * (step % 2)))
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    assert pipe.eval_loss(*batch()) > 0


class _Side(nn.Module):
    """A stage returning a dict with an int side channel, and one receiving it."""

    def __init__(self, first: bool) -> None:
        super().__init__()
        self.first = first
        self.emb = nn.Embedding(256, 8) if first else None
        self.lin = nn.Linear(8, 8 if first else 256)
        self.calls = 0

    def forward(self, inp):
        if self.first:
            return {"h": self.lin(self.emb(inp)), "tok": inp}
        assert inp["tok"].dtype == torch.int64 and not inp["tok"].requires_grad
        return self.lin(inp["h"]) + 0.0 * inp["tok"].unsqueeze(-1)

    def after_optimizer_step(self):
        self.calls += 1


def test_side_channels_travel_exactly_and_hooks_run():
    stages = [_Side(True), _Side(False)]
    pipe = Pipeline(stages, PipelineConfig(microbatches=2, fwd_codec="quant:bits=2", bwd_codec="none"))
    x, y = batch()
    seen = []
    orig = stages[1].forward

    def spy(inp):
        seen.append(inp["tok"].clone())
        return orig(inp)

    stages[1].forward = spy
    pipe.train_step(x, y)
    assert torch.equal(torch.cat(seen), x)  # token ids: never a lossy codec
    assert stages[0].calls == stages[1].calls == 1
    assert stages[0].emb.weight.grad is None and stages[0].lin.weight.abs().sum() > 0


def test_bad_configs_are_named():
    with pytest.raises(ConfigError, match="schedule"):
        PipelineConfig(schedule="interleaved")
    with pytest.raises(ConfigError, match="bwd codec 'delta' is not possible"):
        PipelineConfig(bwd_codec="delta:bits=4")
    with pytest.raises(ConfigError, match="option"):
        PipelineConfig(fwd_codec="quant:bitz=4")
    pipe = Pipeline(build_gpt_stages(CFG, 2), PipelineConfig(microbatches=3))
    with pytest.raises(ConfigError, match="multiple of microbatches=3"):
        pipe.train_step(*batch(b=4))


def test_trace_replays_over_links():
    pipe = Pipeline(build_gpt_stages(CFG, 2), PipelineConfig(schedule="gpipe", microbatches=2))
    for s in range(2):
        pipe.train_step(*batch(seed=s))
    fast = simulate(pipe.actions, LinkSpec())
    slow = simulate(pipe.actions, LinkSpec(1.0, 50.0))
    sent = sum(a.send_bytes for a in pipe.actions)
    busy = [sum(a.compute_s for a in pipe.actions if a.stage == s) for s in (0, 1)]
    assert fast.busy_s == pytest.approx(busy)
    assert max(busy) <= fast.total_s + 1e-9 and fast.total_s <= sum(busy) + 1e-9  # bubbles, never more
    assert slow.total_s > fast.total_s + 8 * sent / 1e6 / 2  # the 1 Mbps link dominates (fwd, bwd overlap)
    assert slow.link_bytes["b0.fwd"] + slow.link_bytes["b0.bwd"] == sent


# ---- one process per stage under gloo ------------------------------------------------------------------------


def _batches(step):
    x, y = batch(seed=step)
    return x, y, None


def _train_ranks(rank, world, fwd, steps):
    torch.manual_seed(0)
    stages = build_gpt_stages(CFG, world, seed=0)
    pipe = Pipeline(stages[rank], PipelineConfig(microbatches=2, fwd_codec=fwd, timeout_s=10), distributed=True)
    res = pipe.run(_batches, steps)
    if res is None:
        return None
    return {"losses": res["losses"], "bytes": [m["sent"] for m in res["meters"]],
            "recv": [m["received"] for m in res["meters"]], "n_actions": len(res["actions"]),
            "wall": res["wall_step_end_s"]}


def test_processes_match_the_simulated_pipeline():
    reports = run_ranks(_train_ranks, 3, "quant:bits=8", 2)
    assert [r[0] for r in reports] == ["ok"] * 3, reports
    got = reports[0][1]
    pipe = Pipeline(build_gpt_stages(CFG, 3, seed=0), PipelineConfig(microbatches=2, fwd_codec="quant:bits=8"))
    want = [pipe.train_step(*_batches(s)[:2]) for s in range(2)]
    assert got["losses"] == pytest.approx(want, abs=1e-6)  # same codec noise: the same seeds per boundary
    sim = [m.as_dict()["sent"] for m in pipe.meters()]
    for r in range(3):
        assert got["bytes"][r]["fwd"] == sim[r]["fwd"] and got["bytes"][r]["bwd"] == sim[r]["bwd"]
    assert got["bytes"][0]["fwd"] == got["recv"][1]["fwd"] and got["bytes"][2]["bwd"] == got["recv"][1]["bwd"]
    assert got["n_actions"] == 2 * (3 * (2 * 2 + 1)) and len(got["wall"]) == 2


class _Crash(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        raise RuntimeError("boom in stage 1")


def _crashing(rank, world):
    stages = build_gpt_stages(CFG, world, seed=0)
    module = _Crash(stages[1]) if rank == 1 else stages[rank]
    Pipeline(module, PipelineConfig(microbatches=2, timeout_s=20), distributed=True).run(_batches, 2)


def test_a_failing_stage_is_an_error_on_every_rank_quickly():
    t0 = time.monotonic()
    reports = run_ranks(_crashing, 3, timeout_s=20, deadline_s=30)
    assert time.monotonic() - t0 < 15  # far below the 20 s timeout: the peers were told
    assert reports[1][0] == "error" and "boom in stage 1" in reports[1][2]
    for r in (reports[0], reports[2]):
        assert r[0] == "error" and r[1] == "WirePeerError", r
        assert "rank 1" in r[2]


def _mismatched(rank, world):
    stages = build_gpt_stages(CFG, world, seed=0)
    cfg = PipelineConfig(microbatches=2, fwd_codec=f"quant:bits={4 if rank == 0 else 8}", timeout_s=10)
    Pipeline(stages, cfg, distributed=True).run(_batches, 1)


def test_mismatched_codecs_fail_on_both_ranks_before_training():
    reports = run_ranks(_mismatched, 2)
    for r in reports:
        assert r[0] == "error" and r[1] == "WireConfigMismatchError", r
        assert "fwd_codec.bits" in r[2]


def _torch_pipelining(rank, world):
    import torch.nn.functional as F
    from torch.distributed.pipelining import ScheduleGPipe

    from actzip.wire.pipeline import pipelining_stage

    stage = pipelining_stage(build_gpt_stages(CFG, world, seed=0)[rank], rank, world, "cpu")
    sched = ScheduleGPipe(stage, n_microbatches=2,
                          loss_fn=lambda out, y: F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1)))
    x, y = batch()
    losses = []
    if rank == 0:
        sched.step(x)
    else:
        sched.step(target=y, losses=losses)
    return {"losses": [v.item() for v in losses], "meter": stage.actzip_meter.as_dict()["sent"]}


def test_torch_pipelining_runs_actzip_stages_and_counts_their_bytes():
    r0, r1 = run_ranks(_torch_pipelining, 2)
    assert r0[0] == "ok" and r1[0] == "ok", (r0, r1)
    pipe = Pipeline(build_gpt_stages(CFG, 2, seed=0), PipelineConfig(microbatches=2, schedule="gpipe"))
    assert sum(r1[1]["losses"]) / 2 == pytest.approx(pipe.train_step(*batch()), abs=1e-5)
    raw = 4 * 16 * CFG.n_embd * 4  # the activations (and their gradients) of the batch, float32
    assert r0[1]["meter"]["fwd"]["body_bytes"] == raw and r1[1]["meter"]["bwd"]["body_bytes"] == raw
    assert r0[1]["meter"]["fwd"]["header_bytes"] == 0


def test_a_codebook_desync_is_recovered_by_the_runner():
    """The receiver decodes with its codebook as it is, the gradient asks for a snapshot, the books meet again."""
    import warnings

    from actzip.wire import pipeline

    cfg = GPTConfig.of_size("tiny", n_layer=2, dropout=0.0)
    stages = build_gpt_stages(cfg, 2, "stiefel-rvq:100", rvq_sync_every=1)
    pipe = Pipeline(stages, PipelineConfig(microbatches=2))
    x, y = batch(b=4, t=16)
    for _ in range(2):
        pipe.train_step(x, y)
    sender, receiver = stages[0].sender.book, stages[1].receiver.book
    assert stages[0].sender.learner.take_message() is not None  # the message with the last update is lost
    before = pipeline.codebook_desyncs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = pipe.train_step(x, y)  # no error: decoded stale, snapshot requested with the gradient
    assert math.isfinite(loss) and pipeline.codebook_desyncs() > before
    assert before > 0 or any("out of sync" in str(w.message) for w in caught)
    pipe.train_step(x, y)  # its first message carries the whole codebook
    pipe.train_step(x, y)
    assert pipeline.codebook_desyncs() == before + 2  # the two microbatches of the desynced step, then none
    pipe.eval_loss(x, y)  # carries the update of the last optimizer step
    assert torch.equal(receiver.codebook, sender.codebook) and receiver.checksum == sender.checksum
