"""Nemotron-H-style hybrid memory benchmark: per-token peak memory and step time per strategy.

The model is transformers' ``NemotronHForCausalLM`` built from a local ``NemotronHConfig`` (no weights are
downloaded): Mamba-2 mixers, grouped-query attention and ReLU² MLP layers in Nemotron-H's order (``M`` Mamba,
``*`` attention, ``-`` MLP; the small preset keeps the 8B model's mix of about one attention per four Mamba
layers and one MLP after each mixer), bf16 weights, AdamW. The loss is computed ``loss_chunk`` tokens at a
time, each chunk's logits recomputed in backward, so the float32 logits do not hide the activations. Strategies
share one set of weights and one optimizer and are interleaved step by step:

- ``none``: plain PyTorch;
- ``checkpoint``: transformers' gradient checkpointing of every layer (non-reentrant);
- ``compress``: ``actzip.compress_(model, SparseMLPConfig())`` and nothing else;
- ``compress-signpack``: the same with ``codec_options`` sign packing (``check=False``).

With the ``mamba_ssm`` and ``causal_conv1d`` packages installed, transformers runs their fused Mamba-2 kernels
(what a Nemotron-H user trains on); without them, its PyTorch reference of the mixer, which keeps far more for
backward and whose scan's temporaries set the peak. The record says which path ran (``mamba_path``) and how the
bytes autograd keeps split by layer kind (``saved_by_kind``: a storage counted once, for the first layer that
saved it, so an arena shared by every MLP is all counted at the first).
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from actzip.errors import ConfigError, MissingDependencyError
from actzip_bench.model_rows import enable_hf_checkpointing, random_tokens, strategy_rows
from actzip_bench.one_liner import compressed_copies, max_grad_diffs, shared_copy

HYBRID_STRATEGIES = ("none", "checkpoint", "compress", "compress-signpack")

# NemotronHConfig fields per preset (the rest are transformers' defaults).
HYBRID_PRESETS = {
    "nemotron-h-tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=336, hybrid_override_pattern="M-*-",
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=8,
                            mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=16),
    # d=1024, MLP 5.25·d (as the 8B model), 8 Mamba (32 heads × 64), 2 attention (8 heads, 2 KV), 8 MLP layers
    "nemotron-h-small": dict(vocab_size=32768, hidden_size=1024, intermediate_size=5376,
                             hybrid_override_pattern="M-M-M-M*-M-M-M-M*-", num_attention_heads=8,
                             num_key_value_heads=2, head_dim=128, mamba_num_heads=32, mamba_head_dim=64,
                             ssm_state_size=128, n_groups=8, chunk_size=128),
}
KINDS = {"M": "mamba", "*": "attention", "-": "mlp"}


def build_hybrid(preset: str, seq_len: int):
    """A freshly initialized ``NemotronHForCausalLM`` of ``preset`` (seeded by the caller)."""
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - transformers is a bench dependency
        raise MissingDependencyError("the nemotron-h bench needs transformers (pip install transformers)") from e
    fields = dict(HYBRID_PRESETS[preset])
    pattern = fields["hybrid_override_pattern"]
    cfg = transformers.NemotronHConfig(**fields, num_hidden_layers=len(pattern), max_position_embeddings=seq_len,
                                       mlp_hidden_act="relu2", use_cache=False)
    model = transformers.NemotronHForCausalLM(cfg)
    if len(model.model.layers) != len(pattern):
        raise ConfigError(f"nemotron-h bench: transformers {transformers.__version__} built "
                          f"{len(model.model.layers)} layers from the pattern {pattern!r} ({len(pattern)} expected)")
    return model


def mamba_path() -> str:
    """Which Mamba implementation transformers runs here."""
    kernels = [m for m in ("mamba_ssm", "causal_conv1d") if importlib.util.find_spec(m) is not None]
    if len(kernels) == 2:
        return "mamba_ssm and causal_conv1d kernels"
    return f"transformers' PyTorch reference (not installed: {', '.join(sorted({'mamba_ssm', 'causal_conv1d'} - set(kernels)))})"


def chunked_loss(model, x: torch.Tensor, y: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean next-token cross-entropy, the head and loss ``chunk`` tokens at a time (logits recomputed)."""
    h = model.model(input_ids=x, use_cache=False).last_hidden_state
    h, y = h.reshape(-1, h.size(-1)), y.reshape(-1)

    def loss_sum(hc, yc):
        return F.cross_entropy(model.lm_head(hc).float(), yc, reduction="sum")

    step = chunk or h.size(0)
    total = h.new_zeros((), dtype=torch.float32)
    for i in range(0, h.size(0), step):
        total = total + checkpoint(loss_sum, h[i:i + step], y[i:i + step], use_reentrant=False)
    return total / y.numel()


def saved_by_kind(model, x: torch.Tensor, y: torch.Tensor, chunk: int, pattern: str) -> dict[str, float]:
    """Bytes per token autograd keeps after one forward, by the kind of layer that saved them (a storage counted
    once, for the first layer that saved it; parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    where = ["other"]
    seen: dict[int, tuple[str, int]] = {}
    hooks = []
    for kind, layer in zip(pattern, model.model.layers):
        hooks.append(layer.register_forward_pre_hook(lambda m, a, k=KINDS[kind]: where.__setitem__(0, k)))
        hooks.append(layer.register_forward_hook(lambda m, a, o: where.__setitem__(0, "other")))

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params and key not in seen:
            seen[key] = (where[0], t.untyped_storage().nbytes())
        return t.detach()  # t itself would tie an output to its own node: a cycle that keeps the graph alive

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = chunked_loss(model, x, y, chunk)
    finally:
        for h in hooks:
            h.remove()
    del loss
    out = {k: 0.0 for k in (*KINDS.values(), "other")}
    for kind, nbytes in seen.values():
        out[kind] += nbytes / x.numel()
    return out


def run_hybrid(cfg, device: torch.device, progress=None) -> dict:
    """The GPT bench's measurement (``actzip_bench.gpt_memory.GPTBenchConfig`` with ``model="nemotron-h"``)."""
    from actzip.memory.modules.arena import PENDING_STEPS, SETTLE_STEPS
    from actzip_bench.harness import machine_record, run_interleaved

    pattern = HYBRID_PRESETS[cfg.preset]["hybrid_override_pattern"]
    runs, breakdown = [], []
    for seq in cfg.seq_lens:
        torch.manual_seed(0)
        model = build_hybrid(cfg.preset, seq).to(device=device, dtype=getattr(torch, cfg.dtype)).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        models, arenas = {"none": model}, {}
        if "checkpoint" in cfg.strategies:
            models["checkpoint"] = shared_copy(model)
            enable_hf_checkpointing(models["checkpoint"])
        models.update(compressed_copies(model, cfg.strategies, cfg.kernel, arenas))
        batch = cfg.tokens_per_step // seq
        x, y = random_tokens(model.config.vocab_size, batch, seq, device)

        def backward(strategy: str) -> None:
            chunked_loss(models[strategy], x, y, cfg.loss_chunk).backward()

        def step(strategy: str) -> None:
            opt.zero_grad(set_to_none=True)
            backward(strategy)
            opt.step()
            opt.zero_grad(set_to_none=True)

        for s in arenas:  # the self-resetting arena settles after a few fitting steps
            for _ in range(SETTLE_STEPS + PENDING_STEPS + 2):
                step(s)
        grad_diff = max_grad_diffs({s: (lambda s=s: backward(s)) for s in cfg.strategies}, list(model.parameters()))
        for s in ("none", "compress"):
            if s in models:
                breakdown.append({"seq_len": seq, "strategy": s,
                                  "saved_bytes_per_token": saved_by_kind(models[s], x, y, cfg.loss_chunk, pattern)})
        refused = {s: a.overflows() for s, a in arenas.items()}
        held = {s: (lambda a=a: a.capacity_bytes) for s, a in arenas.items()}
        results = run_interleaved({s: (lambda s=s: step(s)) for s in cfg.strategies}, device, rounds=cfg.rounds,
                                  warmup=cfg.warmup, progress=progress, held=held)
        refused = {s: a.overflows() - refused[s] for s, a in arenas.items()}
        runs += strategy_rows(results, seq, batch, cfg.tokens_per_step, refused, grad_diff)
        n_params = sum(p.numel() for p in model.parameters())
        del model, opt, models, arenas
    return {"config": asdict(cfg), "runs": runs, "skipped": {}, "machine": machine_record(device),
            "model": {"pattern": pattern, "params": n_params, "mamba_path": mamba_path(), **HYBRID_PRESETS[cfg.preset]},
            "saved_by_kind": breakdown}
