"""Split learning in one process: per-modality client encoders, a compressed uplink under one budget, a server
model; keep-ratio policies compared at the same expected payload, under each compressor.

Each step the client encodes every modality (``Linear`` + ReLU, ``widths`` features each: what it sends), each
modality goes up at its keep-ratio through ``compressor`` (:mod:`actzip.split.uplink`: a random mask with
rescale, top-k, SL-FAC's ``dct`` or uniform ``quant``; a keep-ratio is a share of the modality's dense bf16
payload) and the server classifies the concatenation; the gradient returns by the compressor's downlink rule.
Policies (:data:`POLICIES`), each refreshed every ``refresh`` steps from the batch the server has just received
(no extra uplink), every one spending ``1 / compression`` of the dense payload:

- ``equal``: every modality the same ratio (payload in proportion to size);
- ``equal-payload``: every modality the same payload (a small modality sent whole first);
- ``gradient-norm``: payload shares by the norm of the loss's gradient on each modality's received features;
- ``std``: SplitFC-style, payload shares by the summed standard deviation (over the batch) of each modality's
  received features;
- ``modalshare``: payload shares by Shapley scores, the value of a coalition being minus the server's loss with
  the other modalities' received features zeroed.

The score-driven policies (all but ``equal``) give every modality a floor before the scores share the rest of
the budget: ``explore`` of its equal keep-ratio, and at least the compressor's smallest sendable payload
(:func:`actzip.split.uplink.least_ratio`), so that a modality scored out still reaches the server and can be
scored again. The record also has the bytes each way (the payloads'
own) and, for ModalShare, the share of the server's compute its scoring took.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.errors import ConfigError
from actzip.split import equal_keep_ratios, keep_ratios, shapley
from actzip.split.uplink import COMPRESSORS, least_ratio, send
from actzip_bench.data.multimodal import MODALITIES, MultimodalConfig, make_multimodal

__all__ = ["POLICIES", "SplitSimConfig", "run_split_sim"]

POLICIES = ("equal", "equal-payload", "gradient-norm", "std", "modalshare")


@dataclass
class SplitSimConfig:
    """One comparison run: every policy on every seed at one compression, under one compressor."""

    compression: float = 5.0  # dense payload / payload sent
    compressor: str = "random"  # one of actzip.split.uplink.COMPRESSORS
    widths: tuple[int, ...] = (256, 16, 256)  # features the client sends per modality (image, sensor, distractor)
    steps: int = 400  # training steps
    batch: int = 128  # samples a step
    lr: float = 3e-3  # Adam
    refresh: int = 50  # steps between the score-driven policies' refreshes
    # share of its equal keep-ratio every modality keeps under the score-driven policies (with at least the
    # compressor's smallest sendable payload): a modality scored out still reaches the server, so its score can recover
    explore: float = 0.1
    train: int = 5000  # training samples (the rest of the suite is the test set)
    test: int = 1000
    seeds: tuple[int, ...] = (0, 1, 2)
    policies: tuple[str, ...] = POLICIES

    def __post_init__(self) -> None:
        if len(self.widths) != len(MODALITIES):
            raise ConfigError(f"split sim: widths needs one entry per modality {MODALITIES}, got {self.widths}")
        if self.compression < 1:
            raise ConfigError(f"split sim: compression must be >= 1, got {self.compression}")
        if self.compressor not in COMPRESSORS:
            raise ConfigError(f"split sim: compressor must be one of {COMPRESSORS}, got {self.compressor!r}")
        unknown = set(self.policies) - set(POLICIES)
        if unknown:
            raise ConfigError(f"split sim: unknown policies {sorted(unknown)}; known: {list(POLICIES)}")


class _Split(nn.Module):
    def __init__(self, dims, widths, classes):
        super().__init__()
        self.client = nn.ModuleList(nn.Linear(d, w) for d, w in zip(dims, widths))
        self.server = nn.Sequential(nn.Linear(sum(widths), 128), nn.ReLU(), nn.Linear(128, classes))

    def send(self, xs, ratios, compressor, seed):
        return [send(F.relu(enc(x)), r, compressor, seed=seed * len(xs) + i)
                for i, (enc, x, r) in enumerate(zip(self.client, xs, ratios))]

    def serve(self, acts, present=None):
        if present is not None:
            acts = [a if i in present else torch.zeros_like(a) for i, a in enumerate(acts)]
        return self.server(torch.cat(acts, dim=1))


def _scores(policy: str, model: _Split, views: list[torch.Tensor], y: torch.Tensor) -> list[float]:
    """The policy's score per modality from the batch just received (``views`` detached)."""
    if policy == "equal-payload":
        return [1.0] * len(views)
    if policy == "std":
        return [float(v.std(dim=0).sum()) for v in views]
    if policy == "gradient-norm":
        leaves = [v.clone().requires_grad_() for v in views]
        grads = torch.autograd.grad(F.cross_entropy(model.serve(leaves), y), leaves)
        return [float(g.norm()) for g in grads]
    with torch.no_grad():
        return list(shapley(lambda s: -float(F.cross_entropy(model.serve(views, set(s)), y)), len(views)).values)


def _one(cfg: SplitSimConfig, policy: str, seed: int, data) -> dict:
    streams, y = data
    xs = [streams[m] for m in MODALITIES]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    model = _Split([x.shape[1] for x in xs], cfg.widths, int(y.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    budget = sum(cfg.widths) / cfg.compression
    equal = list(equal_keep_ratios(cfg.widths, budget).ratios)
    ratios = equal
    floor = [max(cfg.explore * e, least_ratio(cfg.compressor, cfg.batch, w)) for e, w in zip(equal, cfg.widths)]
    history, up, down, server_s, scoring_s = [], 0.0, 0.0, 0.0, 0.0
    for step in range(cfg.steps):
        idx = torch.randint(0, cfg.train, (cfg.batch,), generator=gen)
        sent = model.send([x[idx] for x in xs], ratios, cfg.compressor, (seed * 100_003 + step) * 7919)
        t0 = time.perf_counter()
        loss = F.cross_entropy(model.serve([s.view for s in sent]), y[idx])
        opt.zero_grad()
        loss.backward()
        server_s += time.perf_counter() - t0  # the client's backward is a small part of it here
        opt.step()
        up += sum(s.uplink_bytes for s in sent)
        down += sum(s.downlink_bytes for s in sent)
        if policy != "equal" and (step + 1) % cfg.refresh == 0:
            t0 = time.perf_counter()
            scores = _scores(policy, model, [s.view.detach() for s in sent], y[idx])
            scoring_s += time.perf_counter() - t0
            ratios = list(keep_ratios(scores, cfg.widths, budget, floor=floor).ratios)
            history.append({"step": step + 1, "scores": scores, "ratios": ratios})
    with torch.no_grad():
        test = torch.arange(cfg.train, cfg.train + cfg.test)
        views = [s.view for s in model.send([x[test] for x in xs], ratios, cfg.compressor, seed * 7919 + 7917)]
        acc = float((model.serve(views).argmax(1) == y[test]).float().mean())
    dense = cfg.batch * sum(cfg.widths) * 2  # bf16 bytes a step
    return {"policy": policy, "compressor": cfg.compressor, "budget": cfg.compression, "seed": seed, "accuracy": acc,
            "ratios": ratios,
            "uplink_features": sum(r * w for r, w in zip(ratios, cfg.widths)), "budget_features": budget,
            "uplink_bytes": up / cfg.steps, "downlink_bytes": down / cfg.steps, "dense_bytes": dense,
            "scoring_share": scoring_s / (server_s + scoring_s), "history": history}


def run_split_sim(cfg: SplitSimConfig, suite: MultimodalConfig | None = None, progress=None) -> dict:
    """Every policy on every seed; rows and the mean accuracy per policy."""
    suite = suite or MultimodalConfig(n=cfg.train + cfg.test)
    data = make_multimodal(suite)
    rows = []
    for seed in cfg.seeds:
        for policy in cfg.policies:
            rows.append(_one(cfg, policy, seed, data))
            if progress is not None:
                progress(f"{policy} seed {seed}")
    mean = {p: sum(r["accuracy"] for r in rows if r["policy"] == p) / len(cfg.seeds) for p in cfg.policies}
    return {"config": asdict(cfg), "suite": asdict(suite), "rows": rows, "mean_accuracy": mean}
