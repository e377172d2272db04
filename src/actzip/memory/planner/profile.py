"""Measure every option of every unit on the user's own probe step: bytes kept, time added, gradient error.

Each option runs on all units at once (``repeats`` timed steps after one warm-up): a unit's bytes are what its
own block kept; the time an option adds is the step's time over ``keep``'s, shared evenly by the units (they
are the same block); its risk is the relative error of the unit's own parameter gradients against ``keep``'s
(0 for the lossless options, which are checked: bit-identical where two plain steps are, else within ten
times the difference between two plain steps, which non-deterministic GPU kernels make nonzero). What the
step holds besides the units (parameters' gradients, the loss head's tensors) is each option's peak less what
it predicts the units hold; the least of these estimates is taken. The offload option is left out, with the
reason (``Profile.left_out``), where the host's free memory cannot pin what every unit keeps at once.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from actzip.memory.planner.options import LOSSLESS
from actzip.memory.planner.planned import PlannedUnits
from actzip.memory.planner.solver import UnitCosts

__all__ = ["NOISE_MARGIN", "Profile", "planned_peak", "profile"]

# How far past the plain steps' own difference a lossless option's gradients may be (where that difference is
# not 0): a broken lossless option is off by orders of magnitude more, and one sample of the floor is noisy.
NOISE_MARGIN = 10.0


@dataclass
class Profile:
    """What the probe steps measured."""

    costs: list[UnitCosts]  # per unit, every option
    base_bytes: float  # the least of base_by_option (CUDA; 0 on the CPU)
    tokens: int  # the probe step's token count
    inexact: list[str]  # "unit:option" of lossless options whose gradients differed (should be empty)
    peaks: dict[str, float] = dataclasses.field(default_factory=dict)  # each option's step peak (CUDA)
    # per option: its step peak less what it predicts the units hold (kept bytes, and a checkpointed unit's
    # rebuilt tensors at once): what the step holds besides the units, as that option's step sees it
    base_by_option: dict[str, float] = dataclasses.field(default_factory=dict)
    # per unit: the relative difference of its gradients between two plain (keep) steps: 0 where the device's
    # kernels are deterministic; lossless options are held to NOISE_MARGIN times it
    noise_floor: list[float] = dataclasses.field(default_factory=list)
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)  # option -> why it was not profiled


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(model: nn.Module, probe: Callable[[nn.Module], torch.Tensor], device: torch.device):
    for p in model.parameters():
        p.grad = None
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    start = time.perf_counter()
    probe(model).backward()
    _sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else 0
    return seconds, peak


def profile(model: nn.Module, planned: PlannedUnits, probe: Callable[[nn.Module], torch.Tensor],
            options: tuple[str, ...], repeats: int = 3, progress: Callable[[str], None] | None = None) -> Profile:
    """Run ``probe(model).backward()`` under each option (``keep`` first) and measure it."""
    device = next(model.parameters()).device
    unit_params = [[p for p in m.parameters() if p.requires_grad] for _, m in planned.units]
    n = len(planned.units)
    seconds, peaks, grads, kept, left_out = {}, {}, {}, {}, {}
    params = list(model.parameters())
    held = [p.grad for p in params]  # gradients being accumulated: given back untouched
    planned.measure = True
    try:
        for option in ("keep", *[o for o in options if o != "keep"]):
            if option == "offload":
                why = _host_short(sum(kept["keep"]))
                if why:
                    left_out[option] = why
                    continue
            if progress is not None:
                progress(option)
            planned.forced = option
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a fallback is announced once by the library itself
                _step(model, probe, device)  # warm-up
                runs = [_step(model, probe, device) for _ in range(repeats)]
            seconds[option] = statistics.median(r[0] for r in runs)
            peaks[option] = max(r[1] for r in runs)
            grads[option] = _unit_grads(unit_params)
            if option == "offload":
                _release_pinned()
            if option == "keep":  # once more: two plain steps differ by what the device's kernels do not fix
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _step(model, probe, device)
                again = _unit_grads(unit_params)
            kept[option] = [planned.kept_bytes(i, option) if option != "checkpoint" else planned.input_bytes[i]
                            for i in range(n)]
    finally:
        planned.forced, planned.measure = None, False
        for p, g in zip(params, held):
            p.grad = g
    tokens = planned.tokens
    keep_kept = kept["keep"]
    base_by_option = {}
    if device.type == "cuda":
        for option in seconds:
            rebuilt = max(keep_kept) if option == "checkpoint" and keep_kept else 0.0
            base_by_option[option] = max(peaks[option] - sum(kept[option]) - rebuilt, 0.0)
    # The least estimate: a saved tensor the units' accounts miss under one option inflates only that one's.
    base = min(base_by_option.values()) if base_by_option else 0.0
    inexact = []
    costs = []
    floor = [_relative_error(again[i], grads["keep"][i]) for i in range(n)]
    for i, (name, _) in enumerate(planned.units):
        names, b, s, r, t = [], [], [], [], []
        for option in seconds:
            err = _relative_error(grads[option][i], grads["keep"][i])
            if option in LOSSLESS:
                if err > NOISE_MARGIN * floor[i]:  # bit-identical where the kernels are deterministic (floor 0)
                    inexact.append(f"{name}:{option}")
                err = 0.0
            names.append(option)
            b.append(float(kept[option][i]))
            s.append(max(seconds[option] - seconds["keep"], 0.0) / n)
            r.append(err)
            t.append(float(keep_kept[i]) if option == "checkpoint" else 0.0)
        costs.append(UnitCosts(name, tuple(names), tuple(b), tuple(s), tuple(r), tuple(t)))
    return Profile(costs, base, tokens, inexact, peaks if device.type == "cuda" else {}, base_by_option, floor,
                   left_out)


# Pinned host bytes an offload probe step may take per byte the units keep: the caching host allocator rounds
# each block up to a power of two, and blocks of one step are not all free for the next.
HOST_FACTOR = 2.5


def _host_short(keep_bytes: float) -> str | None:
    """Why the host cannot take every unit's tensors offloaded at once (None where it can or cannot tell)."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    need = HOST_FACTOR * keep_bytes
    if need <= available:
        return None
    return (f"its probe would pin about {need / 2**30:,.1f} GiB of host memory (every unit offloaded, "
            f"{HOST_FACTOR:g} x the {keep_bytes / 2**30:,.1f} GiB they keep) and {available / 2**30:,.1f} GiB is free")


def _release_pinned() -> None:
    """Give the pinned host blocks the offload option's probe steps cached back to the system: the caching host
    allocator keeps them otherwise, and a long probe's (a whole model's activations) would stay pinned through
    training. torch.accelerator.empty_host_cache is recent; older releases have only torch._C's entry point."""
    release = (getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)
               or getattr(torch._C, "_host_emptyCache", None))
    if release is not None:
        release()


def _unit_grads(unit_params: list) -> list:
    return [[p.grad.detach().clone() if p.grad is not None else None for p in ps] for ps in unit_params]


def _relative_error(got: list, want: list) -> float:
    num = den = 0.0
    for g, w in zip(got, want):
        if g is None or w is None:
            continue
        if not torch.equal(g, w):
            num += float((g.double() - w.double()).square().sum())
        den += float(w.double().square().sum())
    return (num ** 0.5) / (den ** 0.5) if den > 0 else (0.0 if num == 0 else float("inf"))


def planned_peak(model: nn.Module, probe: Callable[[nn.Module], torch.Tensor]) -> float | None:
    """The peak of one probe step as the units' current plan runs it (the gradients being accumulated are given
    back untouched); None off CUDA, where there is no allocator peak to read."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return None
    params = list(model.parameters())
    held = [p.grad for p in params]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(_step(model, probe, device)[1])
    finally:
        for p, g in zip(params, held):
            p.grad = g
