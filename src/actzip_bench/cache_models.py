"""The activation-cache benchmark's models: the reference GPT and a HuggingFace Llama, with one loss and optimizer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from actzip.errors import ConfigError
from actzip_bench.cache_config import LLAMA_VOCAB, CacheBenchConfig


@dataclass
class BenchModel:
    """One benchmarked model and what the strategies need to drive it."""

    name: str  # one of MODELS
    module: nn.Module
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, y) -> scalar loss
    set_checkpoint: Callable[[bool], None]  # switches block recomputation in backward on or off
    vocab_size: int
    describe: dict  # what the record says about the model (family, sizes, activation)


def _gpt(name: str, cfg: CacheBenchConfig) -> BenchModel:
    from actzip_bench.models import GPT, GPTConfig

    over = {"vocab_size": cfg.vocab_size} if cfg.vocab_size else {}
    gc_ = GPTConfig.of_size(cfg.gpt_preset, activation=name.split("-", 1)[1], block_size=cfg.seq_len,
                           loss_chunk=cfg.loss_chunk, **over)
    model = GPT(gc_)

    def set_checkpoint(on: bool) -> None:
        model.config.checkpoint_blocks = on

    info = {"family": "reference GPT", "preset": cfg.gpt_preset, "activation": gc_.activation, "n_layer": gc_.n_layer,
            "n_embd": gc_.n_embd, "n_head": gc_.n_head, "mlp_hidden": gc_.mlp_ratio * gc_.n_embd}
    return BenchModel(name, model, lambda x, y: model(x, y)[1], set_checkpoint, gc_.vocab_size, info)


def _llama(cfg: CacheBenchConfig) -> BenchModel:
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        raise ConfigError(f"cache bench: the llama-swiglu model needs transformers ({e})") from None
    from actzip_bench.models import GPTConfig

    g = GPTConfig.of_size(cfg.gpt_preset)
    ffn = 32 * math.ceil(cfg.llama_ffn_ratio * g.n_embd / 32)
    kv = cfg.llama_kv_heads or g.n_head
    if g.n_head % kv:
        raise ConfigError(f"cache bench: llama_kv_heads {kv} must divide the {g.n_head} query heads")
    config = LlamaConfig(vocab_size=cfg.vocab_size or LLAMA_VOCAB, hidden_size=g.n_embd, intermediate_size=ffn,
                         num_hidden_layers=g.n_layer, num_attention_heads=g.n_head, num_key_value_heads=kv,
                         max_position_embeddings=cfg.seq_len, hidden_act="silu", tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    model.train()
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": False})  # installs the checkpoint function; the flags below switch it per step
    flags = [m for m in model.modules() if isinstance(getattr(m, "gradient_checkpointing", None), bool)]

    def set_checkpoint(on: bool) -> None:
        for m in flags:
            m.gradient_checkpointing = on

    set_checkpoint(False)
    info = {"family": "HF LlamaForCausalLM", "n_layer": g.n_layer, "n_embd": g.n_embd, "n_head": g.n_head,
            "n_kv_head": kv, "mlp_hidden": ffn, "activation": "silu (SwiGLU)", "attention": "sdpa"}

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = model.model(input_ids=x, use_cache=False).last_hidden_state
        return head_loss(model.lm_head, h, y, cfg.loss_chunk)

    return BenchModel("llama-swiglu", model, loss, set_checkpoint, config.vocab_size, info)


def _loss_sum(head: nn.Module, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(h).float(), y, reduction="sum")  # float32 log-softmax, as the GPT's head


def head_loss(head: nn.Module, h: torch.Tensor, y: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean cross entropy of ``head(h)`` against ``y``, as the reference GPT computes it (``loss_chunk``)."""
    h, y = h.reshape(-1, h.size(-1)), y.reshape(-1)
    if not chunk:
        return _loss_sum(head, h, y) / y.numel()
    total = h.new_zeros((), dtype=torch.float32)
    for i in range(0, h.size(0), chunk):
        total = total + checkpoint(_loss_sum, head, h[i:i + chunk], y[i:i + chunk], use_reentrant=False)
    return total / y.numel()


def build_model(name: str, cfg: CacheBenchConfig, device: torch.device) -> BenchModel:
    torch.manual_seed(cfg.seed)
    m = _llama(cfg) if name == "llama-swiglu" else _gpt(name, cfg)
    m.module.to(device=device, dtype=getattr(torch, cfg.dtype))
    return m


def adamw(model: nn.Module, lr: float, capturable: bool = False) -> torch.optim.AdamW:
    """AdamW, weight decay on matrices and embeddings only (as the reference GPT's optimizer); ``capturable``:
    its step counts on the device, so that a CUDA graph can capture its step."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=all(p.is_cuda for p in params),
                             capturable=capturable)

