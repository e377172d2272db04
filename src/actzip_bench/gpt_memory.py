"""Reference-GPT memory benchmark: per-token peak memory and training-step time per strategy.

A ReLU² GPT (default the ~124M preset, bf16 weights, AdamW) is trained on random tokens at each sequence
length with a fixed number of tokens per step, its loss computed in chunks of tokens (``loss_chunk``) so that
the float32 logits over the vocabulary do not dominate the peak. Strategies share one set of weights and one optimizer and are
interleaved step by step:
- ``none``: plain PyTorch;
- ``checkpoint``: every block checkpointed;
- ``fused``: every MLP as :class:`actzip.memory.SparseReLUMLP` (only the sparse payload of relu(h) kept),
  payloads allocated exactly (one host synchronization per block);
- ``fused-arena``: payloads in an arena (no synchronization; sized from an untimed first step);
- ``fused-arena-signpack``: the same with sign-bit packing;
- ``rebuild``: the model's ``rebuild_saved`` option: no copy of the layer-norm outputs nor of the attention
  projection's input is kept; backward makes them again from tensors it keeps anyway (bit-identical);
- ``fused-arena-rebuild``: ``fused-arena`` and ``rebuild`` together;
- ``fused-arena-rebuild-ln2``: ``fused-arena`` with only the MLP's input (``ln_2``'s output) rebuilt: one
  LayerNorm forward more per block, for the saving that matters most once the MLP keeps only its payload;
- ``compress``: ``actzip.compress_(model, SparseMLPConfig())`` and nothing else: the self-resetting arena and
  the norm outputs marked, so each MLP rebuilds its input (the norm hooks stay on the shared model for the
  other strategies too, where nothing reads the marks);
- ``compress-signpack``: the same with ``codec_options`` sign packing (``check=False``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from actzip.core import registry
from actzip.errors import ConfigError
from actzip.memory import SparseReLUMLP
from actzip_bench.models import GPT, GPTConfig

STRATEGIES = ("none", "checkpoint", "fused", "fused-arena", "fused-arena-signpack", "rebuild", "fused-arena-rebuild",
              "fused-arena-rebuild-ln2", "compress", "compress-signpack")
ONE_LINERS = {"compress": {}, "compress-signpack": {"sign_pack": True, "check": False}}  # codec options
# the model's rebuild_saved option per strategy (default False)
REBUILDS = {"rebuild": True, "fused-arena-rebuild": True, "fused-arena-rebuild-ln2": ("ln_2",)}


@dataclass
class GPTBenchConfig:
    """One reference-GPT workload."""

    preset: str = "gpt2-124m"  # model size
    seq_lens: tuple[int, ...] = (1024, 4096, 8192)  # sequence lengths measured
    tokens_per_step: int = 32768  # batch = tokens_per_step // seq_len
    # Output head + loss this many tokens at a time (GPTConfig.loss_chunk; 0: full float32 logits, which then
    # dominate the peak at this vocabulary and hide every activation saving).
    loss_chunk: int = 4096
    dtype: str = "bfloat16"  # weights and activations
    kernel: str = "auto"  # sparse codec kernel
    rounds: int = 10  # measured steps per strategy and length
    warmup: int = 3  # steps dropped first
    strategies: tuple[str, ...] = STRATEGIES

    def __post_init__(self) -> None:
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad:
            raise ConfigError(f"gpt bench: unknown strategies {bad}; choose from {list(STRATEGIES)}")
        short = [s for s in self.seq_lens if self.tokens_per_step % s]
        if short:
            raise ConfigError(f"gpt bench: tokens_per_step {self.tokens_per_step} is not a multiple of {short}")


def _codec(cfg: GPTBenchConfig, sign_pack: bool):
    opts = {"sign_pack": True, "check": False} if sign_pack else {}
    return registry.get("sparse", kernel=cfg.kernel, **opts)


def run_gpt(cfg: GPTBenchConfig, device: torch.device, progress=None) -> dict:
    from actzip_bench.harness import machine_record, run_interleaved, runnable_strategies
    from actzip.memory.modules.arena import PENDING_STEPS, SETTLE_STEPS, Arena

    cfg, skipped = runnable_strategies(cfg, device)

    runs = []
    for seq in cfg.seq_lens:
        torch.manual_seed(0)
        model = GPT(GPTConfig.of_size(cfg.preset, block_size=seq, loss_chunk=cfg.loss_chunk))
        model = model.to(device=device, dtype=getattr(torch, cfg.dtype))
        opt = model.configure_optimizer(lr=1e-4)
        plain = [b.mlp for b in model.h]
        arenas = {s: Arena(device=device) for s in cfg.strategies if "arena" in s and s.startswith("fused")}

        def swapped(sign_pack: bool, arena) -> list:
            return [SparseReLUMLP(m.c_fc, m.c_proj, square=True, codec=_codec(cfg, sign_pack), names=("c_fc", "c_proj"),
                                  dropout=m.dropout, arena=arena) for m in plain]

        fused = {s: swapped("signpack" in s, arenas.get(s)) for s in cfg.strategies if s.startswith("fused")}
        for s, opts in ONE_LINERS.items():
            if s in cfg.strategies:
                fused[s], arena = _one_liner(model, plain, {"kernel": cfg.kernel, **opts})
                if arena is not None:
                    arenas[s] = arena
        batch = cfg.tokens_per_step // seq
        g = torch.Generator(device="cpu").manual_seed(seq)
        idx = torch.randint(0, model.config.vocab_size, (batch, seq + 1), generator=g).to(device)
        x, y = idx[:, :-1], idx[:, 1:]

        def step(strategy: str) -> None:
            for b, mlp in zip(model.h, fused.get(strategy, plain)):
                b.mlp = mlp
            model.config.checkpoint_blocks = strategy == "checkpoint"
            model.config.rebuild_saved = REBUILDS.get(strategy, False)
            opt.zero_grad(set_to_none=True)
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if strategy in arenas and not arenas[strategy].auto_reset:
                arenas[strategy].reset()

        for strategy, arena in arenas.items():  # untimed first steps: measure the payloads, size the arena
            if arena.auto_reset:  # the one-liner's adaptive arena settles after a few fitting steps
                for _ in range(SETTLE_STEPS + PENDING_STEPS + 2):
                    step(strategy)
                continue
            step(strategy)
            arena.fit()
        held = {s: (lambda a=a: a.capacity_bytes) for s, a in arenas.items()}
        refused = {s: a.overflows() for s, a in arenas.items()}  # the priming step's refusals (empty arena)
        results = run_interleaved({s: (lambda s=s: step(s)) for s in cfg.strategies}, device, rounds=cfg.rounds,
                                  warmup=cfg.warmup, progress=progress, held=held)
        # payloads the arena had no room for in the timed steps (each one recomputed: a matmul more)
        refused = {s: a.overflows() - refused[s] for s, a in arenas.items()}
        base = results["none"]
        for name, r in results.items():
            runs.append({
                "seq_len": seq, "batch": batch, "strategy": name, **r.summary(), "arena_refusals": refused.get(name),
                "peak_bytes_per_token": r.peak_bytes / cfg.tokens_per_step if r.peak_bytes else None,
                "time_vs_none": r.median_ms / base.median_ms,
                "peak_vs_none": r.peak_bytes / base.peak_bytes if r.peak_bytes and base.peak_bytes else None,
            })
        del model, opt, plain, fused, arenas
    return {"config": asdict(cfg), "runs": runs, "skipped": skipped, "machine": machine_record(device)}


def _one_liner(model, plain: list, codec_options: dict):
    """The MLPs ``compress_(model, SparseMLPConfig(...))`` makes, and their arena; the plain MLPs are put back
    (the norm hooks stay), so the strategies keep sharing one model."""
    from actzip.memory.modules import SparseMLPConfig, arena_of, compress_

    compress_(model, SparseMLPConfig(codec_options=codec_options))
    swapped = [b.mlp for b in model.h]
    try:
        arena = arena_of(model)
    except ConfigError:  # no arena where the kernels cannot run (compress_'s report says so)
        arena = None
    for b, m in zip(model.h, plain):
        b.mlp = m
    return swapped, arena
