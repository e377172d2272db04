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
scored again. With ``score_on="heldout"`` the policies whose scores read the batch (:data:`READ_THE_BATCH`:
all but ``equal`` and ``equal-payload``) score a batch the server never trains on (the training split's last
``batch`` samples, kept out of their training): every ``refresh`` steps that step's batch is the held-out one,
sent at the current keep-ratios like any other (the same payload) and scored instead of trained on, so a
stream the server has memorized from the training samples earns nothing there. With ``switch_step`` (the
synthetic suite) the training batches from that step on, and the test, come from samples where the image
stream carries the class and the sensor is silent: usefulness changes mid-training. The record
also has the bytes each way (the payloads' own) and, for ModalShare, the share of the server's compute its
scoring took.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.codecs.lossy import ROUNDINGS
from actzip.errors import ConfigError
from actzip.split import equal_keep_ratios, keep_ratios, shapley
from actzip.split.coalitions import ABSENT, coalition_values
from actzip.split.runtime import SCORE_AT, SCORE_ON, scoring_ratios
from actzip.split.uplink import COMPRESSORS, check_levels, least_ratio, send
from actzip_bench.data.multimodal import MultimodalConfig
from actzip_bench.split_suites import CLIENTS, SUITES, Suite, load_suite

__all__ = ["POLICIES", "READ_THE_BATCH", "SplitSimConfig", "client_encoder", "run_split_sim"]

POLICIES = ("equal", "equal-payload", "gradient-norm", "std", "modalshare")
READ_THE_BATCH = ("gradient-norm", "std", "modalshare")  # policies whose scores depend on the batch they score


@dataclass
class SplitSimConfig:
    """One comparison run: every policy on every seed at one compression, under one compressor."""

    compression: float = 5.0  # dense payload / payload sent
    compressor: str = "random"  # one of actzip.split.uplink.COMPRESSORS
    dataset: str = "synthetic"  # one of actzip_bench.split_suites.SUITES
    data_root: str | None = None  # the local copy of a data set read from disk (crema-d, mvsa)
    # the client's encoders: "linear" (Linear + ReLU on each modality's flattened input, `widths` features out) or
    # "conv" (spatial modalities through a 3x3 Conv2d, or a Conv1d over time, + ReLU: `channels` feature maps,
    # kept in their shape, [channels, height, width] or [channels, time], which SL-FAC's DCT runs over; the other
    # modalities linear)
    client: str = "linear"
    # features the linear encoders send per modality; None: the suite's default (the synthetic suite's image,
    # sensor, distractor: 256, 16, 256; elsewhere each modality's input size, at most 256)
    widths: tuple[int, ...] | None = None
    channels: int = 8  # feature maps of a convolutional encoder
    steps: int = 400  # training steps
    batch: int = 128  # samples a step
    lr: float = 3e-3  # Adam
    refresh: int = 50  # steps between the score-driven policies' refreshes
    # share of its equal keep-ratio every modality keeps under the score-driven policies (with at least the
    # compressor's smallest sendable payload): a modality scored out still reaches the server, so its score can recover
    explore: float = 0.1
    train: int | None = None  # training samples (None: 5000 of the synthetic suite, else four fifths of the data)
    test: int | None = None  # test samples after them (None: 1000 of the synthetic suite, else the rest)
    seeds: tuple[int, ...] = (0, 1, 2)
    policies: tuple[str, ...] = POLICIES
    # ModalShare's stand-in for a modality outside a coalition (actzip.split.coalitions.ABSENT): "zeros" or
    # "mean" (its features' batch mean)
    absent: str = "zeros"
    # what the score-driven policies score (SCORE_ON): "received" (the batch the server has just trained on) or
    # "heldout" (one batch of training samples they never train on, sent in place of a training batch at refreshes)
    score_on: str = "received"
    # with score_on="heldout": the keep-ratios the held-out batch is sent at, the policy's own ("current"), the
    # equal ones ("equal") or the policy's own raised to the equal ones and scaled back ("raised"; actzip.split
    # .SplitConfig.score_at)
    score_at: str = "current"
    # synthetic suite only: from this step on the training batches (and the test) come from samples where the
    # image stream carries the class and the sensor is silent (MultimodalConfig.switch_at): usefulness changes
    # mid-training; None: no switch
    switch_step: int | None = None
    # how dct and quant round their codes, both ways (actzip.split.uplink.Link.rounding): "stochastic" or "nearest"
    rounding: str = "stochastic"
    # how dct codes its bands, both ways (actzip.split.uplink.Link.levels): "uniform" or "fitted"
    levels: str = "uniform"

    def __post_init__(self) -> None:
        if self.dataset not in SUITES:
            raise ConfigError(f"split sim: dataset must be one of {SUITES}, got {self.dataset!r}")
        if self.client not in CLIENTS:
            raise ConfigError(f"split sim: client must be one of {CLIENTS}, got {self.client!r}")
        if self.widths is not None and any(int(w) < 1 for w in self.widths):
            raise ConfigError(f"split sim: widths must be positive feature counts, got {self.widths}")
        if self.channels < 1:
            raise ConfigError(f"split sim: channels must be >= 1, got {self.channels}")
        if self.compression < 1:
            raise ConfigError(f"split sim: compression must be >= 1, got {self.compression}")
        if self.compressor not in COMPRESSORS:
            raise ConfigError(f"split sim: compressor must be one of {COMPRESSORS}, got {self.compressor!r}")
        if self.absent not in ABSENT:
            raise ConfigError(f"split sim: absent must be one of {ABSENT}, got {self.absent!r}")
        if self.rounding not in ROUNDINGS:
            raise ConfigError(f"split sim: rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        check_levels("split sim: levels", self.levels, self.compressor)
        if self.switch_step is not None and (self.dataset != "synthetic" or not 0 < self.switch_step < self.steps):
            raise ConfigError(f"split sim: switch_step needs the synthetic suite and a step in (0, steps={self.steps}), "
                              f"got {self.switch_step} on {self.dataset!r}")
        if self.score_on not in SCORE_ON:
            raise ConfigError(f"split sim: score_on must be one of {SCORE_ON}, got {self.score_on!r}")
        if self.score_at not in SCORE_AT or (self.score_at != "current" and self.score_on != "heldout"):
            raise ConfigError(f"split sim: score_at must be one of {SCORE_AT} ('equal' only with "
                              f"score_on='heldout'), got {self.score_at!r}")
        unknown = set(self.policies) - set(POLICIES)
        if unknown:
            raise ConfigError(f"split sim: unknown policies {sorted(unknown)}; known: {list(POLICIES)}")


def client_encoder(shape: tuple[int, ...], width: int, client: str, channels: int) -> nn.Module:
    """One modality's client layers for samples of ``shape``."""
    if client == "conv" and len(shape) == 3:  # [C, H, W] -> [channels, H, W]
        return nn.Sequential(nn.Conv2d(shape[0], channels, 3, padding=1), nn.ReLU())
    if client == "conv" and len(shape) == 2:  # [features, time] -> [channels, time]
        return nn.Sequential(nn.Conv1d(shape[0], channels, 3, padding=1), nn.ReLU())
    return nn.Sequential(nn.Flatten(1), nn.Linear(math.prod(shape), width), nn.ReLU())


class _Split(nn.Module):
    def __init__(self, shapes, widths, classes, client="linear", channels=8):
        super().__init__()
        self.client = nn.ModuleList(client_encoder(s, w, client, channels) for s, w in zip(shapes, widths))
        with torch.no_grad():
            self.out_shapes = [tuple(enc(torch.zeros(1, *s)).shape[1:]) for enc, s in zip(self.client, shapes)]
        self.sizes = [math.prod(s) for s in self.out_shapes]  # features sent per modality
        self.server = nn.Sequential(nn.Linear(sum(self.sizes), 128), nn.ReLU(), nn.Linear(128, classes))

    def send(self, xs, ratios, compressor, seed, rounding="stochastic", levels="uniform"):
        return [send(enc(x), r, compressor, seed=seed * len(xs) + i, rounding=rounding, levels=levels)
                for i, (enc, x, r) in enumerate(zip(self.client, xs, ratios))]

    def serve(self, acts, present=None):
        if present is not None:
            acts = [a if i in present else torch.zeros_like(a) for i, a in enumerate(acts)]
        return self.server(torch.cat([a.flatten(1) for a in acts], dim=1))


def _scores(policy: str, model: _Split, views: list[torch.Tensor], y: torch.Tensor,
            absent: str = "zeros") -> list[float]:
    """The policy's score per modality from the batch just received (``views`` detached)."""
    if policy == "equal-payload":
        return [1.0] * len(views)
    if policy == "std":
        return [float(v.std(dim=0).sum()) for v in views]
    if policy == "gradient-norm":
        leaves = [v.clone().requires_grad_() for v in views]
        grads = torch.autograd.grad(F.cross_entropy(model.serve(leaves), y), leaves)
        return [float(g.norm()) for g in grads]
    return list(shapley(coalition_values(model.server, views, y, absent=absent), len(views)).values)


def _one(cfg: SplitSimConfig, policy: str, seed: int, suite: Suite) -> dict:
    xs, y = list(suite.streams.values()), suite.labels
    train, test = suite.train, suite.test
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    widths = suite.widths(cfg.widths)
    model = _Split([tuple(x.shape[1:]) for x in xs], widths, int(y.max()) + 1, cfg.client, cfg.channels)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sizes = model.sizes
    budget = sum(sizes) / cfg.compression
    equal = list(equal_keep_ratios(sizes, budget).ratios)
    ratios = equal
    floor = [max(cfg.explore * e, least_ratio(cfg.compressor, (cfg.batch, *s)))
             for e, s in zip(equal, model.out_shapes)]
    history, up, down, server_s, scoring_s = [], 0.0, 0.0, 0.0, 0.0
    heldout = cfg.score_on == "heldout" and policy in READ_THE_BATCH
    if heldout and train < 2 * cfg.batch:
        raise ConfigError(f"split sim: score_on='heldout' keeps {cfg.batch} of {train} training samples out; "
                          "too few left to train on")
    pool = train - cfg.batch if heldout else train  # training samples drawn from
    def offset(step: int) -> int:  # where this step's samples start: after a switch, past the first train + test
        return train + test if cfg.switch_step is not None and step >= cfg.switch_step else 0

    def rescore(sent, labels, step):
        nonlocal ratios, scoring_s
        t0 = time.perf_counter()
        scores = _scores(policy, model, [s.view.detach() for s in sent], labels, cfg.absent)
        scoring_s += time.perf_counter() - t0
        ratios = list(keep_ratios(scores, sizes, budget, floor=floor).ratios)
        history.append({"step": step + 1, "scores": scores, "ratios": ratios})

    for step in range(cfg.steps):
        refresh = policy != "equal" and (step + 1) % cfg.refresh == 0
        if heldout and refresh:  # this step's batch is the held-out one: sent, scored, not trained on
            with torch.no_grad():
                scoring_idx = torch.arange(pool, train) + offset(step)
                sent = model.send([x[scoring_idx] for x in xs], scoring_ratios(cfg.score_at, ratios, sizes, budget),
                                  cfg.compressor, (seed * 100_003 + step) * 7919, cfg.rounding,
                                  cfg.levels)
            up += sum(s.uplink_bytes for s in sent)
            rescore(sent, y[scoring_idx], step)
            continue
        idx = torch.randint(0, pool, (cfg.batch,), generator=gen) + offset(step)
        sent = model.send([x[idx] for x in xs], ratios, cfg.compressor, (seed * 100_003 + step) * 7919, cfg.rounding,
                          cfg.levels)
        t0 = time.perf_counter()
        loss = F.cross_entropy(model.serve([s.view for s in sent]), y[idx])
        opt.zero_grad()
        loss.backward()
        server_s += time.perf_counter() - t0  # the client's backward is a small part of it here
        opt.step()
        up += sum(s.uplink_bytes for s in sent)
        down += sum(s.downlink_bytes for s in sent)
        if refresh:
            rescore(sent, y[idx], step)
    with torch.no_grad():
        test = torch.arange(train, train + test) + offset(cfg.steps)
        views = [s.view for s in model.send([x[test] for x in xs], ratios, cfg.compressor, seed * 7919 + 7917,
                                            cfg.rounding, cfg.levels)]
        acc = float((model.serve(views).argmax(1) == y[test]).float().mean())
    dense = cfg.batch * sum(sizes) * 2  # bf16 bytes a step
    return {"policy": policy, "compressor": cfg.compressor, "budget": cfg.compression, "seed": seed, "accuracy": acc,
            "dataset": cfg.dataset, "client": cfg.client, "ratios": ratios, "sizes": sizes,
            "uplink_features": sum(r * w for r, w in zip(ratios, sizes)), "budget_features": budget,
            "uplink_bytes": up / cfg.steps, "downlink_bytes": down / cfg.steps, "dense_bytes": dense,
            "scoring_share": scoring_s / (server_s + scoring_s), "history": history}


def run_split_sim(cfg: SplitSimConfig, suite: MultimodalConfig | None = None, progress=None) -> dict:
    """Every policy on every seed; rows and the mean accuracy per policy. ``suite`` sets the synthetic suite's
    shape (the other data sets take theirs from ``cfg``)."""
    data = load_suite(cfg.dataset, root=cfg.data_root, train=cfg.train, test=cfg.test, synthetic=suite,
                      switched=cfg.switch_step is not None)  # the samples before a switch, then as many after
    rows = []
    for seed in cfg.seeds:
        for policy in cfg.policies:
            rows.append(_one(cfg, policy, seed, data))
            if progress is not None:
                progress(f"{policy} seed {seed}")
    mean = {p: sum(r["accuracy"] for r in rows if r["policy"] == p) / len(cfg.seeds) for p in cfg.policies}
    return {"config": asdict(cfg), "suite": data.describe(), "rows": rows, "mean_accuracy": mean}
