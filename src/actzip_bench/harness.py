"""Shared benchmark harness: interleaved variants, warm-up, medians, peak memory, machine record.

Variants are measured round-robin (A B C, B C A, ...) so that drifting clocks or caches hit all of them
alike; the first ``warmup`` rounds are dropped; times are medians. On CUDA a step is timed with CUDA events
and its peak is ``torch.cuda.max_memory_allocated`` over the step (absolute: weights and inputs included).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import platform
import subprocess
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager

import torch


@dataclass
class VariantResult:
    name: str
    times_ms: list[float] = field(default_factory=list)  # one per measured round
    peaks: list[int] = field(default_factory=list)  # bytes, CUDA only

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def peak_bytes(self) -> int | None:
        return max(self.peaks) if self.peaks else None

    def summary(self) -> dict:
        return {
            "median_ms": self.median_ms,
            "min_ms": min(self.times_ms),
            "max_ms": max(self.times_ms),
            "rounds": len(self.times_ms),
            "peak_bytes": self.peak_bytes,
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_interleaved(
    variants: dict[str, Callable[[], None]],
    device: torch.device,
    rounds: int = 10,
    warmup: int = 2,
    progress: Callable[[str], None] | None = None,
    held: dict[str, Callable[[], int]] | None = None,
    above_resident: bool = False,
    around: dict[str, Callable[[], ContextManager]] | None = None,
) -> dict[str, VariantResult]:
    """Run each variant's step ``warmup + rounds`` times, interleaved; return the measured rounds.

    ``held[name]()`` gives bytes that variant ``name`` keeps allocated between its steps (an arena, say).
    They stay allocated while the other variants run, so each variant's peak has the others' held bytes taken
    out: every peak is what the variant would reach running alone. ``above_resident``: a peak is instead the
    most allocated during the step above what was allocated just before it, plus the variant's own held
    bytes (the public BitSparse harness's count).

    ``around[name]()`` gives a context entered before each of that variant's steps and left after it, outside
    its timing (a change to the model the step needs that a real run would make once).
    """
    held, around = held or {}, around or {}
    names = list(variants)
    results = {n: VariantResult(n) for n in names}
    for r in range(warmup + rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            with around[name]() if name in around else contextlib.nullcontext():
                ms, peak = _measure(variants[name], name, device, held, above_resident)
            if r >= warmup:
                results[name].times_ms.append(ms)
                if peak is not None:
                    results[name].peaks.append(peak)
            if progress is not None:
                progress(name)
    return results


def _measure(step: Callable[[], None], name: str, device: torch.device, held: dict, above_resident: bool):
    """One timed run of ``step``: its milliseconds and, on CUDA, its peak (see :func:`run_interleaved`)."""
    gc.collect()
    _sync(device)
    if device.type != "cuda":
        t0 = time.perf_counter()
        step()
        return (time.perf_counter() - t0) * 1e3, None
    torch.cuda.reset_peak_memory_stats(device)
    resident = torch.cuda.memory_allocated(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    _sync(device)
    ms = start.elapsed_time(end)
    if above_resident:
        own = held[name]() if name in held else 0
        return ms, torch.cuda.max_memory_allocated(device) - resident + own
    foreign = sum(fn() for other, fn in held.items() if other != name)
    return ms, torch.cuda.max_memory_allocated(device) - foreign


def runnable_strategies(cfg, device: torch.device):
    """``cfg`` without the strategies needing Triton kernels (names with "arena") where they cannot run."""
    import dataclasses

    from actzip.kernels import runtime

    why = runtime.unavailable_reason(device)
    if why is None and device.type == "cpu":
        why = "Triton's CPU interpreter is for checking kernels, not for timing them"
    if why is None:
        return cfg, {}
    skipped = {s: why for s in cfg.strategies if "arena" in s}
    kept = tuple(s for s in cfg.strategies if s not in skipped)
    return dataclasses.replace(cfg, strategies=kept), skipped


def machine_record(device: torch.device) -> dict:
    """Where and with what a result was measured."""
    rec = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host_cpu": cpu_name(),
        "cores": os.cpu_count(),
        "code_version": code_version(),
    }
    try:
        import triton

        rec["triton"] = triton.__version__
    except ImportError:
        rec["triton"] = None
    if device.type == "cuda":
        rec["gpu"] = torch.cuda.get_device_name(device)
        rec["gpus"] = torch.cuda.device_count()  # of the host; a multi-process run uses one per process
        rec["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
    return rec


def code_version() -> str | None:
    """The commit of the code that ran, so that the runs of one comparison can be shown to share it:
    ``ACTZIP_CODE_VERSION`` when set (a copy of the tree without its git history), else the HEAD of the git
    checkout holding this package, with ``+dirty`` when its ``src/`` differs from HEAD; None outside a checkout."""
    if os.environ.get("ACTZIP_CODE_VERSION"):
        return os.environ["ACTZIP_CODE_VERSION"]
    src = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, rounds: int = 20) -> float:
    """Measured device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    times = []
    for i in range(rounds + 3):
        _sync(device)
        t0 = time.perf_counter()
        if device.type == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src)
            e.record()
            _sync(device)
            dt = s.elapsed_time(e) / 1e3
        else:
            dst.copy_(src)
            dt = time.perf_counter() - t0
        if i >= 3:
            times.append(dt)
    return 2 * nbytes / statistics.median(times)
