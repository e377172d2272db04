"""Roles of saved tensors: which torch function saved a tensor, and as which of its arguments.

A rule of the activation cache (:mod:`actzip.memory.cache.rules`) sees only the tensor being saved. Whether that
tensor may be stored lossily depends on what backward will do with it: the input of a linear map only enters
the weight gradient linearly (unbiased rounding keeps the gradient unbiased), while the input of a nonlinear
function goes through its derivative. :class:`RoleTracker` records which torch function is running, so a pack
hook can ask :func:`current_role` about the tensor it is given. ``actzip.cache(...)`` enters a tracker itself
when its rules ask for roles (every preset but ``lossless``)::

    with actzip.cache("balanced") as cache:
        loss = model(x).sum()

Roles (:data:`ROLES`):

==================  ==========================================================================================
``linear_input``    an operand of ``F.linear``, ``matmul``/``@``, ``mm``, ``bmm``, ``addmm``, ``baddbmm``,
                    ``einsum``, ... that is not a parameter (a view or a copy of it counts too)
``nonlinear_input`` what the backward of an elementwise nonlinear function reads: the input of ``gelu``,
                    ``silu``, ``softplus``, ``mish``, ``pow``/``square``, the operands of a tensor ``mul`` or
                    ``div``; the output of ``tanh``, ``sigmoid``, ``exp`` (their backward reads the output)
``relu_output``     what ``relu`` saves (its output; for an in-place relu that is the argument itself), and a
                    tensor saved by ``threshold`` that is not one of its arguments
``attention``       anything saved inside ``F.scaled_dot_product_attention``, ``softmax``, ``log_softmax``,
                    ``F.multi_head_attention_forward`` (its projections included: it is one call)
``norm``            anything saved inside ``layer_norm``, ``rms_norm``, ``group_norm``, ``batch_norm``,
                    ``instance_norm``, ``F.normalize``
``loss``            anything saved inside ``F.cross_entropy``, ``nll_loss``, ``kl_div``,
                    ``binary_cross_entropy_with_logits`` (the log-probabilities of the loss head)
``parameter``       an ``nn.Parameter`` passed to the function or a view of one; inside a linear-family
                    function also a tensor of a parameter's shape (or, 2-D, its transpose) that matches no
                    argument, like the copy autocast makes of a weight
``other``           everything else, and every tensor saved outside a tracked function
==================  ==========================================================================================

:data:`ROLE_TABLE` is the function table, by role and name; :func:`function_role` gives the entry of one
function object. A saved tensor is matched to the arguments of the running function by identity, then by
storage, offset and shape, then by storage alone (a view of an argument, e.g. the 2-D reshape ``F.linear``
saves of a 3-D input, counts as that argument).

Limits:

- Only the outermost torch function is seen: while a :class:`~torch.overrides.TorchFunctionMode` handles a
  call it is switched off, so the functions a Python-level torch function calls (``F.layer_norm`` calling
  ``torch.layer_norm``, ``F.multi_head_attention_forward`` calling ``linear`` and ``softmax``) are not seen;
  every tensor saved inside gets the outer function's role, or ``other`` when that function is not in the
  table.
- Code that does not go through ``__torch_function__`` is not seen: custom ``torch.autograd.Function``
  subclasses (they save after their ``forward`` returns, so their tensors get ``other``, unless their ``apply``
  runs inside :class:`declared_role`), C++/TorchScript
  modules, and ``torch.compile``'d regions (the compiler chooses what is saved; the cache keeps those saves as
  they are and counts them apart, see :mod:`actzip.memory.cache.compiled`).
- Cost: while a tracker is active every torch function call, tensor method and attribute access included, goes
  through one Python call and a dict lookup; a call found in the table also pushes a frame. That is a few
  microseconds per call: negligible for large layers, noticeable for models made of many tiny ops.

Trackers are per thread (like the modes and saved-tensor hooks they work with), and nest: inner and outer
trackers both record, and leaving one restores the state before it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

LINEAR_INPUT = "linear_input"
NONLINEAR_INPUT = "nonlinear_input"
RELU_OUTPUT = "relu_output"
ATTENTION = "attention"
NORM = "norm"
LOSS = "loss"
PARAMETER = "parameter"
OTHER = "other"
ROLES = (LINEAR_INPUT, NONLINEAR_INPUT, RELU_OUTPUT, ATTENTION, NORM, LOSS, PARAMETER, OTHER)


@dataclass(frozen=True)
class FunctionRole:
    """Role of what a function saves: ``argument`` for (views of) its non-parameter tensor arguments,
    ``result`` for tensors that match no argument (its output, or a copy it made)."""

    argument: str
    result: str


# The table, by role: names looked up in torch, torch.nn.functional, torch._C._nn, torch.Tensor and torch.special
# (a name missing from a namespace is skipped). In-place variants are listed where they save tensors.
ROLE_TABLE: dict[FunctionRole, tuple[str, ...]] = {
    FunctionRole(LINEAR_INPUT, LINEAR_INPUT): (
        "linear", "bilinear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "mv", "addmm", "addmm_",
        "baddbmm", "baddbmm_", "addbmm", "addmv", "einsum", "tensordot",
    ),
    FunctionRole(NONLINEAR_INPUT, NONLINEAR_INPUT): (
        "gelu", "silu", "mish", "softplus", "tanh", "tanh_", "sigmoid", "sigmoid_", "expit", "logsigmoid",
        "exp", "exp_", "pow", "pow_", "__pow__", "__rpow__", "square", "square_", "mul", "mul_", "__mul__",
        "__rmul__", "__imul__", "multiply", "div", "div_", "true_divide", "divide", "__truediv__",
        "__rtruediv__", "__itruediv__", "sqrt", "rsqrt", "log", "erf", "sin", "cos", "elu", "selu", "celu",
        "leaky_relu", "hardswish", "hardsigmoid", "hardtanh", "relu6", "prelu", "glu",
    ),
    FunctionRole(RELU_OUTPUT, RELU_OUTPUT): ("relu", "relu_"),
    # threshold's backward reads its input: that is a nonlinear input; only a non-argument is an output.
    FunctionRole(NONLINEAR_INPUT, RELU_OUTPUT): ("threshold", "threshold_"),
    FunctionRole(ATTENTION, ATTENTION): (
        "scaled_dot_product_attention", "softmax", "log_softmax", "softmin", "multi_head_attention_forward",
    ),
    FunctionRole(NORM, NORM): (
        "layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm", "normalize",
    ),
    # The loss head: its backward turns the saved log-probabilities back into probabilities, so their error is
    # multiplied into the output gradient.
    FunctionRole(LOSS, LOSS): ("cross_entropy", "nll_loss", "kl_div", "binary_cross_entropy_with_logits"),
}

_NAMESPACES = (torch, F, torch._C._nn, torch.Tensor, torch.special)


def _build_table() -> dict[Any, FunctionRole]:
    table: dict[Any, FunctionRole] = {}
    for entry, names in ROLE_TABLE.items():
        for ns in _NAMESPACES:
            for name in names:
                f = getattr(ns, name, None)
                if callable(f):
                    table.setdefault(f, entry)
    return table


_FUNCTIONS: dict[Any, FunctionRole] = _build_table()


def function_role(func: Callable) -> FunctionRole | None:
    """The table entry of a torch function object (``F.gelu``, ``torch.Tensor.mul``, ...), ``None`` if absent."""
    try:
        return _FUNCTIONS.get(func)
    except TypeError:  # unhashable callable
        return None


@dataclass
class TrackedCall:
    """A call of a function of the table, running now: the function, its entry and its arguments."""

    func: Callable
    role: FunctionRole
    args: tuple
    kwargs: dict

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(argument name, tensor)`` for each tensor argument, one level into lists and tuples."""
        for i, a in enumerate(self.args):
            yield from _tensors_in(f"args[{i}]", a)
        for k, a in self.kwargs.items():
            yield from _tensors_in(k, a)


def _tensors_in(name: str, a) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(a, torch.Tensor):
        yield name, a
    elif isinstance(a, (list, tuple)):
        for j, b in enumerate(a):
            if isinstance(b, torch.Tensor):
                yield f"{name}[{j}]", b


class _State(threading.local):
    def __init__(self) -> None:
        self.frames: list[TrackedCall] = []  # tracked calls running now, innermost last
        self.active = 0  # trackers entered and not left
        # The role last computed in the open query: (id of the tensor, role). The rules of one save ask the same
        # question once per rule; within a query (see role_query) the tensor being saved is alive, so its id
        # names it.
        self.memo: tuple[int, str] | None = None
        self.queries = 0  # queries open (nested saves are possible)
        # The role every tensor has while a compiled graph's save is decided (see assumed_role), else None.
        self.assumed: str | None = None


_STATE = _State()


class RoleTracker(TorchFunctionMode):
    """A torch function mode that records the running torch function, for :func:`current_role`.

    The cache context enters one around its ``with`` block when its rules ask for roles (see
    :mod:`actzip.memory.cache.presets`); enter one yourself only for code of your own that asks
    :func:`current_role`. It changes no result. See the module docstring for the roles, the cost and the limits.
    """

    def __enter__(self) -> "RoleTracker":
        super().__enter__()
        _STATE.active += 1
        return self

    def __exit__(self, *exc) -> None:
        _STATE.active -= 1
        super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():  # dynamo traces modes: a compiled graph's roles come from the graph
            return func(*args, **kwargs)
        role = function_role(func)
        if role is None:
            return func(*args, **kwargs)
        frames = _STATE.frames
        frames.append(TrackedCall(func, role, args, kwargs))
        try:
            return func(*args, **kwargs)
        finally:
            frames.pop()


def tracking() -> bool:
    """Whether a :class:`RoleTracker` is active on this thread."""
    return _STATE.active > 0


def current_function() -> Callable | None:
    """The innermost tracked torch function running now on this thread, or ``None``."""
    frames = _STATE.frames
    return frames[-1].func if frames else None


def storage_key(t: torch.Tensor):
    """``(device, storage address)`` of ``t``, or ``None`` for a tensor without one (not strided, empty, or a
    subclass without storage): while ``t`` is alive no other storage has that address."""
    if t.layout != torch.strided or t.numel() == 0:
        return None
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (subclasses, functional wrappers)
        return None
    return (t.device, ptr) if ptr else None


def _is_parameter(a: torch.Tensor) -> bool:
    return isinstance(a, torch.nn.Parameter)


def _match(t: torch.Tensor, frame: TrackedCall) -> tuple[str, torch.Tensor] | None:
    """The argument ``t`` is: by identity, then storage + offset + shape, then storage (a view of it)."""
    args = list(frame.tensors())
    for name, a in args:
        if a is t:
            return name, a
    key = storage_key(t)
    if key is None:
        return None
    same = [(name, a) for name, a in args if storage_key(a) == key]
    for name, a in same:
        if a.storage_offset() == t.storage_offset() and a.shape == t.shape:
            return name, a
    return same[0] if same else None


def _shaped_like(t: torch.Tensor, p: torch.Tensor) -> bool:
    return t.shape == p.shape or (t.dim() == 2 and p.dim() == 2 and t.shape == p.shape[::-1])


def current_argument(t: torch.Tensor) -> str | None:
    """Which argument of the running tracked function ``t`` is (``"args[0]"``, ``"weight"``, ...), or ``None``."""
    frames = _STATE.frames
    if not frames:
        return None
    hit = _match(t, frames[-1])
    return hit[0] if hit else None


class role_query:
    """Context of one decision about a saved tensor: inside it :func:`current_role` works a tensor's role out
    once and remembers it (save hooks open one around their rules, which may each ask). Outside every query
    nothing is remembered."""

    __slots__ = ()

    def __enter__(self) -> None:
        _STATE.queries += 1
        _STATE.memo = None

    def __exit__(self, *exc) -> None:
        _STATE.queries -= 1
        _STATE.memo = None


def current_role(t: torch.Tensor) -> str:
    """The role (one of :data:`ROLES`) of ``t``, a tensor being saved now; ``"other"`` outside a tracked call."""
    state = _STATE
    if state.assumed is not None:
        return state.assumed
    memo = state.memo
    if memo is not None and state.queries and memo[0] == id(t):
        return memo[1]
    frames = state.frames
    if not frames:
        return OTHER
    if not state.queries:
        return role_in_call(t, frames[-1])
    role = role_in_call(t, frames[-1])
    state.memo = (id(t), role)
    return role


def settle_role(t: torch.Tensor, role: str) -> None:
    """Inside the open :class:`role_query` about ``t``: its role is ``role`` (known without a tracked call, e.g.
    from a :class:`~actzip.memory.cache.role_plan.RolePlan`), which :func:`current_role` then answers."""
    _STATE.memo = (id(t), role)


class assumed_role:
    """``with assumed_role(role):`` every :func:`current_role` answers ``role``: how the rules decide a tensor
    a compiled graph saves, whose role comes from the graph (:mod:`actzip.memory.cache.compiled_roles`), not
    from a tracked call. :func:`role_is_assumed` says whether one is open."""

    __slots__ = ("role", "_before")

    def __init__(self, role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        self.role = role

    def __enter__(self) -> None:
        self._before, _STATE.assumed = _STATE.assumed, self.role

    def __exit__(self, *exc) -> None:
        _STATE.assumed = self._before


class declared_role:
    """``with declared_role(role):`` a tensor saved inside has ``role``, as if a function of the table with that
    role had saved it: for custom ``torch.autograd.Function`` subclasses, which the tracker cannot see (their
    saves would be ``other``). Put it around the function's ``apply``; calls of the table inside still count."""

    __slots__ = ("_frame",)

    def __init__(self, role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        self._frame = TrackedCall(declared_role, FunctionRole(role, role), (), {})

    def __enter__(self) -> None:
        _STATE.frames.append(self._frame)

    def __exit__(self, *exc) -> None:
        _STATE.frames.pop()


def role_is_assumed() -> bool:
    """Whether a compiled graph's save is being decided (inside :class:`assumed_role`)."""
    return _STATE.assumed is not None


def role_in_call(t: torch.Tensor, frame: TrackedCall) -> str:
    """The role of ``t``, saved inside the tracked call ``frame`` (worked out afresh: :func:`current_role`
    remembers it for the save being decided)."""
    hit = _match(t, frame)
    if hit is not None:
        return PARAMETER if _is_parameter(hit[1]) else frame.role.argument
    if frame.role.argument == LINEAR_INPUT and any(_is_parameter(a) and _shaped_like(t, a) for _, a in frame.tensors()):
        return PARAMETER  # a copy of a weight (autocast casts inside the op)
    return frame.role.result


role_of_current = current_role
