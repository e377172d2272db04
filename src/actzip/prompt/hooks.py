"""Reading and writing a causal LM's residual stream at a block boundary, through forward hooks.

``capture(model, layers)`` keeps the hidden states entering the given blocks; ``inject(model, layer, vector,
slot=...)`` writes one vector at one sequence position of the stream entering a block. Both work on any model
:func:`~actzip.prompt.layers.decoder_blocks` finds, with the hidden states passed to a block positionally or as
``hidden_states=``, and blocks returning a tensor or a tuple.

Which position is the slot: a HuggingFace decoder layer is told the positions of the chunk it runs
(``position_ids``, or ``cache_position`` in older releases), so under ``generate`` with a KV cache the vector is
written during the prefill, where those positions include the slot, and never in the one-token decode steps
after it (left padding is fine: ``generate`` numbers each row's positions from its first real token). A block
told nothing (a model that re-runs the whole sequence every step) takes index ``slot`` of its chunk.

The new hidden states are built out of place (``torch.where``), so gradients reach the vector and nothing
autograd saved is overwritten.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from actzip.errors import ConfigError
from actzip.prompt.config import MODES
from actzip.prompt.layers import check_layer, decoder_blocks

__all__ = ["Capture", "capture", "inject", "inject_hook", "slot_mask"]

POSITION_KWARGS = ("position_ids", "cache_position")  # what tells a block its chunk's positions, first found wins


@dataclass
class Capture:
    """What :func:`capture` read in the latest forward."""

    layers: tuple[int, ...]  # the residual-stream indices asked for
    states: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (batch, seq, d) entering that block


def _hidden_of(block: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    hidden = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
        raise ConfigError(f"{type(block).__name__} was called without (batch, seq, d) hidden states as its first "
                          f"argument or hidden_states=; got {type(hidden).__name__}")
    return hidden


def _output_of(block: nn.Module, output) -> torch.Tensor:
    hidden = output[0] if isinstance(output, (tuple, list)) and output else output
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
        raise ConfigError(f"{type(block).__name__} returned {type(output).__name__}, not (batch, seq, d) hidden "
                          "states (alone or first in a tuple)")
    return hidden


@contextmanager
def capture(model: nn.Module, layers: Iterable[int]) -> Iterator[Capture]:
    """Inside the block, every forward of ``model`` leaves ``.states[layer]``: the residual stream entering block
    ``layer`` (``layer == n_blocks``: the last block's output, before any final norm). Tensors are kept as the
    model made them (with their graph when gradients are on)."""
    blocks = decoder_blocks(model)
    wanted = tuple(dict.fromkeys(check_layer(model, i, "capture: layer", allow_output=True) for i in layers))
    if not wanted:
        raise ConfigError("capture: layers is empty; name at least one residual-stream index")
    record = Capture(layers=wanted)
    handles: list[RemovableHandle] = []

    def before(layer: int):
        def hook(block, args, kwargs):
            record.states[layer] = _hidden_of(block, args, kwargs)

        return hook

    def after(block, args, output):
        record.states[len(blocks)] = _output_of(block, output)

    try:
        for layer in wanted:
            if layer == len(blocks):
                handles.append(blocks[-1].register_forward_hook(after))
            else:
                handles.append(blocks[layer].register_forward_pre_hook(before(layer), with_kwargs=True))
        yield record
    finally:
        for h in handles:
            h.remove()


def slot_mask(hidden: torch.Tensor, kwargs: dict, slot: int) -> torch.Tensor:
    """``(batch or 1, seq, 1)`` bool: where the chunk in ``hidden`` holds absolute position ``slot``."""
    positions = next((kwargs[k] for k in POSITION_KWARGS if isinstance(kwargs.get(k), torch.Tensor)), None)
    if positions is None:
        return (torch.arange(hidden.shape[1], device=hidden.device) == slot).view(1, -1, 1)
    positions = positions.to(hidden.device)
    while positions.dim() > 2:  # multi-axis position ids (text, height, width): the first axis counts tokens
        positions = positions[0]
    if positions.dim() == 1:
        positions = positions.unsqueeze(0)
    return (positions == slot).unsqueeze(-1)


def _checked_vector(vector: torch.Tensor) -> torch.Tensor:
    if not isinstance(vector, torch.Tensor) or vector.dim() not in (1, 2) or not vector.is_floating_point():
        raise ConfigError(f"inject: vector must be a floating-point (d,) or (batch, d) tensor, got "
                          f"{getattr(vector, 'shape', type(vector).__name__)}")
    return vector


def inject_hook(model: nn.Module, layer: int, vector: torch.Tensor, *, slot: int = 0, mode: str = "replace"
                ) -> RemovableHandle:
    """Install :func:`inject`'s write until the returned handle's ``remove()``."""
    blocks = decoder_blocks(model)
    check_layer(model, layer, "inject: layer", allow_output=False)
    vector = _checked_vector(vector)
    if mode not in MODES:
        raise ConfigError(f"inject: mode must be one of {list(MODES)}, got {mode!r}")
    if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
        raise ConfigError(f"inject: slot must be a sequence position >= 0, got {slot!r}")

    def hook(block, args, kwargs):
        hidden = _hidden_of(block, args, kwargs)
        batch, _, width = hidden.shape
        if vector.shape[-1] != width or (vector.dim() == 2 and vector.shape[0] not in (1, batch)):
            raise ConfigError(f"inject: vector of shape {tuple(vector.shape)} does not fit the hidden states "
                              f"{tuple(hidden.shape)} entering block {layer} of {type(model).__name__}")
        v = vector.to(device=hidden.device, dtype=hidden.dtype).view(-1, 1, width)
        mask = slot_mask(hidden, kwargs, slot)
        new = torch.where(mask, v if mode == "replace" else hidden + v, hidden)
        if args:
            return (new, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": new}

    return blocks[layer].register_forward_pre_hook(hook, with_kwargs=True)


@contextmanager
def inject(model: nn.Module, layer: int, vector: torch.Tensor, *, slot: int = 0, mode: str = "replace"
           ) -> Iterator[None]:
    """Inside the block, ``vector`` ((d,), or (batch, d): one per row) is written at absolute sequence position
    ``slot`` of the residual stream entering block ``layer`` of ``model``: it replaces the state there
    (``mode="replace"``) or is added to it (``"add"``). See the module docstring for how the slot is found."""
    handle = inject_hook(model, layer, vector, slot=slot, mode=mode)
    try:
        yield
    finally:
        handle.remove()
