"""``compress_(model, SparseMLPConfig())``: swap ReLU / ReLU² MLPs for the fused ones of :mod:`.relu_mlp`.

Which modules are MLPs: a class says so with ``actzip_mlp_layout``, the names of its attributes, in order:

- ``(up, act, down)``: its forward is exactly ``down(act(up(x)))``, then its ``dropout`` module if it has one
  (as GPT-2 does);
- ``(gate, up, act, down)``: its forward is exactly ``down(act(gate(x)) * up(x))`` (Llama-style).

The activation must be relu or relu²: an ``nn.ReLU``, ``F.relu`` / ``torch.relu``, transformers'
``ReLUSquaredActivation``, or whatever the module names in ``actzip_mlp_activation`` (``"relu"`` or
``"relu2"``; any other value marks a module that is not swappable). transformers' GPT-2, Nemotron-H and
Llama / Mistral / Qwen2 / Qwen3 MLPs are known without a declaration; ``trust_structure=True`` also takes any
other class whose attributes match one of these layouts.

The arena (:mod:`.arena`): ``arena="auto"`` gives all MLPs swapped on one device one shared
:class:`~actzip.memory.modules.arena.Arena` that resets and sizes itself (``auto_reset``), so training code
changes nothing; :func:`arena_of` returns it, with the adaptive margin (a quarter more than the largest
step's payloads at first, at most a twentieth more once the sizes have settled). It is the default, since it
needs no host synchronization per payload. Its costs: it keeps its buffer allocated between steps, which
``arena=None`` (one host synchronization per payload) gives back after each backward; and its first step,
and any step after the payloads outgrew it, recomputes the MLPs' up projections (exact, and counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.api import CompressReport, Config, FilterFn, add_undo, register_handler, replace_module, walk
from actzip.core import registry
from actzip.errors import ConfigError, NothingToCompressError
from actzip.kernels import runtime
from actzip.memory.modules.arena import Arena
from actzip.memory.modules.norm_rebuild_config import hook_norms
from actzip.memory.modules.relu_mlp import SparseGatedReLUMLP, SparseReLUMLP

__all__ = ["LAYOUT_ATTR", "ACTIVATION_ATTR", "SparseMLPConfig", "arena_of", "arena_refusal", "mlp_layout",
           "swap_sparse_mlps"]

LAYOUT_ATTR = "actzip_mlp_layout"  # what an MLP class declares: (up, act, down) or (gate, up, act, down)
ACTIVATION_ATTR = "actzip_mlp_activation"  # optional: "relu" or "relu2" when the activation object does not say

# transformers' MLP classes, whose forwards are known to follow their layout (matched by class name only in
# modules of the transformers package).
_HF_PLAIN = {"GPT2MLP": ("c_fc", "act", "c_proj"), "NemotronHMLP": ("up_proj", "act_fn", "down_proj")}
_GATED_NAMES = ("gate_proj", "up_proj", "act_fn", "down_proj")
_HF_GATED = {n: _GATED_NAMES for n in ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")}
_STRUCTURES = (("c_fc", "act", "c_proj"), ("up_proj", "act_fn", "down_proj"), _GATED_NAMES)
_ACTIVATIONS = ("relu", "relu2")


@dataclass
class SparseMLPConfig(Config):
    """Swap ReLU / ReLU² MLPs for fused ones that keep only the lossless sparse payload of ReLU's output.

    Gradients stay bit-identical. See the module docstring for which modules are MLPs and for the arena.
    """

    codec_options: dict = field(default_factory=dict)  # options of the "sparse" codec (sign_pack, tile_size, ...)
    trust_structure: bool = False  # also swap undeclared classes whose attributes match a known MLP layout
    # "auto": one self-resetting Arena per device, shared by the swapped MLPs (see arena_of), where the Triton
    # kernels run and the codec options allow one, else payloads sized on the host (the report says why);
    # None: each payload sized on the host; an Arena: that one, which the caller resets unless it has auto_reset
    arena: Arena | str | None = "auto"
    # what NormRebuildConfig does, with the MLPs: the outputs of the model's norms (nn.LayerNorm, nn.RMSNorm,
    # transformers *RMSNorm/*LayerNorm) rebuilt in backward from the norm's input by the fused MLPs and every
    # nn.Linear / Conv1D fed one (attention projections, ...) instead of kept, transformers' RMSNorms swapped for
    # ExactRMSNorm where their form is recognized (exact; see actzip.memory.modules.norm_rebuild_config)
    rebuild_norms: bool = True
    # with rebuild_norms: a transformers Mamba mixer's in-projection output, which its fused scan keeps whole, is
    # rebuilt in backward by the same matmul on the rebuilt norm output instead of kept (exact; one in-projection
    # more per mixer in backward)
    rebuild_mamba_projections: bool = True

    def validate(self) -> None:
        if not isinstance(self.codec_options, dict):
            raise ConfigError(f"SparseMLPConfig.codec_options must be a dict of sparse codec options, got "
                              f"{self.codec_options!r}")
        codec = registry.get("sparse", **self.codec_options)  # unknown options fail here, listing the valid ones
        for name in ("rebuild_norms", "rebuild_mamba_projections"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"SparseMLPConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.trust_structure, bool):
            raise ConfigError(f"SparseMLPConfig.trust_structure must be True or False, got {self.trust_structure!r}")
        if self.arena is None:
            return
        if not (self.arena == "auto" or isinstance(self.arena, Arena)):
            raise ConfigError(f"SparseMLPConfig.arena must be None, 'auto' or an Arena, got {self.arena!r}")
        if self.arena == "auto":
            return  # arena_refusal says, at compress_, why a device gets none
        if codec.kernel == "torch":
            raise ConfigError("SparseMLPConfig.arena needs the sparse codec's Triton kernels: codec_options "
                              "kernel='torch' cannot write into an arena (use 'auto' or 'triton')")
        if codec.sign_pack and codec.check_values:
            raise ConfigError("SparseMLPConfig.arena with sign_pack=True needs codec_options check=False (checking "
                              "would synchronize; ReLU outputs have no negative values)")


def mlp_layout(module: nn.Module, trust_structure: bool = False) -> tuple[str, ...] | None:
    """The attribute names ``(up, act, down)`` or ``(gate, up, act, down)`` of an MLP module, else None."""
    declared = getattr(module, LAYOUT_ATTR, None)
    if declared is not None:
        if not (isinstance(declared, tuple) and len(declared) in (3, 4) and all(isinstance(n, str) for n in declared)):
            raise ConfigError(f"{type(module).__name__}.{LAYOUT_ATTR} must be a tuple of 3 or 4 attribute names, "
                              f"got {declared!r}")
        return declared
    cls = type(module)
    if cls.__module__.startswith("transformers."):
        found = _HF_GATED.get(cls.__name__) or _HF_PLAIN.get(cls.__name__)
        if found is not None:
            return found
    if trust_structure:
        for names in _STRUCTURES[::-1]:  # the gated layout first: it contains a plain one's names
            if all(hasattr(module, n) for n in names):
                return names
    return None


def _activation_kind(module: nn.Module, act) -> str | None:
    """'relu', 'relu2' or None."""
    declared = getattr(module, ACTIVATION_ATTR, None)
    if declared is not None:
        return declared if declared in _ACTIVATIONS else None
    if isinstance(act, nn.ReLU) or act in (F.relu, torch.relu):
        return "relu"
    if type(act).__name__ == "ReLUSquaredActivation":
        return "relu2"
    return None


def _device_of(module: nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def arena_refusal(codec) -> str | None:
    """Why the sparse codec ``codec`` cannot write into an arena, or None."""
    if codec.kernel == "torch":
        return "codec_options kernel='torch' cannot write into an arena"
    if codec.sign_pack and codec.check_values:
        return "sign_pack=True checks its values, a host synchronization (codec_options check=False avoids it)"
    return None


def _arena_for(device: torch.device, arenas: dict, report: CompressReport, codec) -> Arena | None:
    """The shared self-resetting arena of ``device`` (made on first use), or None where the kernels cannot run
    or the codec cannot use one."""
    if device not in arenas:
        why = arena_refusal(codec) or runtime.unavailable_reason(device)
        if why is not None:
            report.notes.append(f"arena='auto': none on {device} ({why}); its MLPs size each payload on the host, "
                                "one host synchronization per payload")
            arenas[device] = None
        else:
            arenas[device] = Arena(device=device, auto_reset=True, margin="adaptive")
            report.notes.append(f"arena='auto': one self-resetting Arena on {device}, shared by its MLPs "
                                "(actzip.memory.modules.arena_of(model))")
    return arenas[device]


def _arenas_in(model: nn.Module) -> list[Arena]:
    found = []
    for m in model.modules():
        a = getattr(m, "arena", None) if isinstance(m, (SparseReLUMLP, SparseGatedReLUMLP)) else None
        if a is not None and all(a is not b for b in found):
            found.append(a)
    return found


def arena_of(model: nn.Module, device: str | torch.device | None = None) -> Arena:
    """The arena the fused MLPs of ``model`` share (on ``device``, when they use arenas on several devices)."""
    arenas = _arenas_in(model)
    if device is not None:
        arenas = [a for a in arenas if a.device == torch.device(device)]
    if not arenas:
        where = f" on {device}" if device is not None else ""
        raise ConfigError(f"arena_of: no fused MLP of {type(model).__name__} uses an arena{where} "
                          "(compress_ with SparseMLPConfig(arena='auto') makes one)")
    if len(arenas) > 1:
        raise ConfigError(f"arena_of: {type(model).__name__}'s fused MLPs use {len(arenas)} arenas "
                          f"({', '.join(str(a.device) for a in arenas)}); pass device= to pick one")
    return arenas[0]


@register_handler(SparseMLPConfig)
def swap_sparse_mlps(model: nn.Module, config: SparseMLPConfig, filter_fn: FilterFn | None,
                     report: CompressReport) -> None:
    """The ``compress_`` handler of :class:`SparseMLPConfig`."""
    codec = registry.get("sparse", **config.codec_options)

    def candidate(module: nn.Module, fqn: str):
        if isinstance(module, (SparseReLUMLP, SparseGatedReLUMLP)):
            return "already swapped"
        names = mlp_layout(module, config.trust_structure)
        if names is None:
            return False
        missing = [n for n in names if not hasattr(module, n)]
        if missing:
            return f"declared layout names missing attribute(s) {', '.join(missing)}"
        act = getattr(module, names[-2])
        if _activation_kind(module, act) is None:
            return f"activation {type(act).__name__} is not relu or relu2"
        return True

    targets = list(walk(model, candidate, filter_fn, report))
    if not targets and not report.skipped:
        raise NothingToCompressError(
            f"compress_(SparseMLPConfig): nothing to swap in {type(model).__name__}: no module declares "
            f"{LAYOUT_ATTR} or is a known transformers MLP (GPT2MLP, NemotronHMLP, Llama/Mistral/Qwen MLPs); pass "
            "trust_structure=True for classes with c_fc/act/c_proj, up_proj/act_fn/down_proj or "
            "gate_proj/up_proj/act_fn/down_proj attributes"
        )
    existing = {a.device: a for a in _arenas_in(model) if a.auto_reset}
    for fqn, module in targets:
        names = mlp_layout(module, config.trust_structure)
        kind = _activation_kind(module, getattr(module, names[-2]))
        arena = config.arena
        if arena == "auto":
            arena = _arena_for(_device_of(module), existing, report, codec)
        square = kind == "relu2"
        if len(names) == 4:
            gate, up, _, down = (getattr(module, n) for n in names)
            new = SparseGatedReLUMLP(gate, up, down, square=square, codec=codec, names=(names[0], names[1], names[3]),
                                     arena=arena)
        else:
            up, _, down = (getattr(module, n) for n in names)
            dropout = getattr(module, "dropout", None)
            new = SparseReLUMLP(up, down, square=square, codec=codec, names=(names[0], names[2]), arena=arena,
                                dropout=dropout if isinstance(dropout, nn.Module) else None)
        replace_module(model, fqn, new, report, f"{type(new).__name__}({kind})")
    if config.rebuild_norms and targets:
        hook_norms(model, report, config.rebuild_mamba_projections)
