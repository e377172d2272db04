"""FFN-stack memory benchmark: residual ReLU² FFN blocks, peak memory and fwd+bwd time per strategy.

The workload of the public BitSparse comparison: ``n_blocks`` residual blocks ``x + down(relu(up(rms(x)))²)``
(d, hidden = 5.25·d, bf16, ``rows`` tokens, xavier weights, loss ``|y - x|.mean()``). ``density`` "low" shifts
``up``'s weights so that about a fifth of the pre-activations are positive; the measured density is reported.

Strategies (all on the same weights and input, interleaved):
- ``none``: plain PyTorch;
- ``checkpoint``: ``torch.utils.checkpoint`` around each block;
- ``relu-only``: each MLP as a hand-written dense autograd function that keeps only relu(h) for backward
  (:mod:`actzip_bench.ffn_relu_only`), the strongest alternative a user could write by hand;
- ``cache``: the whole step under :class:`actzip.memory.ActivationCache` (the generic hook-based cache);
- ``fused``: each MLP as :class:`actzip.memory.SparseReLUMLP` (only the sparse payload of relu(h) is kept),
  each payload allocated exactly (one host synchronization per block);
- ``fused-arena``: the same with the payloads in an :class:`actzip.memory.arena.Arena` (no synchronization;
  sized from an untimed first step);
- ``fused-arena-signpack``: the same with sign-bit packing (15-bit bf16).

``matmul="fp8"`` runs every up and down projection as an :class:`actzip.memory.Fp8Linear` (tensorwise float8
matmuls, as torchao's Float8Linear). ``none`` then keeps what an fp8 linear keeps (the float8 copy of its
input); the fused strategies rebuild the down projection's input from the payload and cast it again in backward
(``Fp8Config(recast_input=True)``, the same bits), so nothing of it is stored.
"""

from __future__ import annotations

import dataclasses
import math

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from actzip.core import registry
from actzip.errors import ConfigError
from actzip.memory import CacheContext as ActivationCache, Fp8Linear, SparseReLUMLP
from actzip_bench.ffn_relu_only import relu_squared_mlp_keeping_relu

INPUT_MEAN = 0.5  # the benchmark input is randn + INPUT_MEAN
# "low" density: up's weights shifted by -LOW_DENSITY_SHIFT / sqrt(d) * std. The pre-activations then move
# by a fixed number of their own standard deviations whatever d is: about 20% stay positive.
LOW_DENSITY_SHIFT = 1.9
STRATEGIES = ("none", "checkpoint", "relu-only", "cache", "fused", "fused-arena", "fused-arena-signpack")
MATMULS = ("bf16", "fp8")


@dataclass
class FFNBenchConfig:
    """One FFN-stack workload."""

    d: int = 4096  # model width
    rows: int = 16384  # tokens per step
    n_blocks: int = 8  # residual FFN blocks
    hidden_ratio: float = 5.25  # hidden = round(hidden_ratio * d)
    density: str = "mid"  # "mid" (~50% of relu(h) non-zero) or "low" (~20%: up's weights shifted)
    dtype: str = "bfloat16"
    kernel: str = "auto"  # sparse codec kernel for the fused strategies
    rounds: int = 10  # measured rounds per strategy
    warmup: int = 2  # rounds dropped first
    strategies: tuple[str, ...] = STRATEGIES
    matmul: str = "bf16"  # "bf16" (nn.Linear in the model's dtype) or "fp8" (Fp8Linear: float8 matmuls)
    # "actzip": the workload above; "public": the public BitSparse code's own (actzip_bench.ffn_public: zero-mean
    # input, weightless norm, gradients dropped as they accumulate, peak above resident, fused through compress_)
    harness: str = "actzip"

    def __post_init__(self) -> None:
        if self.harness not in ("actzip", "public"):
            raise ConfigError(f"ffn bench: harness must be 'actzip' or 'public', got {self.harness!r}")
        if self.harness == "public" and self.matmul != "bf16":
            raise ConfigError("ffn bench: the public harness runs bf16 matmuls only (matmul='bf16')")
        if self.matmul not in MATMULS:
            raise ConfigError(f"ffn bench: matmul must be one of {list(MATMULS)}, got {self.matmul!r}")
        if self.density not in ("mid", "low"):
            raise ConfigError(f"ffn bench: density must be 'mid' or 'low', got {self.density!r}")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad:
            raise ConfigError(f"ffn bench: unknown strategies {bad}; choose from {list(STRATEGIES)}")

    @property
    def hidden(self) -> int:
        return int(round(self.hidden_ratio * self.d))


class FFNBlock(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.fused: SparseReLUMLP | None = None  # set per strategy
        self.relu_only = False  # set per strategy: the hand-written function keeping only relu(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm(x)
        if self.fused is not None:
            return x + self.fused(n)
        if self.relu_only:
            return x + relu_squared_mlp_keeping_relu(n, self.up.weight, self.down.weight)
        return x + self.down(F.relu(self.up(n)).square())


def build_stack(cfg: FFNBenchConfig, device: torch.device) -> nn.ModuleList:
    torch.manual_seed(0)
    blocks = nn.ModuleList(FFNBlock(cfg.d, cfg.hidden) for _ in range(cfg.n_blocks))
    for b in blocks:
        nn.init.xavier_uniform_(b.up.weight)
        nn.init.xavier_uniform_(b.down.weight)
        if cfg.density == "low":
            with torch.no_grad():
                # With the input's positive mean, a negative shift of every weight pushes most
                # pre-activations below zero.
                b.up.weight -= LOW_DENSITY_SHIFT / math.sqrt(cfg.d) * b.up.weight.std()
        if cfg.matmul == "fp8":
            b.up, b.down = Fp8Linear.from_linear(b.up), Fp8Linear.from_linear(b.down)
    return blocks.to(device=device, dtype=getattr(torch, cfg.dtype))


def make_input(cfg: FFNBenchConfig, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(cfg.rows, cfg.d, generator=g) + INPUT_MEAN
    return x.to(device=device, dtype=getattr(torch, cfg.dtype))


def measured_density(blocks: nn.ModuleList, x: torch.Tensor) -> float:
    """Mean fraction of non-zero relu(h) over the blocks, on the benchmark input."""
    fr = []
    with torch.no_grad():
        for b in blocks:
            fr.append(float((b.up(b.norm(x)) > 0).float().mean()))
            x = b(x)
    return sum(fr) / len(fr)


def _set_fused(blocks: nn.ModuleList, codec, arena=None) -> None:
    for b in blocks:
        b.fused = None if codec is None else SparseReLUMLP(b.up, b.down, square=True, codec=codec, arena=arena)
        if isinstance(b.down, Fp8Linear):  # fused: the down input is rebuilt from the payload, so keep no fp8 copy
            b.down.config = dataclasses.replace(b.down.config, recast_input=codec is not None)


def make_steps(cfg: FFNBenchConfig, blocks: nn.ModuleList, x: torch.Tensor) -> tuple[dict, dict, dict]:
    """A step function per strategy (forward + backward, gradients dropped after), the bytes each arena strategy
    holds between steps, and the arenas.

    Arena strategies are primed here: one untimed step measures the payload bytes, then the arena is sized.
    """
    from actzip.memory.modules.arena import Arena

    fused = {
        "fused": (registry.get("sparse", kernel=cfg.kernel), None),
        "fused-arena": (registry.get("sparse", kernel=cfg.kernel), Arena(device=x.device)),
        "fused-arena-signpack": (registry.get("sparse", kernel=cfg.kernel, sign_pack=True, check=False), Arena(device=x.device)),
    }

    def forward(strategy: str) -> torch.Tensor:
        h = x
        for b in blocks:
            h = checkpoint(b, h, use_reentrant=False) if strategy == "checkpoint" else b(h)
        return (h - x).abs().mean()

    def step(strategy: str) -> None:
        codec, arena = fused.get(strategy, (None, None))
        _set_fused(blocks, codec, arena)
        for b in blocks:
            b.relu_only = strategy == "relu-only"
        if strategy == "cache":
            with ActivationCache():
                loss = forward(strategy)
        else:
            loss = forward(strategy)
        loss.backward()
        for p in blocks.parameters():
            p.grad = None
        _set_fused(blocks, None)
        for b in blocks:
            b.relu_only = False
        if arena is not None:
            arena.reset()

    for strategy in cfg.strategies:
        codec, arena = fused.get(strategy, (None, None))
        if arena is not None:
            step(strategy)
            arena.fit()
    steps = {s: (lambda s=s: step(s)) for s in cfg.strategies}
    arenas = {s: a for s, (_, a) in fused.items() if a is not None and s in cfg.strategies}
    held = {s: (lambda a=a: a.capacity_bytes) for s, a in arenas.items()}
    return steps, held, arenas


def check_gradients(cfg: FFNBenchConfig, blocks: nn.ModuleList, x: torch.Tensor) -> dict:
    """Max |grad - grad of none| per strategy over every parameter, on one step (0: bit-identical; NaN when any
    difference is NaN)."""
    steps, _, _ = make_steps(cfg, blocks, x)
    grads: dict[str, dict[int, torch.Tensor]] = {}
    for strategy in cfg.strategies:
        got: dict[int, torch.Tensor] = {}
        # The step drops gradients at its end: take a copy as each one is accumulated.
        hooks = [p.register_post_accumulate_grad_hook(lambda p, got=got: got.__setitem__(id(p), p.grad.clone()))
                 for p in blocks.parameters()]
        try:
            steps[strategy]()
        finally:
            for h in hooks:
                h.remove()
        grads[strategy] = got
    ref = grads["none"]
    # torch's max keeps NaN (Python's max would drop a NaN that comes after a number).
    return {s: float(torch.stack([(g[k].float() - ref[k].float()).abs().max() for k in ref]).max())
            for s, g in grads.items()}


def result_record(cfg: FFNBenchConfig, results: dict, density: float, grad_diff: dict) -> dict:
    base = results["none"]
    rows = []
    for name, r in results.items():
        rows.append({"strategy": name, **r.summary(),
                     "time_vs_none": r.median_ms / base.median_ms,
                     "peak_vs_none": (r.peak_bytes / base.peak_bytes) if r.peak_bytes and base.peak_bytes else None,
                     "max_grad_abs_diff": grad_diff.get(name)})
    return {"config": asdict(cfg), "density": density, "runs": rows}


def run_ffn(cfg: FFNBenchConfig, device: torch.device, progress=None) -> dict:
    """Build the stack, check gradients once, then time every strategy interleaved."""
    from actzip_bench.harness import machine_record, run_interleaved, runnable_strategies

    if cfg.harness == "public":
        from actzip_bench.ffn_public import PUBLIC_STRATEGIES, run_public

        other = {s: "not a strategy of the public harness" for s in cfg.strategies if s not in PUBLIC_STRATEGIES}
        cfg = dataclasses.replace(cfg, strategies=tuple(s for s in cfg.strategies if s not in other))
        cfg, skipped = runnable_strategies(cfg, device)
        record = run_public(cfg, device, progress)
        return {**record, "skipped": {**other, **skipped}}
    cfg, skipped = runnable_strategies(cfg, device)
    if cfg.matmul == "fp8" and "relu-only" in cfg.strategies:  # it runs plain bf16 matmuls: not the same workload
        skipped["relu-only"] = "the hand-written function runs bf16 matmuls, not Fp8Linear's"
        cfg = dataclasses.replace(cfg, strategies=tuple(s for s in cfg.strategies if s != "relu-only"))

    blocks = build_stack(cfg, device)
    x = make_input(cfg, device)
    density = measured_density(blocks, x)
    grad_diff = check_gradients(cfg, blocks, x)
    steps, held, arenas = make_steps(cfg, blocks, x)
    refused = {s: a.overflows() for s, a in arenas.items()}  # the priming step's refusals (empty arena)
    results = run_interleaved(steps, device, rounds=cfg.rounds, warmup=cfg.warmup, progress=progress, held=held)
    record = result_record(cfg, results, density, grad_diff)
    for r in record["runs"]:  # payloads the arena had no room for in the timed steps (each one recomputed)
        r["arena_refusals"] = arenas[r["strategy"]].overflows() - refused[r["strategy"]] if r["strategy"] in arenas else None
    return {**record, "skipped": skipped, "machine": machine_record(device)}
