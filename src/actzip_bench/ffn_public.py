"""The public BitSparse code's own FFN workload (``actzip bench ffn --harness public``).

``n_blocks`` residual blocks ``x + W2·relu(W1·rms_norm(x))²`` with ``rms_norm`` weightless
(``F.rms_norm(x, (d,))``), hidden ``floor(5.25·d)``, bf16, ``x ~ randn`` a leaf requiring grad, loss
``|y − x|.mean()``, xavier weights; every gradient is dropped as it is accumulated (post-accumulate-grad hooks,
``x``'s included), and a step's peak is the most memory allocated during it above what was allocated before
it, plus the bytes a preallocated buffer of the strategy holds (its arena).

Densities: ``mid`` perturbs W1 and W2 by ``0.01·std·N(0, 1)`` element-wise (density about one half).
``low`` cannot be had from the public recipe's shift of W1 by ``+0.1·std``: with a zero-mean symmetric
input, ``h = W1·n`` is symmetric for any W1, so the first block's density is one half whatever W1 is, and the
later blocks' inputs are shifted too little to move theirs far. Here ``low`` gives the input a mean
(``randn + LOW_INPUT_MEAN``) for a uniform shift of W1 to act through, and shifts W1 so that each
pre-activation moves down by about ``LOW_SHIFT`` of its standard deviation, ``LOW_SHIFT`` calibrated to the
public run's measured density (0.218); the measured density is recorded either way.

Strategies: ``none`` (plain autograd), ``checkpoint`` (each block), ``relu-only`` (the public code's dense
baseline: a hand-written function keeping only relu(h)), and actzip through ``compress_`` alone:
``fused`` (``SparseMLPConfig(arena=None)``: payloads sized on the host), ``fused-arena`` (the default
``SparseMLPConfig()``: the self-resetting arena), ``fused-arena-signpack`` (the same with 15-bit sign packing).
Each strategy runs its own copy of the stack (the same weights), so that ``compress_`` changes only its own.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from actzip.errors import ConfigError
from actzip_bench.ffn_relu_only import relu_squared_mlp_keeping_relu

__all__ = ["PUBLIC_STRATEGIES", "PublicBlock", "build_public_stack", "make_public_input", "public_steps"]

PUBLIC_STRATEGIES = ("none", "checkpoint", "relu-only", "fused", "fused-arena", "fused-arena-signpack")
MID_NOISE = 0.01  # mid: W <- W + MID_NOISE * std(W) * N(0, 1)
LOW_INPUT_MEAN = 1.0  # low: the input's mean, the constant direction the shift acts through
LOW_SHIFT = 0.80  # low: pre-activations moved down by about LOW_SHIFT of their std (density ~0.22 at d=512)


class ReluSquaredMLP(nn.Module):
    """``down(relu(up(n))²)``, declared to ``compress_`` by its layout."""

    actzip_mlp_layout = ("up", "act", "down")
    actzip_mlp_activation = "relu2"

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, hidden, bias=False)
        self.act = nn.ReLU()
        self.down = nn.Linear(hidden, d, bias=False)
        self.relu_only = False  # set per strategy: the dense function keeping only relu(h)

    def forward(self, n: torch.Tensor) -> torch.Tensor:
        if self.relu_only:
            return relu_squared_mlp_keeping_relu(n, self.up.weight, self.down.weight)
        return self.down(F.relu(self.up(n)).square())


class PublicBlock(nn.Module):
    """``x + mlp(rms_norm(x))`` with a weightless RMS norm (``nn.RMSNorm`` runs ``F.rms_norm(x, (d,))``)."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d, elementwise_affine=False)
        self.mlp = ReluSquaredMLP(d, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def public_hidden(d: int) -> int:
    return math.floor(5.25 * d)


def build_public_stack(d: int, n_blocks: int, density: str, dtype: torch.dtype, device) -> nn.ModuleList:
    torch.manual_seed(0)
    blocks = nn.ModuleList(PublicBlock(d, public_hidden(d)) for _ in range(n_blocks))
    with torch.no_grad():
        for b in blocks:
            for w in (b.mlp.up.weight, b.mlp.down.weight):
                nn.init.xavier_uniform_(w)
                if density == "mid":
                    w += MID_NOISE * w.std() * torch.randn_like(w)
            if density == "low":  # each pre-activation moves by about -LOW_SHIFT of its std (see the docstring)
                w = b.mlp.up.weight
                mu = LOW_INPUT_MEAN
                w -= LOW_SHIFT * w.std() * math.sqrt(1 + mu * mu) / (mu * math.sqrt(d))
    return blocks.to(device=device, dtype=dtype)


def make_public_input(rows: int, d: int, density: str, dtype: torch.dtype, device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(rows, d, generator=g) + (LOW_INPUT_MEAN if density == "low" else 0.0)
    return x.to(device=device, dtype=dtype).requires_grad_()


def _stack_for(strategy: str, base: nn.ModuleList, kernel: str) -> nn.ModuleList:
    """The strategy's own copy of the stack, compressed through ``compress_`` for the fused ones."""
    from actzip.memory.modules import SparseMLPConfig, compress_

    stack = copy.deepcopy(base)
    opts = {"kernel": kernel}
    if strategy == "fused":
        compress_(stack, SparseMLPConfig(arena=None, codec_options=opts))
    elif strategy == "fused-arena":
        compress_(stack, SparseMLPConfig(codec_options=opts))
    elif strategy == "fused-arena-signpack":
        compress_(stack, SparseMLPConfig(codec_options={**opts, "sign_pack": True, "check": False}))
    elif strategy == "relu-only":
        for b in stack:
            b.mlp.relu_only = True
    return stack


def public_steps(strategies, base: nn.ModuleList, x: torch.Tensor, kernel: str = "auto", keep_grads: bool = False):
    """A step function per strategy (forward, backward, every gradient dropped as it is accumulated), the
    bytes each strategy holds between steps (its arena's), and the gradients kept when ``keep_grads`` (a dict
    per strategy, filled by the next step)."""
    from actzip.memory.modules import arena_of

    stacks = {s: _stack_for(s, base, kernel) for s in strategies}
    kept = {s: {} for s in strategies}

    def hooks(stack: nn.ModuleList, got: dict) -> None:
        for i, p in enumerate(list(stack.parameters())):
            p.register_post_accumulate_grad_hook(lambda p, i=i: _drop(p, i, got if keep_grads else None))

    for s, stack in stacks.items():
        hooks(stack, kept[s])
    x_grads: dict = {}

    def step(strategy: str) -> None:
        stack = stacks[strategy]
        h = x
        for b in stack:
            h = checkpoint(b, h, use_reentrant=False) if strategy == "checkpoint" else b(h)
        loss = (h - x).abs().mean()
        loss.backward()
        if keep_grads:
            kept[strategy]["x"] = x.grad.clone()
        x.grad = None

    arenas = {}
    for s, stack in stacks.items():
        try:
            arenas[s] = arena_of(stack)
        except ConfigError:  # no arena (not an arena strategy, or no kernels here): nothing held between steps
            continue
    held = {s: (lambda a=a: a.capacity_bytes) for s, a in arenas.items()}
    return {s: (lambda s=s: step(s)) for s in strategies}, held, kept, arenas


def _drop(p: torch.Tensor, i: int, got: dict | None) -> None:
    if got is not None:
        got[i] = p.grad.clone()
    p.grad = None


def measured_public_density(blocks: nn.ModuleList, x: torch.Tensor) -> float:
    """Mean fraction of non-zero relu(h) over the blocks, on the benchmark input."""
    fr = []
    with torch.no_grad():
        for b in blocks:
            fr.append(float((b.mlp.up(b.norm(x)) > 0).float().mean()))
            x = b(x)
    return sum(fr) / len(fr)


def _grad_diffs(strategies, base, x, kernel) -> dict:
    """Max |grad - grad of none| per strategy over every parameter and x, on one step (after the arenas'
    first, priming step)."""
    steps, _, kept, _ = public_steps(strategies, base, x, kernel, keep_grads=True)
    for s in strategies:
        steps[s]()
        steps[s]()  # the first step of an arena strategy primes it (its payloads recomputed, exact as well)
    ref = kept["none"]
    return {s: float(torch.stack([(g[k].float() - ref[k].float()).abs().max() for k in ref]).max())
            for s, g in kept.items()}


def run_public(cfg, device: torch.device, progress=None) -> dict:
    """The public workload for ``cfg`` (an :class:`actzip_bench.ffn.FFNBenchConfig` with ``harness="public"``):
    gradients checked once, then every strategy timed interleaved, arenas settled first."""
    from actzip.memory.modules.arena import PENDING_STEPS, SETTLE_STEPS
    from actzip_bench.harness import machine_record, run_interleaved

    dtype = getattr(torch, cfg.dtype)
    base = build_public_stack(cfg.d, cfg.n_blocks, cfg.density, dtype, device)
    x = make_public_input(cfg.rows, cfg.d, cfg.density, dtype, device)
    density = measured_public_density(base, x)
    grad_diff = _grad_diffs(cfg.strategies, base, x, cfg.kernel)
    steps, held, _, arenas = public_steps(cfg.strategies, base, x, cfg.kernel)
    for s in arenas:  # the adaptive margin settles after SETTLE_STEPS fitting steps, learned PENDING_STEPS late
        for _ in range(SETTLE_STEPS + PENDING_STEPS + 2):
            steps[s]()
    refused = {s: a.overflows() for s, a in arenas.items()}
    results = run_interleaved(steps, device, rounds=cfg.rounds, warmup=cfg.warmup, progress=progress, held=held,
                              above_resident=True)
    base_r = results["none"]
    runs = []
    for name, r in results.items():
        row = {"strategy": name, **r.summary(), "time_vs_none": r.median_ms / base_r.median_ms,
               "peak_vs_none": (r.peak_bytes / base_r.peak_bytes) if r.peak_bytes and base_r.peak_bytes else None,
               "max_grad_abs_diff": grad_diff.get(name), "arena_refusals": None}
        if name in arenas:
            a = arenas[name]
            row.update(arena_refusals=a.overflows() - refused[name], arena_capacity_bytes=a.capacity_bytes,
                       arena_high_water_bytes=a.high_water_bytes())
        runs.append(row)
    from dataclasses import asdict

    config = {**asdict(cfg), "hidden": public_hidden(cfg.d)}
    return {"config": config, "density": density, "runs": runs, "skipped": {}, "machine": machine_record(device)}
