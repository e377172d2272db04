"""Spectral correction: denoise the fast circuit's masked gradients with the subspace of the anchor gradients.

The fast circuit trains on gradients through masked (sparsified) activations: unbiased but noisy. Every so
often an anchor circuit runs an unmasked forward and backward off the critical path, and its gradients arrive
late. They are few and stale, but they show where the true gradient of each weight matrix lives: its top
singular directions. :class:`SpectralCorrection` keeps, per weight matrix, an exponential average ``A`` of the
anchor gradients it has been given (:meth:`~SpectralCorrection.observe_anchor`) and the top-``rank`` left and
right singular vectors ``U``, ``V`` of ``A``; before each step of the wrapped optimizer it corrects every
matrix's gradient ``g``:

- ``mode="off"``: ``g`` as it is (the ablation's baseline);
- ``mode="projection"``: ``P(g) = U Uᵀ g V Vᵀ``, the part of ``g`` in the anchors' subspace;
- ``mode="shrinkage"``: ``P(g) + shrink * (g - P(g))``: the part outside is kept, scaled down;
- ``mode="wiener"``: ``s_in P(g) + s_out (g - P(g))`` with each factor ``S / (S + N)`` measured per matrix: on
  every anchor's step the fast circuit's own gradient of that batch is kept (:meth:`stash_fast`), and when the
  anchor arrives their difference is the masking's noise on that batch. ``S`` is the anchors' gradient energy
  inside (or outside) the subspace, ``N`` the noise's, both averaged over the anchors like ``A``. A matrix whose
  gradient the masks do not touch (``N = 0``: a last stage under a gradient-only mask) is left as it is, and
  the more of a part is noise, the more it is shrunk. Until a matrix has a measured pair it passes unchanged;
- ``mode="debias"``: ``g + B`` for every parameter, ``B`` the average of ``anchor - fast`` over the measured
  pairs (kept as ``wiener`` keeps them), of a matrix only its top-``rank`` part. A forward mask makes the fast
  circuit descend another function, the masked one; its gradient differs from the model's own by a bias that
  moves with the weights. The latest pair tracks it best (``decay`` 0, this mode's default); a decay averages
  the masks' zero-mean noise out of ``B`` at the cost of lagging. Until a parameter has a measured pair it
  passes unchanged.

Vectors (biases, norms) and matrices without an anchor yet pass unchanged; a step with no anchor at all is
counted (``uncorrected_steps``) and said once, and the fast circuit never waits for one. State per corrected
``out x in`` matrix: ``A`` (``out * in`` float32) plus ``U`` and ``V`` (``rank * (out + in)`` float32); the
``wiener`` mode adds four numbers per matrix and, while an anchor is in flight, the fast gradient of its step
(``out * in`` float32 per matrix and anchor); ``debias`` the same kept fast gradients, the difference's average
and its top-``rank`` part (``2 * out * in`` float32).
"""

import warnings
from dataclasses import dataclass

import torch

from actzip.errors import ConfigError

__all__ = ["SPECTRAL_MODES", "SpectralConfig", "SpectralCorrection"]

SPECTRAL_MODES = ("off", "projection", "shrinkage", "wiener", "debias")


@dataclass
class SpectralConfig:
    """How the masked gradients are corrected with the anchors' subspace."""

    mode: str = "projection"  # one of SPECTRAL_MODES
    rank: int = 4  # singular directions kept per weight matrix
    shrink: float = 0.3  # shrinkage: the factor on the part of the gradient outside the subspace
    # weight of the old average when an anchor gradient arrives (0: the latest alone); None: 0.9 for the
    # subspace modes' averages, 0 for debias (its bias moves with the weights: docs/wire.md's decay ablation)
    decay: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in SPECTRAL_MODES:
            raise ConfigError(f"SpectralConfig.mode must be one of {list(SPECTRAL_MODES)}, got {self.mode!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"SpectralConfig.rank must be an int >= 1, got {self.rank!r}")
        if self.decay is None:
            self.decay = 0.0 if self.mode == "debias" else 0.9
        for name in ("shrink", "decay"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ConfigError(f"SpectralConfig.{name} must be in [0, 1], got {v!r}")


class SpectralCorrection:
    """Wraps ``optimizer``: :meth:`step` corrects the gradients of its 2-D parameters, then steps it."""

    def __init__(self, optimizer: torch.optim.Optimizer, config: SpectralConfig) -> None:
        self.optimizer, self.config = optimizer, config
        self.matrices = [p for g in optimizer.param_groups for p in g["params"] if p.dim() == 2]
        # debias corrects every parameter (a norm's gain shifts under a mask as much as a matrix); the others
        # only matrices, whose subspaces they use
        self.corrected = ([p for g in optimizer.param_groups for p in g["params"]] if config.mode == "debias"
                          else self.matrices)
        self.average: dict[int, torch.Tensor] = {}  # id(param) -> A
        self.basis: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(param) -> (U, V)
        self.anchors = 0  # anchor gradients observed
        self.uncorrected_steps = 0  # steps taken before any anchor arrived (mode != "off")
        self.fast: dict[int, dict[int, torch.Tensor]] = {}  # wiener: anchor step -> id(param) -> fast gradient
        self.energy: dict[int, torch.Tensor] = {}  # wiener: id(param) -> [S_in, S_out, N_in, N_out] averages
        self.gap: dict[int, torch.Tensor] = {}  # debias: id(param) -> average of anchor - fast
        self.bias: dict[int, torch.Tensor] = {}  # debias: id(param) -> the average's top-rank part, B
        self.pairs: dict[int, int] = {}  # debias: id(param) -> measured pairs folded in

    def state_bytes(self) -> int:
        """Bytes of the correction's own state (averages, bases, the wiener mode's energies, debias's averages
        and corrections, and both modes' kept fast gradients)."""
        kept = [t for step in self.fast.values() for t in step.values()]
        kept += [*self.average.values(), *self.energy.values(), *self.gap.values(), *self.bias.values()]
        kept += [t for pair in self.basis.values() for t in pair]
        unique = {id(t): t for t in kept}  # a vector's correction is its average itself
        return sum(t.numel() * t.element_size() for t in unique.values())

    @torch.no_grad()
    def stash_fast(self, step: int) -> None:
        """``wiener`` and ``debias``: keep the fast circuit's gradient of every corrected parameter as it is now
        (call it after the backward of a step an anchor was launched at, before :meth:`correct`), to pair it with
        that anchor's gradient."""
        if self.config.mode not in ("wiener", "debias"):
            return
        self.fast[step] = {id(p): p.grad.detach().float().clone() for p in self.corrected if p.grad is not None}

    def _project(self, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        u, v = self.basis[id(p)]
        return u @ ((u.T @ g) @ v) @ v.T

    @torch.no_grad()
    def observe_anchor(self, grads: dict[torch.nn.Parameter, torch.Tensor] | None = None,
                       launched: int | None = None) -> None:
        """Take one anchor gradient per matrix (``grads``, default: each parameter's current ``.grad``), however
        late it is, into the averages, and recompute their top-``rank`` singular vectors. ``launched``: the fast
        step the anchor was taken at; ``wiener`` pairs it with that step's kept fast gradient."""
        self.anchors += 1
        fast = self.fast.pop(launched, None) if launched is not None else None
        for old in [s for s in self.fast if launched is not None and s < launched]:
            del self.fast[old]  # an anchor that never arrived: its pair is of no use
        d = self.config.decay
        for p in self.corrected:
            g = grads.get(p) if grads is not None else p.grad
            if g is None:
                continue
            if g.shape != p.shape:
                raise ConfigError(f"SpectralCorrection: an anchor gradient of shape {tuple(g.shape)} for a "
                                  f"parameter of shape {tuple(p.shape)}")
            g = g.detach().float()
            if self.config.mode == "debias":
                if fast is not None and id(p) in fast:
                    self._fold_gap(p, g - fast[id(p)].to(g.device))
                continue
            a = self.average.get(id(p))
            self.average[id(p)] = g.clone() if a is None else a.mul_(d).add_(g, alpha=1 - d)
            r = min(self.config.rank, *p.shape)
            u, _, vh = torch.linalg.svd(self.average[id(p)], full_matrices=False)
            self.basis[id(p)] = (u[:, :r].contiguous(), vh[:r].T.contiguous())
            if fast is not None and id(p) in fast:
                noise = fast[id(p)].to(g.device) - g
                s_in, n_in = self._project(p, g).square().sum(), self._project(p, noise).square().sum()
                now = torch.stack([s_in, g.square().sum() - s_in, n_in, noise.square().sum() - n_in]).clamp_min(0)
                e = self.energy.get(id(p))
                self.energy[id(p)] = now if e is None else e.mul_(d).add_(now, alpha=1 - d)

    def _fold_gap(self, p: torch.Tensor, gap: torch.Tensor) -> None:
        """``debias``: fold one measured ``anchor - fast`` into its average; ``B`` is the average's top-``rank``
        part for a matrix, the average itself for any other parameter."""
        n = self.pairs[id(p)] = self.pairs.get(id(p), 0) + 1
        weight = max(1 - self.config.decay, 1 / n)  # the plain mean of the first pairs, then the moving average
        old = self.gap.get(id(p))
        self.gap[id(p)] = gap if old is None else old.mul_(1 - weight).add_(gap, alpha=weight)
        if p.dim() != 2:
            self.bias[id(p)] = self.gap[id(p)]
            return
        r = min(self.config.rank, *p.shape)
        u, s, vh = torch.linalg.svd(self.gap[id(p)], full_matrices=False)
        self.bias[id(p)] = (u[:, :r] * s[:r]) @ vh[:r]

    @torch.no_grad()
    def correct(self) -> None:
        """Correct the 2-D parameters' ``.grad`` (``debias``: every parameter's) in place (what :meth:`step` does
        before stepping)."""
        cfg = self.config
        if cfg.mode == "off":
            return
        if not (self.bias if cfg.mode == "debias" else self.basis):
            self.uncorrected_steps += 1
            if self.uncorrected_steps == 1:
                warnings.warn("actzip SpectralCorrection: no anchor gradient yet; the fast circuit steps "
                              "uncorrected until one arrives (counted in uncorrected_steps)", stacklevel=3)
            return
        if cfg.mode == "debias":
            for p in self.corrected:
                if p.grad is not None and id(p) in self.bias:  # else: no measured pair yet
                    p.grad.add_(self.bias[id(p)].to(p.grad.dtype))
            return
        for p in self.matrices:
            if p.grad is None or id(p) not in self.basis:
                continue
            if cfg.mode == "wiener" and id(p) not in self.energy:
                continue  # no measured pair yet
            g = p.grad.float()
            inside = self._project(p, g)
            if cfg.mode == "projection":
                out = inside
            elif cfg.mode == "shrinkage":
                out = inside + cfg.shrink * (g - inside)
            else:
                s_in, s_out, n_in, n_out = self.energy[id(p)].tolist()
                if n_in == 0 and n_out == 0:
                    continue  # a gradient the masks do not touch: left exactly as it is
                keep_in, keep_out = s_in / max(s_in + n_in, 1e-30), s_out / max(s_out + n_out, 1e-30)
                out = keep_in * inside + keep_out * (g - inside)
            p.grad.copy_(out.to(p.grad.dtype))

    def step(self, closure=None):
        self.correct()
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
