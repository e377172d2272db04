"""Finding a causal LM's decoder blocks, its width and its logits, by structure alone.

HuggingFace Llama / Qwen2 and their kin keep their blocks in ``model.model.layers``, GPT-2 in
``model.transformer.h``, nanoGPT-style models (actzip_bench's reference GPT among them) in ``model.h`` beside
``model.wte``; anything else falls back to its longest ``nn.ModuleList`` of modules of one class. Nothing here
imports a model library: the library must work with models it has never heard of.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from actzip.errors import ConfigError

__all__ = ["accepts", "check_layer", "decoder_blocks", "embedding", "forward_logits", "hidden_size"]

# Attribute paths of the block list in the model families known by name, tried in this order.
KNOWN_PATHS = (("model", "layers"), ("layers",), ("transformer", "h"), ("h",))


def _at(model: nn.Module, path: tuple[str, ...]):
    obj = model
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _uniform(blocks: nn.ModuleList) -> bool:
    return len(blocks) > 0 and len({type(b) for b in blocks}) == 1


def decoder_blocks(model: nn.Module) -> nn.ModuleList:
    """The model's decoder blocks in order: a known path first, else the longest list of same-class modules."""
    for path in KNOWN_PATHS:
        blocks = _at(model, path)
        if isinstance(blocks, nn.ModuleList) and _uniform(blocks):
            return blocks
    best = None
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and _uniform(module) and (best is None or len(module) > len(best)):
            best = module
    if best is None:
        raise ConfigError(f"{type(model).__name__}: no decoder blocks found (looked for "
                          f"{', '.join('.'.join(p) for p in KNOWN_PATHS)} and any nn.ModuleList of modules of "
                          "one class)")
    return best


def check_layer(model: nn.Module, index: int, what: str, *, allow_output: bool) -> int:
    """``index`` as a residual-stream position of ``model``: 0 .. n_blocks - 1 (entering that block), and
    n_blocks (the last block's output) when ``allow_output``; else a ConfigError naming the model."""
    n = len(decoder_blocks(model))
    top = n if allow_output else n - 1
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= top:
        raise ConfigError(f"{what} {index!r} is out of range for {type(model).__name__}, which has {n} decoder "
                          f"blocks (valid: 0 .. {top})")
    return index


def embedding(model: nn.Module) -> nn.Embedding | None:
    """The token embedding: HuggingFace's ``get_input_embeddings()``, else ``model.wte``, else the first
    ``nn.Embedding`` among the model's modules (None if it has none)."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            found = get()
        except (NotImplementedError, AttributeError):
            found = None
        if isinstance(found, nn.Embedding):
            return found
    found = getattr(model, "wte", None)
    if isinstance(found, nn.Embedding):
        return found
    return next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)


def hidden_size(model: nn.Module) -> int:
    """Width of the residual stream: from the model's config, else its token embedding."""
    config = getattr(model, "config", None)
    for name in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    emb = embedding(model)
    if emb is not None:
        return emb.embedding_dim
    raise ConfigError(f"{type(model).__name__}: cannot tell the width of its residual stream (no config.hidden_size "
                      "/ n_embd / d_model and no token embedding found)")


def accepts(model: nn.Module, name: str) -> bool:
    """Whether ``model.forward`` names the keyword ``name`` (a ``**kwargs`` catch-all does not count)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    param = params.get(name)
    return param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)


def forward_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """``(batch, seq, vocab)`` logits of one full forward without a KV cache.

    ``attention_mask`` is passed only to a forward that takes it; a causal model without one reads right-padded
    batches correctly anyway (no real position sees a pad after it).
    """
    kwargs = {}
    if attention_mask is not None and accepts(model, "attention_mask"):
        kwargs["attention_mask"] = attention_mask
    if accepts(model, "use_cache"):
        kwargs["use_cache"] = False
    out = model(input_ids, **kwargs)
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        logits = out[0]
    if logits is None and isinstance(out, torch.Tensor):
        logits = out
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise ConfigError(f"{type(model).__name__}: its forward returned no (batch, seq, vocab) logits (got "
                          f"{type(out).__name__}); expected .logits, a tuple starting with logits, or a tensor")
    return logits
