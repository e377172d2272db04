"""Optimization on the Stiefel manifold: matrices ``V`` (``d x k``, ``k <= d``) with orthonormal columns.

A learnable projection that must stay orthonormal (MAPL's per-boundary projection) is trained by Riemannian
steepest descent:

1. project the Euclidean gradient ``G`` onto the tangent space at ``V``:
   ``grad = G - V sym(V^T G)`` with ``sym(A) = (A + A^T) / 2`` (the embedded metric);
2. step along ``-grad`` (plain, with momentum, or Adam-scaled; the scaled direction is projected again, and
   the momentum is carried to the new point by projecting it onto the new tangent space);
3. retract back onto the manifold: ``"qr"`` (``Q`` of ``V + xi`` with the signs of ``R``'s diagonal made
   positive, so the map is continuous) or ``"polar"`` (the nearest orthonormal matrix, ``U W^T`` from the
   SVD of ``V + xi``).

Two ways to use it:

- :class:`StiefelOptimizer`, a ``torch.optim.Optimizer`` over parameters of shape ``(d, k)``;
- :class:`StiefelStepper`, for a module whose other parameters are trained by any optimizer: it takes the
  projection's gradient away from that optimizer as soon as autograd has accumulated it (a public
  ``register_post_accumulate_grad_hook``; the generic optimizer skips a parameter whose ``.grad`` is
  ``None``), sums it over micro-batches, and applies the Riemannian step when the module's
  ``after_optimizer_step()`` calls :meth:`StiefelStepper.step`. If nobody calls it, the projection simply
  stays where it is (still orthonormal).

Everything is computed in float32 (float64 for float64 parameters), whatever the parameter's dtype.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from actzip.errors import ConfigError

__all__ = [
    "RETRACTIONS",
    "StiefelOptimizer",
    "StiefelStepper",
    "orthonormality_error",
    "random_stiefel",
    "retract",
    "tangent_project",
]

RETRACTIONS = ("qr", "polar")
METHODS = ("adam", "sgd")


def _work(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.dtype == torch.float64 else t.float()


def _check_shape(owner: str, v: torch.Tensor) -> None:
    if v.dim() != 2 or v.shape[1] > v.shape[0] or v.shape[1] < 1:
        raise ConfigError(f"{owner}: a Stiefel point must be a (d, k) matrix with 1 <= k <= d, got {tuple(v.shape)}")


def random_stiefel(d: int, k: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A ``d x k`` matrix with orthonormal columns, from a seeded Gaussian and QR (float64, then cast).

    Drawn on a private CPU generator, so the same ``(d, k, seed)`` gives the same matrix on every machine
    and the global RNG is untouched.
    """
    for name, value in (("d", d), ("k", k)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"random_stiefel: {name} must be a positive int, got {value!r}")
    if k > d:
        raise ConfigError(f"random_stiefel: k ({k}) must not exceed d ({d})")
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    q = retract(torch.randn(d, k, generator=g, dtype=torch.float64))
    return q.to(dtype)


def _sym(a: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a + a.transpose(-1, -2))


def tangent_project(v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The component of ``g`` in the tangent space of the Stiefel manifold at ``v``: ``g - v sym(v^T g)``."""
    return g - v @ _sym(v.transpose(-1, -2) @ g)


def retract(y: torch.Tensor, method: str = "qr") -> torch.Tensor:
    """The orthonormal matrix that ``y`` (a point moved off the manifold) retracts to."""
    if method == "qr":
        q, r = torch.linalg.qr(y)
        # QR is unique only up to column signs; fixing diag(R) > 0 makes it continuous in y.
        d = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
        d = torch.where(d == 0, torch.ones_like(d), d)
        return q * d.unsqueeze(-2)
    if method == "polar":
        u, _, vh = torch.linalg.svd(y, full_matrices=False)
        return u @ vh
    raise ConfigError(f"retract: method {method!r} is unknown; choose one of {list(RETRACTIONS)}")


def orthonormality_error(v: torch.Tensor) -> float:
    """``max |V^T V - I|`` (a host read: for tests and checks, not for the training loop)."""
    w = _work(v.detach())
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
    return float((w.transpose(-1, -2) @ w - eye).abs().max())


class StiefelOptimizer(torch.optim.Optimizer):
    """Riemannian steepest descent for ``(d, k)`` parameters with orthonormal columns.

    Options:
      lr: step size (> 0).
      method: ``"adam"`` (Riemannian Adam: first and second moments of the projected gradient, the scaled
        direction projected back onto the tangent space) or ``"sgd"`` (with ``momentum`` in ``[0, 1)``).
      betas, eps: Adam's moment decays and denominator floor.
      momentum: heavy-ball momentum for ``"sgd"``.
      retraction: ``"qr"`` or ``"polar"``.

    Parameters must start on the manifold (see :func:`random_stiefel`); ``step`` keeps them there to
    working precision (each retraction re-orthonormalizes, so errors do not accumulate).
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        method: str = "adam",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        momentum: float = 0.0,
        retraction: str = "qr",
    ) -> None:
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr > 0:
            raise ConfigError(f"StiefelOptimizer: lr must be a positive number, got {lr!r}")
        if method not in METHODS:
            raise ConfigError(f"StiefelOptimizer: method {method!r} is unknown; choose one of {list(METHODS)}")
        if retraction not in RETRACTIONS:
            raise ConfigError(
                f"StiefelOptimizer: retraction {retraction!r} is unknown; choose one of {list(RETRACTIONS)}"
            )
        if not (0.0 <= momentum < 1.0):
            raise ConfigError(f"StiefelOptimizer: momentum must be in [0, 1), got {momentum!r}")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ConfigError(f"StiefelOptimizer: betas must be two numbers in [0, 1), got {betas!r}")
        defaults = {
            "lr": lr,
            "method": method,
            "betas": tuple(betas),
            "eps": eps,
            "momentum": momentum,
            "retraction": retraction,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                _check_shape("StiefelOptimizer", p)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step_one(p, p.grad, group)
        return loss

    def _step_one(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> None:
        v = _work(p)
        rgrad = tangent_project(v, _work(grad))
        state = self.state[p]
        if group["method"] == "adam":
            b1, b2 = group["betas"]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(v)
                state["exp_avg_sq"] = torch.zeros_like(v)
            state["step"] += 1
            m, s = state["exp_avg"], state["exp_avg_sq"]
            m.mul_(b1).add_(rgrad, alpha=1 - b1)
            s.mul_(b2).addcmul_(rgrad, rgrad, value=1 - b2)
            bc1 = 1 - b1 ** state["step"]
            bc2 = 1 - b2 ** state["step"]
            direction = (m / bc1) / ((s / bc2).sqrt() + group["eps"])
        else:
            if group["momentum"] > 0:
                if "momentum" not in state:
                    state["momentum"] = torch.zeros_like(v)
                buf = state["momentum"]
                buf.mul_(group["momentum"]).add_(rgrad)
                direction = buf
            else:
                direction = rgrad
        # Adam's elementwise scaling and stale momentum leave the tangent space; project back.
        xi = tangent_project(v, direction)
        new = retract(v - group["lr"] * xi, group["retraction"])
        # Vector transport by projection: keep the moments in the tangent space of the new point.
        for key in ("exp_avg", "momentum"):
            if key in state:
                state[key].copy_(tangent_project(new, state[key]))
        p.copy_(new.to(p.dtype))


class StiefelStepper:
    """Keeps one ``(d, k)`` parameter on the Stiefel manifold beside any other optimizer.

    On construction it registers a post-accumulate-grad hook on ``param`` that moves the accumulated gradient
    into a private buffer (summed over micro-batches) and leaves ``param.grad`` as ``None``, so a generic
    optimizer stepping the module's other parameters skips this one. :meth:`step` then applies one
    :class:`StiefelOptimizer` step with the summed gradient and clears the buffer; it does nothing if no
    gradient arrived since the last step.
    """

    def __init__(self, param: torch.nn.Parameter, **optimizer_options) -> None:
        _check_shape("StiefelStepper", param)
        self.param = param
        self.optimizer = StiefelOptimizer([param], **optimizer_options)
        self._grad: torch.Tensor | None = None
        self._handle = param.register_post_accumulate_grad_hook(self._take_grad)

    def _take_grad(self, p: torch.Tensor) -> None:
        g = p.grad
        if g is None:
            return
        self._grad = g.detach().clone() if self._grad is None else self._grad.add_(g.detach())
        p.grad = None

    def add_grad(self, grad: torch.Tensor) -> None:
        """Add a gradient computed elsewhere (the far end's share of a projection both ends use)."""
        if grad.shape != self.param.shape:
            raise ConfigError(f"StiefelStepper.add_grad: expected a gradient of shape {tuple(self.param.shape)}, "
                              f"got {tuple(grad.shape)}")
        g = grad.detach().to(self.param.device, self.param.dtype)
        self._grad = g.clone() if self._grad is None else self._grad.add_(g)

    def take_grad(self) -> torch.Tensor | None:
        """The gradient summed since the last call (``None`` if none), without stepping."""
        g, self._grad = self._grad, None
        return g

    @property
    def pending(self) -> bool:
        """Whether a gradient is waiting for :meth:`step`."""
        return self._grad is not None

    def step(self) -> bool:
        """Apply the Riemannian step with the gradient collected since the last call; ``True`` if it moved."""
        if self._grad is None:
            return False
        self.param.grad = self._grad
        self._grad = None
        try:
            self.optimizer.step()
        finally:
            self.param.grad = None
        return True

    def remove(self) -> None:
        """Unregister the hook (the parameter then trains like any other)."""
        self._handle.remove()

