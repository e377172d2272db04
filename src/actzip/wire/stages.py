"""Pipeline stages around any model's pieces, and running them as a chain in one process.

A :class:`Stage` wraps one user module (``body``) with the ends of the boundaries on either side:

- first stage: user input -> ``body`` -> ``sender``;
- middle stages: ``receiver`` -> ``body`` -> ``sender``;
- last stage: ``receiver`` -> ``body`` -> output (what the loss takes).

A receiver returns ``(x, ids)``: the activation and, when its boundary carries them, the batch's token ids
(a forward-only side channel: anchors and fixed embeddings are rebuilt from them). The ids go on to the
stage's sender, so every boundary after the first sees them too. On the first stage the ids are its input
when ``input_ids=True`` (a language model's token ids), else there are none. ``body`` only sees ``x``.

A runner moving messages between processes does, per boundary::

    out = stage_i(inp)                         # keep `out` for the backward
    msg = stage_i.wire_encode(out)             # what goes on the link (RVQ: indices instead of the code)
    ...send msg...
    inp = stage_j.wire_decode(received)        # the receiver rebuilds what the link dropped, checks state
    # mark inp's floating-point tensors requires_grad, run stage_j, and send back their .grad by key;
    # stage_i then calls torch.autograd.backward([out[k] ...], [grad[k] ...]).
    # after a step's last backward, receiver -> sender (a tied Stiefel projection's gradient share):
    stage_i.wire_backward_accept(stage_j.wire_backward_items())
    ...optimizer.step(); stage.after_optimizer_step()   # Stiefel step, codebook update

A receiver that finds its codebook out of sync raises :class:`actzip.errors.CodebookDesyncError`; the runner
then calls ``stage_i.request_resync()`` and the next message carries the whole codebook
(:class:`actzip.wire.Pipeline` recovers by itself: it decodes that message with the receiver's codebook as it
is and asks the sender for a snapshot with the microbatch's gradient).
:func:`run_chain` does all of this in one process (tests, single-process studies) and meters the bytes;
:func:`exchange_backward` does the step's receiver-to-sender hand-over after the backward.

Example, a two-stage model with a 4x bottleneck boundary::

    >>> import torch
    >>> from torch import nn
    >>> from actzip.wire import Stage, boundary_config, make_boundary, run_chain
    >>> sender, receiver = make_boundary(boundary_config("bottleneck:4", n_embd=16))
    >>> stages = [Stage(nn.Linear(8, 16), sender=sender), Stage(nn.Linear(16, 3), receiver=receiver)]
    >>> run_chain(stages, torch.randn(2, 5, 8)).shape
    torch.Size([2, 5, 3])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from actzip.compat import deprecated, warn_once
from actzip.core.optim import make_optimizer
from actzip.errors import ConfigError
from actzip.wire.boundaries import BOUNDARIES, BoundaryReceiver, BoundarySender
from actzip.wire.boundaries import parse_boundary_options as _parse_boundary_options

__all__ = ["Stage", "WireMeter", "exchange_backward", "message_nbytes", "run_chain", "stage_optimizer"]


def stage_optimizer(module: nn.Module, lr: float = 3e-4, weight_decay: float = 0.1,
                    betas: tuple[float, float] = (0.9, 0.95), optimizer: str = "adamw") -> torch.optim.Optimizer:
    """AdamW with weight decay on tensors of >= 2 dims only (matrices, embeddings), fused when all are on CUDA;
    ``optimizer="muon"``: Muon on the hidden matrices, AdamW on the rest (:func:`actzip.core.optim.make_optimizer`).

    Stiefel projections are in the list but never stepped by it: their gradient is taken away as soon as it
    is accumulated and applied on the manifold by ``after_optimizer_step``.
    """
    return make_optimizer(module, optimizer, lr=lr, weight_decay=weight_decay, betas=tuple(betas))


class Stage(nn.Module):
    """One pipeline stage: ``[receiver] -> body -> [sender]`` (see the module docstring).

    ``body``: the user's module for this stage; ``sender`` / ``receiver``: boundary ends (from
    :func:`actzip.wire.make_boundary`), none for a first / last stage or a boundary that sends the activation
    as it is; ``input_ids``: this first stage's input is the batch's token ids, handed to its sender.
    """

    def __init__(self, body: nn.Module, *, sender: BoundarySender | None = None,
                 receiver: BoundaryReceiver | None = None, input_ids: bool = False) -> None:
        super().__init__()
        for name, end, kind in (("sender", sender, BoundarySender), ("receiver", receiver, BoundaryReceiver)):
            if end is not None and not isinstance(end, kind):
                raise ConfigError(f"Stage: {name} must be a {kind.__name__} (actzip.wire.make_boundary), got "
                                  f"{type(end).__name__}")
        if not isinstance(body, nn.Module):
            raise ConfigError(f"Stage: body must be an nn.Module, got {type(body).__name__}")
        if input_ids and receiver is not None:
            raise ConfigError("Stage: input_ids=True is for a first stage (its input is the token ids); this one "
                              "has a receiver, whose message carries the ids")
        self.receiver = receiver
        self.body = body
        self.sender = sender
        self.input_ids = input_ids

    def forward(self, inp):
        if self.receiver is not None:
            x, ids = self.receiver(inp)
        else:
            x, ids = inp, (inp if self.input_ids else None)
        out = self.body(x)
        return out if self.sender is None else self.sender(out, ids)

    @property
    def boundary(self) -> str | None:
        """The spec name of this stage's boundary ends (its sender's, else its receiver's); None without ends."""
        end = self.sender if self.sender is not None else self.receiver
        return None if end is None else end.cfg.name

    def wire_encode(self, out):
        """What goes on the link for this stage's output (see the module docstring)."""
        return out if self.sender is None else self.sender.wire_encode(out)

    def wire_decode(self, msg, stale_ok: bool = False):
        """This stage's input rebuilt from what arrived on the link (``stale_ok``: see the runner's recovery
        from a codebook desync in :mod:`actzip.wire.pipeline`)."""
        return msg if self.receiver is None else self.receiver.wire_decode(msg, stale_ok)

    @property
    def wire_exact_keys(self) -> tuple[str, ...]:
        """Message items of this stage's boundary ends that must cross bit for bit (codebook and projection
        updates): a runner's lossy byte codec leaves them alone."""
        return tuple(k for end in (self.receiver, self.sender) if end is not None for k in end.exact_keys)

    def wire_backward_items(self) -> dict[str, torch.Tensor]:
        """What this stage's receiver returns to the previous stage once the step's backward is done (a tied
        Stiefel projection's gradient share); send it with the step's last gradient message."""
        return {} if self.receiver is None else self.receiver.wire_backward_items()

    def wire_backward_accept(self, items: dict[str, torch.Tensor]) -> None:
        """Hand what the next stage's :meth:`wire_backward_items` returned to this stage's sender."""
        if self.sender is not None:
            self.sender.wire_backward_accept(items)
        elif items:
            raise ConfigError(f"a stage without a sender cannot take {sorted(items)}")

    def after_optimizer_step(self) -> None:
        """Call after every optimizer step: Stiefel steps and codebook updates of this stage's boundary ends,
        then the body's own ``after_optimizer_step`` if it has one."""
        for end in (self.receiver, self.sender):
            if end is not None:
                end.after_optimizer_step()
        hook = getattr(self.body, "after_optimizer_step", None)
        if callable(hook):
            hook()

    def request_resync(self) -> None:
        """The next message of this stage's sender carries its full state (after a desync)."""
        if self.sender is not None:
            self.sender.request_resync()

    def configure_optimizer(self, lr: float = 3e-4, weight_decay: float = 0.1, betas=(0.9, 0.95),
                            optimizer: str = "adamw"):
        """This stage's optimizer (:func:`stage_optimizer`)."""
        return stage_optimizer(self, lr=lr, weight_decay=weight_decay, betas=betas, optimizer=optimizer)


# ---- one-process chaining ------------------------------------------------------------------------------


@dataclass
class WireMeter:
    """Bytes that crossed each boundary, per direction, and tokens processed (for bytes per token)."""

    fwd_bytes: list[int] = field(default_factory=list)  # per boundary, forward messages
    bwd_bytes: list[int] = field(default_factory=list)  # per boundary, gradients and backward hand-overs
    tokens: int = 0  # elements of the inputs chained (tokens, for token-id inputs)

    def grow(self, boundaries: int) -> None:
        """Make room for ``boundaries`` boundaries."""
        while len(self.fwd_bytes) < boundaries:
            self.fwd_bytes.append(0)
            self.bwd_bytes.append(0)

    def per_token(self) -> dict[str, float]:
        """Mean bytes per token per boundary, each direction."""
        n = max(1, self.tokens) * max(1, len(self.fwd_bytes))
        return {"fwd": sum(self.fwd_bytes) / n, "bwd": sum(self.bwd_bytes) / n}


def message_nbytes(msg) -> int:
    """Bytes of a message: every tensor's elements."""
    tensors = msg.values() if isinstance(msg, dict) else [msg]
    return sum(t.numel() * t.element_size() for t in tensors)


class _Link(torch.autograd.Function):
    # Forward: the receiver's copy; backward: its gradient goes to the sender's tensor, metered.
    @staticmethod
    def forward(ctx, sent, received, meter, boundary):
        ctx.meter, ctx.boundary = meter, boundary
        return received.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.meter is not None:
            ctx.meter.bwd_bytes[ctx.boundary] += grad.numel() * grad.element_size()
        return grad, None, None, None


def _receive(out, msg, meter: WireMeter | None, boundary: int):
    def link(sent, got):
        if isinstance(sent, torch.Tensor) and sent.requires_grad and got.is_floating_point():
            return _Link.apply(sent, got, meter, boundary)
        return got

    if isinstance(msg, dict):
        return {k: link(out.get(k) if isinstance(out, dict) else None, v) for k, v in msg.items()}
    return link(out, msg)


def _hook(module: nn.Module, name: str, default):
    fn = getattr(module, name, None)
    return fn if callable(fn) else default


def exchange_backward(stages: list[nn.Module], meter: WireMeter | None = None) -> None:
    """After the backward of a step chained by :func:`run_chain`: hand every receiver's
    :meth:`Stage.wire_backward_items` to the sender before it (a tied Stiefel projection's gradient), metering
    them as backward bytes. Call it before the optimizer step."""
    for i in range(1, len(stages)):
        items = _hook(stages[i], "wire_backward_items", dict)()
        if meter is not None and items:
            meter.grow(i)
            meter.bwd_bytes[i - 1] += message_nbytes(items)
        if items:
            accept = getattr(stages[i - 1], "wire_backward_accept", None)
            if not callable(accept):
                raise ConfigError(f"exchange_backward: stage {i - 1} cannot take {sorted(items)} (it has no "
                                  "wire_backward_accept)")
            accept({k: v.detach().clone() for k, v in items.items()})
        else:
            _hook(stages[i - 1], "wire_backward_accept", lambda items: None)({})


def run_chain(stages: list[nn.Module], inp, meter: WireMeter | None = None):
    """Run ``stages`` in order in one process, as a pipeline runner would; returns the last stage's output.

    Each message goes through ``wire_encode``, is copied (the receiver gets detached tensors, as over a link),
    then ``wire_decode``; gradients of the received floating-point tensors flow back to the sender's tensors of
    the same key. ``meter`` counts the bytes in both directions (and ``inp``'s elements as tokens).
    """
    if not stages:
        raise ConfigError("run_chain: no stages")
    if meter is not None:
        meter.tokens += inp.numel()
        meter.grow(len(stages) - 1)
    for i, stage in enumerate(stages):
        out = stage(inp)
        if i == len(stages) - 1:
            return out
        msg = _hook(stage, "wire_encode", lambda o: o)(out)
        if meter is not None:
            meter.fwd_bytes[i] += message_nbytes(msg)
        copied = {k: v.detach().clone() for k, v in msg.items()} if isinstance(msg, dict) else msg.detach().clone()
        inp = _receive(out, _hook(stages[i + 1], "wire_decode", lambda m: m)(copied), meter, i)
    raise AssertionError("unreachable")


# Old names of this module, kept for one release.
parse_boundary_options = deprecated(_parse_boundary_options, "actzip.wire.stages.parse_boundary_options",
                                    "actzip.wire.boundaries.parse_boundary_options")
_MOVED = {  # the reference GPT's stage splitter left the library with the reference GPT
    "build_stages": "actzip_bench.models.gpt_stages.build_gpt_stages (old signature: .build_stages)",
    "boundary_config": "actzip.wire.boundary_config (for the reference GPT: actzip_bench.models.gpt_stages)",
}


def __getattr__(name: str):
    if name == "COMPRESSORS":
        warn_once("actzip.wire.stages.COMPRESSORS", "actzip.wire.BOUNDARIES")
        return BOUNDARIES
    if name in _MOVED:
        raise AttributeError(f"actzip.wire.stages.{name} moved to {_MOVED[name]}")
    raise AttributeError(f"module 'actzip.wire.stages' has no attribute {name!r}")
