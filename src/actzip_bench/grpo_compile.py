"""The compiled baseline of ``bench grpo``: the policy under ``torch.compile`` with PyTorch's own
``torch._functorch.config.activation_memory_budget``, at the largest budget whose peak fits a limit.

PyTorch's knob is a fraction of the compiled graph's saved bytes (1.0 saves what the default partitioner
saves, 0.0 recomputes all it can), not a peak, and it only chooses between saving and recomputing. To compare
at equal peak, the candidates are compiled in turn, from the largest, and the first whose measured update peak
is within the limit is kept (on a device without a peak reading, the first). Every candidate's peak is recorded.
"""

from __future__ import annotations

import torch

__all__ = ["BUDGETS", "CompiledPolicy", "compile_within", "describe_tried"]

BUDGETS = (0.5, 0.2, 0.05)  # fractions tried, largest first


class CompiledPolicy:
    """The kept candidate: its copy of the policy, its budget, and what every candidate measured."""

    def __init__(self, model, budget: float, tried: list[dict]):
        self.model = model  # a weight-sharing copy whose forward is compiled
        self.budget = budget  # the activation_memory_budget it was compiled under
        self.tried = tried  # [{"budget", "peak_bytes"}] in the order tried


def _peak_of(step, model, device: torch.device) -> int | None:
    if device.type != "cuda":
        step(model)
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step(model)
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - before)


def compile_within(model, step, limit_bytes: int | None, device: torch.device,
                   budgets: tuple[float, ...] = BUDGETS, log=None, backend: str = "inductor") -> CompiledPolicy:
    """Compile weight-sharing copies of ``model`` under each budget in turn (``step(copy)`` runs one update:
    the first compiles it) and keep the first whose update peak is ``<= limit_bytes`` (else the last tried).

    The chosen budget stays set in ``torch._functorch.config`` (a recompilation on new shapes partitions under
    it too); the caller restores the old value when done.
    """
    import torch._functorch.config as functorch_config

    from actzip_bench.one_liner import shared_copy

    tried = []
    kept = None
    for b in budgets:
        if log is not None:
            log(f"compile: activation_memory_budget {b}")
        torch._dynamo.reset()
        functorch_config.activation_memory_budget = b
        twin = shared_copy(model)
        twin.forward = torch.compile(twin.forward, backend=backend)
        step(twin)  # compiles
        peak = _peak_of(step, twin, device)
        tried.append({"budget": b, "peak_bytes": peak})
        kept = CompiledPolicy(twin, b, tried)
        if limit_bytes is None or peak is None or peak <= limit_bytes:
            break
    return kept


def describe_tried(tried: list[dict]) -> str:
    """``"0.5: 5,467 MiB, 0.2: 1,811 MiB"``: each budget tried with its peak (``n/a`` where none was read)."""
    def peak(t: dict) -> str:
        return "n/a" if t["peak_bytes"] is None else f"{t['peak_bytes'] / 2**20:,.0f} MiB"

    return ", ".join(f"{t['budget']}: {peak(t)}" for t in tried)
