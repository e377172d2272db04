"""Activation-cache benchmark: bytes kept for backward, peak memory and step time, per model and strategy.

Models (``bf16`` by default, sdpa attention, AdamW, one fixed batch of the embedded corpus):

- ``gpt-relu2``, ``gpt-gelu``: the reference GPT (:mod:`actzip_bench.models.gpt`) at ``gpt_preset`` with that MLP
  activation;
- ``llama-swiglu``: a HuggingFace ``LlamaForCausalLM`` built from a local ``LlamaConfig`` of the same width,
  depth and heads (SwiGLU MLP with ``hidden_act="silu"``, intermediate size ``llama_ffn_ratio`` x width,
  RMSNorm, rotary positions, untied output head); nothing is downloaded.

Every model's loss is the same: the output head and a float32 cross entropy over the next byte, computed
``loss_chunk`` tokens at a time with each chunk's logits recomputed in backward (the reference GPT's
``loss_chunk``; :func:`head_loss` for the Llama), so the ``tokens x vocab`` logits do not dominate the peak and
hide what the strategies save. ``loss_chunk=0`` keeps the full float32 log-softmax instead.

Strategies (:data:`STRATEGIES`; every model keeps one set of weights and one optimizer for all of them, and
the strategies only change what is saved for backward):

- ``none``: plain PyTorch; ``checkpoint``: every block recomputed in backward (the GPT's ``checkpoint_blocks``,
  HuggingFace's non-reentrant activation checkpointing);
- ``sparse``: the activation cache (:class:`~actzip.memory.cache.CacheContext`) with its default rules (lossless sparse for mostly-zero
  tensors; the same rules as the ``lossless`` preset, which is accepted as a name too);
- ``conservative``, ``balanced``, ``aggressive``: the presets of :mod:`actzip.memory.cache.presets` (linear inputs
  at 8 / 4 / 2 bits), the cache tracking each tensor's role;
- ``4bit``: the ``4bit`` preset, every activation at 4 bits but the loss head's (linear inputs and ``other``
  stochastic, the rest nearest; it opts out of the presets' 8-bit safety rule for nonlinear inputs, as ActNN and GACT do);
- ``2bit``: the ``2bit`` preset, ``4bit`` with linear inputs and ``other`` at 2 bits (stochastic);
- ``sketch-d8``: every ``nn.Linear`` but the output head as :class:`~actzip.memory.SketchedLinear` at rank
  ``in_features / 8`` (CompAct-style: a random sketch of each linear input instead of the input);
- ``4bit+norms``, ``2bit+norms``, ``sketch-d8+norms`` (not in the default list): the same with every norm output
  rebuilt in backward from the norm's input (``compress_(model, NormRebuildConfig())``: transformers RMSNorms
  swapped for exact lean ones, the projections they feed keeping a rebuild handle), applied before each of
  the strategy's steps and undone after it, outside the step's timing;
- ``2bit+derivatives``, ``2bit+norms+derivatives`` (not in the default list): ``2bit`` (with the norms rebuilt)
  and the GELUs / SiLUs keeping their derivative instead of their input, a 2-bit linear input
  (``compress_(model, DerivativeActivationConfig())``, applied and undone as the norms are; a model with neither
  activation runs its base strategy).

Measured per model and strategy:

- bytes: one untimed probe step per strategy, on the same weights, under the strategy's cache (or, for
  ``none`` / ``checkpoint`` / ``sketch-d8``, a count-only cache that stores everything as it is): the distinct
  activation bytes autograd keeps (parameters and inputs excluded; a sketch counts its ``x S``). With
  ``loss_chunk=0`` the loss head's float32 log-softmax output (``tokens x vocab``, kept by every strategy) is
  reported on its own (``head_bytes``), so the ratio over the rest can be read too;
- gradient error: in the same probe step, ``|g - g_none| / |g_none|`` over all parameters, the cosine, and
  whether every gradient is bit-identical to ``none``'s. The probe steps run under
  ``torch.use_deterministic_algorithms(True)`` (so cuDNN attention takes its deterministic backward): without
  it two plain runs on an H200 already differ (``results/h200/exactness/``), and a lossless strategy could not
  be told from noise;
- step time: forward + backward + AdamW step, CUDA events, median over ``rounds`` after ``warmup``, the
  strategies interleaved round-robin (:func:`actzip_bench.harness.run_interleaved`); the timed steps of
  ``none``, ``checkpoint`` and ``sketch-d8`` run with no cache at all;
- peak: ``torch.cuda.max_memory_allocated`` over the step (weights, gradients, optimizer state and the
  batch included), and ``resident_bytes``, what stays allocated between steps (weights + optimizer state);
- ``last_loss``: the loss of each strategy's last timed step (a sanity check: the weights are shared, so
  these are points of one training run, not separate runs).

With ``compile`` the loss runs under ``torch.compile`` for every strategy alike (:func:`compiled_model`): the
cache then decides, at compile time, what the compiled graphs save (:mod:`actzip.memory.cache.graph_hooks`), and
the count-only probe of ``none`` counts what the compiled bf16 step saves. The warm-up steps include the
compilations. Under ``inductor-cudagraphs`` each step begins with ``torch.compiler.cudagraph_mark_step_begin()``
and the graphs' memory pools count in the peak. With ``graphs`` each strategy's eager step is captured whole as a
CUDA graph (:func:`captured_step`, the caches ``graph_safe``) and the timed steps are its replays; no peak then.

On the CPU the same code runs at a tiny size (``QUICK``); time is then wall-clock and there is no peak.
"""

from __future__ import annotations

import gc
import math
import os
import warnings
from dataclasses import asdict

import torch

from actzip_bench.cache_config import (BYTE_VOCAB, DESCRIPTIONS, HEAD, KNOWN_STRATEGIES, LLAMA_VOCAB, MODELS, QUICK,
                                       STRATEGIES, CacheBenchConfig, with_quick)
from actzip.errors import ConfigError
from actzip_bench.cache_models import BenchModel, adamw, build_model, head_loss
from actzip_bench.cache_render import render
from actzip_bench.cache_strategies import Strategy, sketch_modules, sketch_strategy_modules, strategy_rules, use_modules
from actzip_bench.cache_targets import TARGETS, evaluate_targets, format_target

# The benchmark's parts live in cache_config, cache_models, cache_strategies, cache_targets and cache_render;
# this module runs it, and its names are importable from here too.
__all__ = ["BYTE_VOCAB", "DESCRIPTIONS", "HEAD", "KNOWN_STRATEGIES", "LLAMA_VOCAB", "MODELS", "QUICK", "STRATEGIES",
           "TARGETS", "BenchModel", "CacheBenchConfig", "Strategy", "adamw", "build_model", "evaluate_targets",
           "format_target", "head_loss", "render", "run_cache", "run_model", "sketch_modules",
           "strategy_rules", "use_modules", "with_quick"]


def _probe(strategies: dict[str, Strategy], model: BenchModel, x, y, tokens: int, batch: int,
           compiled: bool = False) -> dict[str, dict]:
    """One untimed step per strategy on the same weights: bytes by rule, loss-head bytes, gradient error.

    ``compiled``: the loss is a compiled function, and each cache and global setting is a variant dynamo
    compiles anew; the probe then uses each strategy's own cache (one count-only cache for those without), so
    that it compiles nothing the timed steps do not, and leaves the deterministic algorithms as they are (the
    gradient error then includes the GPU's run-to-run noise; no head bytes are observed)."""
    from actzip.memory.cache import CacheContext, Rule, count_only_rules

    params = [(n, p) for n, p in model.module.named_parameters() if p.requires_grad]
    vocab = model.vocab_size
    out, ref = {}, None
    counter = CacheContext.count_only()
    for name, s in strategies.items():  # "none" first
        head: list[int] = []

        def observe(t: torch.Tensor, head: list[int] = head) -> bool:  # sees every new saved tensor, never decides
            full = t.dim() >= 1 and t.shape[-1] == vocab and t.numel() >= (tokens - batch) * vocab
            if full and t.dtype == torch.float32:
                head.append(t.numel() * t.element_size())
            return False

        rules = s.rules if s.rules is not None else count_only_rules()
        if compiled:
            cache = s.cache if s.cache is not None else counter
        else:
            cache = CacheContext(rules=[Rule(f"observe {HEAD}", observe), *rules])
        for _, p in params:
            p.grad = None
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(not compiled or was)
        try:
            with s.prepared(), s:
                with s.forward_context(cache):
                    loss = model.loss(x, y)
                loss.backward()
        finally:
            torch.use_deterministic_algorithms(was)
        acc = cache.last
        rec = {"bytes_dense": acc.bytes_before, "bytes_saved": acc.bytes_after, "head_bytes": sum(head),
               "duplicates": acc.duplicates, "probe_loss": float(loss.detach()),
               "by_rule": {k: vars(v).copy() for k, v in acc.by_rule.items()}}
        if ref is None:
            ref = [None if p.grad is None else p.grad.detach().clone() for _, p in params]
        else:
            sums = torch.zeros(4, dtype=torch.float64, device=x.device)  # |b - a|², |a|², a·b, |b|²; one sync
            for (_, p), g0 in zip(params, ref):
                if g0 is None:
                    continue
                a, b = g0.float(), (torch.zeros_like(g0) if p.grad is None else p.grad).float()
                sums += torch.stack([((b - a) ** 2).sum(), (a * a).sum(), (a * b).sum(), (b * b).sum()]).double()
            num, den, dot, nrm = sums.tolist()
            rec["grad_rel_error"] = math.sqrt(num / den) if den else None
            rec["grad_bit_identical"] = bool(ref) and all(
                (g0 is None) == (p.grad is None) and (g0 is None or torch.equal(g0, p.grad))
                for (_, p), g0 in zip(params, ref))
            rec["grad_cosine"] = dot / math.sqrt(den * nrm) if den and nrm else None
        out[name] = rec
    out["none"].update(grad_rel_error=0.0, grad_cosine=1.0, grad_bit_identical=True)
    for _, p in params:
        p.grad = None
    return out


def compiled_model(model: BenchModel, backend: str) -> BenchModel:
    """``model`` with its loss under ``torch.compile(backend=backend)`` (``inductor-cudagraphs``: inductor with
    ``mode="reduce-overhead"``). Each strategy's cache, checkpointing and module swap is a variant dynamo
    compiles once (it guards on the saved-tensor hooks and the modules): the limit of variants per function is
    raised so that none of them falls back to eager code."""
    import dataclasses

    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 1024)
    if backend == "inductor-cudagraphs":
        return dataclasses.replace(model, loss=torch.compile(model.loss, backend="inductor", mode="reduce-overhead"))
    return dataclasses.replace(model, loss=torch.compile(model.loss, backend=backend))


def captured_step(s: Strategy, opt, x, y, last_loss: dict):
    """Strategy ``s``'s training step captured as a CUDA graph, after torch's warm-up on a side stream (three
    eager steps: kernels compiled, roles tracked, the step noise's offsets made); ``last_loss[s.name]`` is the
    graph's loss, which each replay rewrites. Each graph has a memory pool of its own: with one pool shared by
    every strategy's graph, the first GPU runs ended with losses that read as memory another graph had written
    (``results/h100/cache-graphs-shared-pool/SOURCE.md``)."""
    if x.device.type != "cuda":
        raise ConfigError(f"cache bench: graphs capture CUDA graphs; the device is {x.device}")
    with s, s.prepared():
        side = torch.cuda.Stream(x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                s.train_step(opt, x, y)
        torch.cuda.current_stream(x.device).wait_stream(side)
        opt.zero_grad(set_to_none=True)  # the gradients are then made in the graph's memory
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            last_loss[s.name] = s.train_step(opt, x, y)
    return graph


def run_model(name: str, cfg: CacheBenchConfig, device: torch.device, corpus, progress=None) -> dict:
    from actzip_bench.harness import run_interleaved

    model = build_model(name, cfg, device)
    if cfg.compile:
        model = compiled_model(model, cfg.compile)
    n_params = sum(p.numel() for p in model.module.parameters())
    opt = adamw(model.module, cfg.lr, capturable=cfg.graphs)
    sketched, plain = sketch_strategy_modules(model, cfg) if "sketch-d8" in cfg.strategies else (None, None)
    order = ["none", *[s for s in cfg.strategies if s != "none"]]
    strategies = {s: Strategy(s, cfg, model, sketched, plain) for s in order}
    g = torch.Generator().manual_seed(cfg.seed)
    x, y = corpus.get_batch("train", cfg.batch_size, cfg.seq_len, generator=g, device=device)
    tokens = cfg.batch_size * cfg.seq_len

    probes = _probe(strategies, model, x, y, tokens, cfg.batch_size, compiled=bool(cfg.compile))
    last_loss: dict[str, torch.Tensor] = {}

    def step(s: Strategy) -> None:
        with s:
            last_loss[s.name] = s.train_step(opt, x, y)

    variants = {n: (lambda s=s: step(s)) for n, s in strategies.items()}
    around = {n: s.prepared for n, s in strategies.items()}
    if cfg.graphs:  # each strategy's step captured once; the timed steps replay it
        graphs = {n: captured_step(s, opt, x, y, last_loss) for n, s in strategies.items()}
        variants, around = {n: g.replay for n, g in graphs.items()}, {}

    # The harness collects garbage before every step; with transformers and torch's compiler stack imported a
    # full collection takes a few hundred ms. Freezing what exists now leaves only the steps' own garbage to it.
    gc.collect()
    gc.freeze()
    try:
        results = run_interleaved(variants, device, rounds=cfg.rounds, warmup=cfg.warmup, progress=progress,
                                  around=around)
    finally:
        gc.unfreeze()
    gc.collect()
    resident = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    base, pnone = results["none"], probes["none"]
    runs = []
    for n in cfg.strategies:
        r, p = results[n], probes[n]
        head = p["head_bytes"]
        rest_none, rest = pnone["bytes_saved"] - pnone["head_bytes"], p["bytes_saved"] - head
        runs.append({
            "strategy": n, **{k: v for k, v in p.items() if k != "by_rule"},
            "x_smaller": pnone["bytes_saved"] / p["bytes_saved"] if p["bytes_saved"] else None,
            "x_smaller_without_head": rest_none / rest if rest > 0 else None,
            **r.summary(),
            "time_vs_none": r.median_ms / base.median_ms,
            "peak_vs_none": r.peak_bytes / base.peak_bytes if r.peak_bytes and base.peak_bytes else None,
            **({"peak_bytes": None, "peak_vs_none": None} if cfg.graphs else {}),  # the graphs' pools, not steps
            "last_loss": float(last_loss[n]),
            "by_rule": p["by_rule"],
        })
    record = {"model": name, **model.describe, "params": n_params, "vocab_size": model.vocab_size,
              "seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "tokens_per_step": tokens,
              "resident_bytes": resident, "runs": runs}
    if cfg.graphs:
        record["replays_consistent"] = replays_consistent(name, runs)
    return record


REPLAY_LOSS_SPREAD = 0.25  # how far a graphed strategy's last loss may be from none's (they train one model)


def replays_consistent(model: str, runs: list[dict]) -> bool:
    """Whether every graphed strategy's replays ended near the plain step's loss: the strategies' graphs take
    turns training the same weights on the same batch, so their last losses differ by their compression's
    error only. A loss far off (or not finite) means a graph does not compute what its eager step does; its
    timing then says nothing, and the record says so (warned, and ``replays_consistent`` false)."""
    base = next(r["last_loss"] for r in runs if r["strategy"] == "none")
    off = [f"{r['strategy']} {r['last_loss']:.4g}" for r in runs
           if not (math.isfinite(r["last_loss"]) and abs(r["last_loss"] / base - 1) <= REPLAY_LOSS_SPREAD)]
    if off:
        warnings.warn(f"cache bench: {model}: the replayed steps of {', '.join(off)} ended far from none's loss "
                      f"{base:.4g}; their graphs do not compute what the eager steps do, so their timings are "
                      "not comparable (the record's replays_consistent is false)", RuntimeWarning, stacklevel=2)
    return not off


def run_cache(cfg: CacheBenchConfig, device: torch.device, progress=None) -> dict:
    """Every model of ``cfg`` under every strategy; see the module docstring for what is measured."""
    from actzip_bench.harness import machine_record
    from actzip_bench.data import Corpus
    from actzip.kernels import runtime

    # deterministic cuBLAS for the probe steps needs this before the first cuBLAS call (ignored on the CPU)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    corpus = Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
    before = runtime.fallback_counts()
    models = []
    for m in cfg.models:
        models.append(run_model(m, cfg, device, corpus, progress=progress))
        gc.collect()  # the model, its optimizer and caches are gone: give their memory back before the next
        if device.type == "cuda":
            torch.cuda.empty_cache()
    after = runtime.fallback_counts()
    fallbacks = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    record = {"config": asdict(cfg), "strategies": {s: DESCRIPTIONS[s] for s in cfg.strategies}, "models": models,
              "kernel_fallbacks": fallbacks, "machine": machine_record(device)}
    record["targets"] = [{**t, "line": format_target(t)} for t in evaluate_targets(record)]
    return record

