"""What the whole-model memory benchmarks (reference GPT, Nemotron-H-style hybrid, GRPO policy) share: a batch
of random tokens, transformers' checkpointing switched on, and one result row per strategy."""

from __future__ import annotations

import torch

__all__ = ["enable_hf_checkpointing", "random_tokens", "strategy_rows"]


def random_tokens(vocab_size: int, batch: int, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of ``batch`` random sequences of ``seq`` tokens (seeded by ``seq``)."""
    g = torch.Generator(device="cpu").manual_seed(seq)
    idx = torch.randint(0, vocab_size, (batch, seq + 1), generator=g).to(device)
    return idx[:, :-1], idx[:, 1:]


def enable_hf_checkpointing(model) -> None:
    """transformers' gradient checkpointing of every layer, non-reentrant (under either of its names)."""
    enable = getattr(model, "activation_checkpointing_enable", None)  # newer transformers' name
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def strategy_rows(results: dict, seq: int, batch: int, tokens_per_step: int, refused: dict, grad_diff: dict) -> list:
    """One row per strategy of ``run_interleaved``'s results, against ``none``'s."""
    base = results["none"]
    return [{
        "seq_len": seq, "batch": batch, "strategy": name, **r.summary(), "arena_refusals": refused.get(name),
        "max_grad_abs_diff": grad_diff[name],
        "peak_bytes_per_token": r.peak_bytes / tokens_per_step if r.peak_bytes else None,
        "time_vs_none": r.median_ms / base.median_ms,
        "peak_vs_none": r.peak_bytes / base.peak_bytes if r.peak_bytes and base.peak_bytes else None,
    } for name, r in results.items()]
