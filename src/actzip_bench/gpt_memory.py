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
  the norm outputs marked, so each MLP and attention projection rebuilds its input (run on a copy of the model
  that shares its weights, :mod:`actzip_bench.one_liner`, so the hooks stay off the other strategies);
- ``compress-signpack``: the same with ``codec_options`` sign packing (``check=False``).

Each row carries ``max_grad_abs_diff``: the largest gradient difference to ``none`` after one forward and
backward from the same weights. ``model="nemotron-h"`` runs the same measurement on a Nemotron-H-style hybrid
(:mod:`actzip_bench.hybrid_memory`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from actzip.core import registry
from actzip.errors import ConfigError
from actzip.memory import SparseReLUMLP
from actzip_bench.models import GPT, GPTConfig
from actzip_bench.model_rows import random_tokens, strategy_rows
from actzip_bench.one_liner import compressed_copies, max_grad_diffs

STRATEGIES = ("none", "checkpoint", "fused", "fused-arena", "fused-arena-signpack", "rebuild", "fused-arena-rebuild",
              "fused-arena-rebuild-ln2", "compress", "compress-signpack")
# the model's rebuild_saved option per strategy (default False)
REBUILDS = {"rebuild": True, "fused-arena-rebuild": True, "fused-arena-rebuild-ln2": ("ln_2",)}
MODELS = ("reference", "nemotron-h")  # the reference GPT, or a hybrid from a local transformers NemotronHConfig


@dataclass
class GPTBenchConfig:
    """One reference-GPT (or Nemotron-H-style) workload."""

    model: str = "reference"  # "reference": the ReLU² GPT; "nemotron-h": the hybrid (actzip_bench.hybrid_memory)
    preset: str | None = None  # model size (default gpt2-124m, or nemotron-h-small for the hybrid)
    seq_lens: tuple[int, ...] = (1024, 4096, 8192)  # sequence lengths measured
    tokens_per_step: int = 32768  # batch = tokens_per_step // seq_len
    # Output head + loss this many tokens at a time (GPTConfig.loss_chunk; 0: full float32 logits, which then
    # dominate the peak at this vocabulary and hide every activation saving).
    loss_chunk: int = 4096
    dtype: str = "bfloat16"  # weights and activations
    kernel: str = "auto"  # sparse codec kernel
    rounds: int = 10  # measured steps per strategy and length
    warmup: int = 3  # steps dropped first
    strategies: tuple[str, ...] | None = None  # default: every strategy the model has

    def __post_init__(self) -> None:
        from actzip_bench.hybrid_memory import HYBRID_PRESETS, HYBRID_STRATEGIES

        if self.model not in MODELS:
            raise ConfigError(f"gpt bench: unknown model {self.model!r}; choose from {list(MODELS)}")
        hybrid = self.model == "nemotron-h"
        known = HYBRID_STRATEGIES if hybrid else STRATEGIES
        if self.strategies is None:
            self.strategies = known
        if self.preset is None:
            self.preset = "nemotron-h-small" if hybrid else "gpt2-124m"
        if hybrid and self.preset not in HYBRID_PRESETS:
            raise ConfigError(f"gpt bench: unknown nemotron-h preset {self.preset!r}; choose from {list(HYBRID_PRESETS)}")
        bad = [s for s in self.strategies if s not in known]
        if bad:
            raise ConfigError(f"gpt bench: unknown strategies {bad} for model {self.model!r}; choose from {list(known)}")
        short = [s for s in self.seq_lens if self.tokens_per_step % s]
        if short:
            raise ConfigError(f"gpt bench: tokens_per_step {self.tokens_per_step} is not a multiple of {short}")


def _codec(cfg: GPTBenchConfig, sign_pack: bool):
    opts = {"sign_pack": True, "check": False} if sign_pack else {}
    return registry.get("sparse", kernel=cfg.kernel, **opts)


def run_gpt(cfg: GPTBenchConfig, device: torch.device, progress=None) -> dict:
    from actzip_bench.harness import machine_record, run_interleaved, runnable_strategies
    from actzip.memory.modules.arena import PENDING_STEPS, SETTLE_STEPS, Arena

    if cfg.model == "nemotron-h":
        from actzip_bench.hybrid_memory import run_hybrid

        return run_hybrid(cfg, device, progress)
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
        copies = compressed_copies(model, cfg.strategies, cfg.kernel, arenas)
        batch = cfg.tokens_per_step // seq
        x, y = random_tokens(model.config.vocab_size, batch, seq, device)

        def backward(strategy: str) -> None:
            m = copies.get(strategy, model)
            if m is model:
                for b, mlp in zip(model.h, fused.get(strategy, plain)):
                    b.mlp = mlp
                model.config.checkpoint_blocks = strategy == "checkpoint"
                model.config.rebuild_saved = REBUILDS.get(strategy, False)
            _, loss = m(x, y)
            loss.backward()
            if strategy in arenas and not arenas[strategy].auto_reset:
                arenas[strategy].reset()

        def step(strategy: str) -> None:
            opt.zero_grad(set_to_none=True)
            backward(strategy)
            opt.step()
            opt.zero_grad(set_to_none=True)

        for strategy, arena in arenas.items():  # untimed first steps: measure the payloads, size the arena
            if arena.auto_reset:  # the one-liner's adaptive arena settles after a few fitting steps
                for _ in range(SETTLE_STEPS + PENDING_STEPS + 2):
                    step(strategy)
                continue
            step(strategy)
            arena.fit()
        grad_diff = max_grad_diffs({s: (lambda s=s: backward(s)) for s in cfg.strategies}, list(model.parameters()))
        held = {s: (lambda a=a: a.capacity_bytes) for s, a in arenas.items()}
        refused = {s: a.overflows() for s, a in arenas.items()}  # the priming step's refusals (empty arena)
        results = run_interleaved({s: (lambda s=s: step(s)) for s in cfg.strategies}, device, rounds=cfg.rounds,
                                  warmup=cfg.warmup, progress=progress, held=held)
        # payloads the arena had no room for in the timed steps (each one recomputed: a matmul more)
        refused = {s: a.overflows() - refused[s] for s, a in arenas.items()}
        runs += strategy_rows(results, seq, batch, cfg.tokens_per_step, refused, grad_diff)
        del model, opt, plain, fused, arenas, copies
    return {"config": asdict(cfg), "runs": runs, "skipped": skipped, "machine": machine_record(device)}
