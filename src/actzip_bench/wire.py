"""Pipeline training over slow links: dense vs each boundary compressor (``actzip bench wire``).

The reference GPT is split into ``stages`` pipeline stages and trained from the same initial weights on the
same batches once per compressor entry: ``dense``, the byte codecs applied to the dense boundary (``bf16``,
``quant``, ``mask``, ``topk``, ``delta``) and the stage-boundary compressors built into the stages
(:func:`actzip_bench.models.gpt_stages.build_gpt_stages`: ``subspace``, ``bottleneck``, ``stiefel``, ``stiefel-rvq``). An entry is
``name:ratio`` (``quant:8``, ``stiefel:16``); the ratio is the nominal forward compression of float32
activations, and the measured one is reported next to it. ``name:ratio@lr`` trains that entry at its own AdamW
learning rate, so one run can sweep rates and compare each entry at its best: with several dense entries the
target and every gap are the best dense run's.

Every run records each stage's actions with measured compute times and exact bytes on the wire, then
:func:`actzip.wire.link.simulate` replays the schedule over links of each bandwidth (same latency each way):
bytes per token each way, step time, loss at equal tokens, and the time to reach the dense run's final loss,
the fair metric (a compressor that steps faster but needs more steps shows it there).

Byte codecs per entry (float32 activations; the backward codec follows the forward one unless ``bwd_codec`` is
given): ``bf16`` a cast to bfloat16 both ways (what a model trained in bf16 sends); ``quant:r`` k-bit stochastic quantization with ``k = 32 / r`` (4, 8, 16, 32) both ways;
``mask:r`` random keep ``1 / r`` with ``r`` rescale both ways; ``topk:r`` top-k keep ``1 / (2 r)`` (values plus
int32 indices) both ways; ``delta:r`` AQ-SGD delta at ``k = 32 / r`` bits forward, k-bit quantization backward.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from dataclasses import asdict

import torch

from actzip.errors import ConfigError
from actzip.wire import LinkSpec, Pipeline, Timeline, simulate
from actzip_bench.data import Corpus
from actzip_bench.harness import machine_record
from actzip_bench.models import GPTConfig
from actzip_bench.models.gpt_stages import split_gpt  # noqa: F401  (an old name of this module, for one release)
from actzip_bench.wire_config import (  # noqa: F401  (QUICK: importable from here too)
    QUICK,
    Batches,
    WireBenchConfig,
    build_stages_for,
    codec_specs,
    entry_lr,
    parse_entry,
    pipeline_config,
)
from actzip_bench.wire_processes import train_entry_processes


def first_reach(losses: list[float], window: int, target: float | None) -> int | None:
    """Index of the first loss whose trailing mean over ``window`` values (fewer at the start) is at most
    ``target``: when a run reaches the target loss. None if it never does, or without a target."""
    acc = 0.0
    for i, v in enumerate(losses):
        acc += v
        if i >= window:
            acc -= losses[i - window]
        if target is not None and acc / min(i + 1, window) <= target + 1e-12:
            return i
    return None


def train_entry(cfg: WireBenchConfig, entry: str, device: torch.device, corpus: Corpus, progress=None,
                target: float | None = None) -> dict:
    """Train one entry for ``steps`` steps, then on (up to ``target_steps * steps``) until its smoothed loss
    reaches ``target``; its losses, trace and bytes (before any link is applied)."""
    name, ratio = parse_entry(entry)
    gcfg = cfg.gpt_config()
    fwd, bwd = codec_specs(name, ratio, cfg.bwd_codec, cfg.stage_codec)
    if cfg.mode == "processes":
        out = train_entry_processes(cfg, entry, device, target=target)
        if progress is not None:  # the stage processes report nothing while they run: the entry at once
            for step in range(cfg.steps):
                progress(entry, step)
        return out
    if name == "delta" and cfg.dataset_windows is None:
        raise ConfigError("delta caches activations per sample and needs repeated samples: set dataset_windows")
    stages = [s.to(device) for s in build_stages_for(gcfg, cfg.stages, name, ratio, cfg.seed, cfg.boundary_options())]
    pipe = Pipeline(stages, pipeline_config(cfg, entry), device)
    batches = Batches(corpus, cfg.batch_size, gcfg.block_size, cfg.seed, cfg.dataset_windows)
    window = max(1, round(cfg.smooth * cfg.steps))
    limit = cfg.steps if target is None else max(cfg.steps, round(cfg.target_steps * cfg.steps))
    val = None
    for step in range(limit):
        if step == cfg.steps:  # validation at equal tokens, before a run short of the target trains on
            val = _val_loss(pipe, corpus, cfg, device)
        if step >= cfg.steps and statistics.fmean(pipe.losses[-window:]) <= target:
            break
        x, y, ids = batches(step)
        pipe.train_step(x.to(device), y.to(device), ids)
        if progress is not None:
            progress(entry, step)
    val = _val_loss(pipe, corpus, cfg, device) if val is None else val
    tokens = cfg.steps * cfg.batch_size * gcfg.block_size  # equal tokens: the first `steps` steps
    boundaries = cfg.stages - 1
    acts = pipe.actions
    fwd_b = sum(a.send_bytes for a in acts if a.kind == "F" and a.step < cfg.steps)
    bwd_b = sum(a.send_bytes for a in acts if a.kind == "B" and a.step < cfg.steps)
    errors = [e for st in stages if (e := _rvq_error(st)) is not None]
    return {"entry": entry, "compressor": name, "ratio": ratio, "fwd_codec": fwd, "bwd_codec": bwd,
            "rvq_relative_error": statistics.fmean(errors) if errors else None,
            "losses": pipe.losses, "val_loss": val, "actions": acts, "tokens": tokens,
            "bytes_per_token_fwd": fwd_b / (tokens * boundaries), "bytes_per_token_bwd": bwd_b / (tokens * boundaries),
            "wire_bytes_checked": sum(m.total("sent", "fwd") + m.total("sent", "bwd") for m in pipe.meters())}


def _rvq_error(stage) -> float | None:
    """The relative error of a stage's RVQ codes over the run (its sender's), if it quantizes them."""
    measure = getattr(stage.sender, "rvq_relative_error", None)
    return measure() if callable(measure) else None


def _val_loss(pipe, corpus, cfg, device) -> float:
    g = torch.Generator().manual_seed(1234)  # the same held-out batches for every entry
    batches = (corpus.get_batch("val", cfg.batch_size, cfg.gpt_config().block_size, generator=g)
               for _ in range(cfg.eval_batches))  # fmt: skip
    return statistics.fmean(pipe.eval_loss(x.to(device), y.to(device)) for x, y in batches)


def _median_step(ends: list[float] | None) -> float | None:
    """Median wall-clock step time of a run made with one process per stage (None for one process)."""
    if not ends:
        return None
    return statistics.median([b - a for a, b in zip([0.0, *ends], ends)])


def summarize(cfg: WireBenchConfig, trained: list[dict], dense_bytes_per_token: float,
              measured: LinkSpec | None = None) -> tuple[list[dict], dict]:
    """JSON runs, one per (entry, bandwidth), with the time to the dense run's final loss; and the curves.

    Times are simulated from the measured trace over each bandwidth's link; with ``measured`` (runs made through
    that real link) they are the measured wall-clock times instead, and the simulation is reported beside them.
    """
    window = max(1, round(cfg.smooth * cfg.steps))
    every = max(1, cfg.steps // 200)
    finals = {t["entry"]: statistics.fmean(t["losses"][cfg.steps - window : cfg.steps]) for t in trained}
    ref = min((t for t in trained if t["compressor"] == "dense"), key=lambda t: finals[t["entry"]], default=None)
    target = cfg.target_loss if cfg.target_loss is not None else (finals[ref["entry"]] if ref is not None else None)
    runs, curves = [], {}
    for t in trained:
        per_step = [0] * len(t["losses"])
        for a in t["actions"]:
            per_step[a.step] += a.send_bytes
        cum = list(itertools.accumulate(b / (cfg.stages - 1) for b in per_step))
        curves[t["entry"]] = {"every": every, "loss": t["losses"][::every], "bytes_per_boundary": cum[::every],
                              "time_s": {}}
    links = [measured] if measured is not None else [LinkSpec(bw, cfg.latency_ms if bw is not None else 0.0)
                                                     for bw in (*cfg.bandwidths, None)]
    for link in links:
        bw = link.bandwidth_mbps
        ref_time = None
        for t in ([ref] if ref is not None else []) + [t for t in trained if t is not ref]:
            tl = simulate(t["actions"], link)
            sim_step = tl.median_step_s
            if measured is not None:
                tl = Timeline(t["wall_step_end_s"], tl.busy_s, tl.link_bytes)
            hit = first_reach(t["losses"], window, target)
            ttt = tl.step_end_s[hit] if hit is not None else None
            if t is ref:
                ref_time = ttt
            curves[t["entry"]]["time_s"]["inf" if bw is None else f"{bw:g}"] = tl.step_end_s[::every]
            runs.append({
                "compressor": t["compressor"], "ratio": t["ratio"], "bandwidth_mbps": bw,
                "bytes_per_token_fwd": t["bytes_per_token_fwd"], "bytes_per_token_bwd": t["bytes_per_token_bwd"],
                "tokens": t["tokens"], "final_loss": finals[t["entry"]], "step_time_s": tl.median_step_s,
                "lr": entry_lr(t["entry"], cfg.lr),
                "time_to_target_s": ttt,
                "entry": t["entry"], "fwd_codec": t["fwd_codec"], "bwd_codec": t["bwd_codec"],
                "measured_ratio_fwd": dense_bytes_per_token / t["bytes_per_token_fwd"],
                "latency_ms": link.latency_ms, "val_loss": t["val_loss"], "total_time_s": tl.total_s,
                "rvq_relative_error": t.get("rvq_relative_error"),
                "loss_gap": None if target is None else finals[t["entry"]] / target - 1,
                "speedup_to_target": (ref_time / ttt) if ref_time and ttt else None,
                "steps_to_target": None if hit is None else hit + 1, "steps_run": len(t["losses"]),
                "time_source": "simulated" if measured is None else "measured", "simulated_step_time_s": sim_step,
                "wall_step_time_s": _median_step(t.get("wall_step_end_s")),
                **({"link_counters": t["link_counters"]} if "link_counters" in t else {}),
            })
    return runs, curves


def run_wire(cfg: WireBenchConfig, device: torch.device, progress=None, on_entry=None) -> dict:
    """Train every entry (dense first: it sets the target) and summarize over every link.

    ``on_entry(record)``, if given, receives the record of the entries trained so far after each one, so a long
    run that is cut short still leaves its finished entries (the CLI writes them to ``--json``)."""
    corpus = Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
    threads = torch.get_num_threads()
    if cfg.threads is not None and device.type == "cpu":
        # All stages share one process; on a shared CPU, OpenMP threads contending for cores made compute
        # times up to 10x slower and far noisier than one thread.
        torch.set_num_threads(cfg.threads)
    # dense first: the best dense run sets the target
    order = sorted(cfg.compressors, key=lambda e: parse_entry(e)[0] != "dense")
    trained, target = [], cfg.target_loss
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    window = max(1, round(cfg.smooth * cfg.steps))
    gcfg = cfg.gpt_config()
    dense_bpt = gcfg.n_embd * 4.0  # float32 activations, headers excluded
    try:
        if cfg.mode == "netns":  # every entry through a real link of each bandwidth
            runs, curves = [], {}
            for bw in cfg.bandwidths:
                link = LinkSpec(bw, cfg.latency_ms)
                trained = [train_entry_processes(cfg, e, device, link) for e in order]
                r, c = summarize(cfg, trained, dense_bpt, measured=link)
                runs += r
                for k, v in c.items():
                    curves.setdefault(k, v)["time_s"].update(v["time_s"])
        else:
            for e in order:
                dense = parse_entry(e)[0] == "dense"
                trained.append(train_entry(cfg, e, device, corpus, progress, None if dense else target))
                if dense and cfg.target_loss is None:
                    final = statistics.fmean(trained[-1]["losses"][cfg.steps - window : cfg.steps])
                    target = final if target is None else min(target, final)
                if on_entry is not None and len(trained) < len(order):
                    on_entry(_record(cfg, gcfg, *summarize(cfg, trained, dense_bpt), device))
            runs, curves = summarize(cfg, trained, dense_bpt)
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)
    return _record(cfg, gcfg, runs, curves, device)


def _record(cfg: WireBenchConfig, gcfg: GPTConfig, runs: list[dict], curves: dict, device: torch.device) -> dict:
    ref = [r["final_loss"] for r in runs if r["compressor"] == "dense"]
    return {
        "config": asdict(cfg), "gpt": dataclasses.asdict(gcfg), "mode": cfg.mode,
        "target_loss": cfg.target_loss if cfg.target_loss is not None else (min(ref) if ref else None),
        "runs": runs, "curves": curves,
        "machine": machine_record(device),
    }
