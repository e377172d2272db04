"""Split learning in one process: per-modality client encoders, a masked uplink under one budget, a server model;
keep-ratio policies compared at the same expected payload (ModalShare's first measurement).

Each step the client encodes every modality (``Linear`` + ReLU, ``widths`` features each: what it sends), the
uplink keeps each modality's features with its keep-ratio (a fresh random mask, kept values rescaled by
``1 / ratio``: unbiased) and the server classifies the concatenation; the gradient returns through the same mask.
Policies: ``equal`` (every modality the same ratio), ``modalshare`` (ratios from Shapley scores the server
computes every ``refresh`` steps on the batch it has just received: the value of a coalition is minus the
server's loss with the other modalities' received features zeroed; no extra uplink). Every policy's expected
payload is ``sum(widths) / compression`` features a sample.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.errors import ConfigError
from actzip.split import equal_keep_ratios, keep_ratios, shapley
from actzip_bench.data.multimodal import MODALITIES, MultimodalConfig, make_multimodal

__all__ = ["POLICIES", "SplitSimConfig", "run_split_sim"]

POLICIES = ("equal", "modalshare")


@dataclass
class SplitSimConfig:
    """One comparison run."""

    compression: float = 5.0  # sum(widths) / expected features sent a sample
    widths: tuple[int, ...] = (256, 16, 256)  # features the client sends per modality (image, sensor, distractor)
    steps: int = 400  # training steps
    batch: int = 128  # samples a step
    lr: float = 3e-3  # Adam
    refresh: int = 50  # steps between ModalShare's score refreshes
    # share of the equal allocation mixed into ModalShare's (both spend the budget, so the mix does too): a
    # modality scored out still reaches the server a little, so that its score can recover
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
        unknown = set(self.policies) - set(POLICIES)
        if unknown:
            raise ConfigError(f"split sim: unknown policies {sorted(unknown)}; known: {list(POLICIES)}")


class _Split(nn.Module):
    def __init__(self, dims, widths, classes):
        super().__init__()
        self.client = nn.ModuleList(nn.Linear(d, w) for d, w in zip(dims, widths))
        self.server = nn.Sequential(nn.Linear(sum(widths), 128), nn.ReLU(), nn.Linear(128, classes))

    def send(self, xs, ratios, gen):
        out = []
        for enc, x, r in zip(self.client, xs, ratios):
            a = F.relu(enc(x))
            if r <= 0:
                out.append(torch.zeros_like(a))
            elif r < 1:
                keep = torch.rand(a.shape, generator=gen) < r
                out.append(a * keep / r)
            else:
                out.append(a)
        return out

    def serve(self, acts, present=None):
        if present is not None:
            acts = [a if i in present else torch.zeros_like(a) for i, a in enumerate(acts)]
        return self.server(torch.cat(acts, dim=1))


def _one(cfg: SplitSimConfig, policy: str, seed: int, data) -> dict:
    streams, y = data
    xs = [streams[m] for m in MODALITIES]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    model = _Split([x.shape[1] for x in xs], cfg.widths, int(y.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    budget = sum(cfg.widths) / cfg.compression
    ratios = list(equal_keep_ratios(cfg.widths, budget).ratios)
    history = []
    for step in range(cfg.steps):
        idx = torch.randint(0, cfg.train, (cfg.batch,), generator=gen)
        acts = model.send([x[idx] for x in xs], ratios, gen)
        loss = F.cross_entropy(model.serve(acts), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if policy == "modalshare" and (step + 1) % cfg.refresh == 0:
            with torch.no_grad():
                received = [a.detach() for a in acts]
                scores = shapley(lambda s: -float(F.cross_entropy(model.serve(received, set(s)), y[idx])),
                                 len(MODALITIES))  # fmt: skip
            share = keep_ratios(scores.values, cfg.widths, budget).ratios
            equal = equal_keep_ratios(cfg.widths, budget).ratios
            ratios = [(1 - cfg.explore) * a + cfg.explore * b for a, b in zip(share, equal)]
            history.append({"step": step + 1, "scores": list(scores.values), "ratios": ratios})
    with torch.no_grad():
        test = torch.arange(cfg.train, cfg.train + cfg.test)
        logits = model.serve(model.send([x[test] for x in xs], ratios, gen))
        acc = float((logits.argmax(1) == y[test]).float().mean())
    payload = sum(r * w for r, w in zip(ratios, cfg.widths))
    return {"policy": policy, "seed": seed, "accuracy": acc, "ratios": ratios, "uplink_features": payload,
            "budget_features": budget, "history": history}


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
