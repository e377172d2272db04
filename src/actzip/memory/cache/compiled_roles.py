"""Roles of the tensors a compiled graph saves, read from the graphs themselves.

In eager code a :class:`~actzip.memory.cache.roles.RoleTracker` sees which torch function saves a tensor. A
``torch.compile``'d region saves what AOTAutograd's partitioner chose, inside one autograd function, and no
torch function call is left to watch. What is left is better: the backward graph says exactly what each saved
tensor is used for. :func:`saved_role` gives the same roles (:data:`~actzip.memory.cache.roles.ROLES`) from
the backward uses of a saved node (looking through views and casts), and from the forward op that made it:

==================  ==============================================================================================
``attention``       used by an attention backward (flash, efficient, cuDNN, math softmax backward), or made by a
                    scaled-dot-product-attention forward (its output, log-sum-exp, seeds)
``norm``            used by a norm's backward (layer, group, batch, fused RMS), made by a norm's forward, or a
                    decomposed norm's statistic (its mean, or the reciprocal square root of a mean or variance)
``loss``            used by the backward of log-softmax or NLL, or made by a log-softmax
``relu_output``     used by ``threshold_backward``, or made by ``relu``
``linear_input``    every use a matrix product (``mm``, ``bmm``, ``addmm``, ``baddbmm``): it only enters a
                    gradient linearly
``nonlinear_input`` any other arithmetic use (the derivative of a nonlinear function reads it)
``other``           anything else (a use the table does not know, e.g. an opaque custom op)
==================  ==============================================================================================

Rows are tried top to bottom. Ops are compared by their ATen name, without the overload.
"""

from __future__ import annotations

import torch.fx

from actzip.memory.cache.roles import ATTENTION, LINEAR_INPUT, LOSS, NONLINEAR_INPUT, NORM, OTHER, RELU_OUTPUT

__all__ = ["aten_name", "backward_uses", "saved_role"]

# Ops that pass a tensor on unchanged in value (views, copies, dtype casts): looked through to the real use.
PASS_THROUGH = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "t", "transpose", "expand", "slice", "select", "unsqueeze",
    "squeeze", "clone", "alias", "contiguous", "_to_copy", "convert_element_type", "as_strided", "unfold",
    "split", "split_with_sizes", "getitem", "detach", "view_as", "flatten", "lift_fresh_copy",
})
MATMULS = frozenset({"mm", "bmm", "addmm", "baddbmm", "matmul", "_scaled_mm", "addbmm", "dot", "mv"})
ATTENTION_BACKWARD = frozenset({
    "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_flash_attention_backward", "_efficient_attention_backward", "_softmax_backward_data",
    "_scaled_dot_product_fused_attention_overrideable_backward",
})
ATTENTION_FORWARD = frozenset({
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention_forward", "_efficient_attention_forward", "_softmax",
    "_scaled_dot_product_fused_attention_overrideable",
})
NORM_BACKWARD = frozenset({"native_layer_norm_backward", "native_group_norm_backward", "native_batch_norm_backward",
                           "_fused_rms_norm_backward", "cudnn_batch_norm_backward", "batch_norm_backward"})
NORM_FORWARD = frozenset({"var_mean", "native_layer_norm", "native_group_norm", "native_batch_norm", "_fused_rms_norm",
                          "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "cudnn_batch_norm"})
LOSS_BACKWARD = frozenset({"_log_softmax_backward_data", "nll_loss_backward", "nll_loss2d_backward",
                           "nll_loss_forward"})
LOSS_FORWARD = frozenset({"_log_softmax", "log_softmax"})
# Elementwise arithmetic: a saved tensor one of these reads in backward is a nonlinear function's input.
ARITHMETIC = frozenset({
    "mul", "div", "add", "sub", "rsub", "neg", "pow", "exp", "log", "sigmoid", "tanh", "erf", "erfc", "sqrt",
    "rsqrt", "reciprocal", "sin", "cos", "abs", "sign", "where", "gt", "ge", "lt", "le", "eq", "ne",
    "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward", "softplus_backward", "mish_backward",
    "hardswish_backward", "elu_backward", "leaky_relu_backward", "clamp", "clamp_min", "clamp_max", "maximum",
    "minimum", "fma", "addcmul", "addcdiv", "square", "exp2", "log1p", "expm1", "sum", "mean", "amax",
    "logical_not", "bitwise_not", "copysign", "threshold", "fill", "full_like", "zeros_like", "ones_like",
})


def aten_name(node: torch.fx.Node) -> str:
    """The op name of a ``call_function`` node without namespace and overload (``aten.mm.default`` -> ``mm``;
    ``operator.getitem`` -> ``getitem``); ``""`` for other nodes."""
    if node.op != "call_function":
        return ""
    target = node.target
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        return str(getattr(packet, "_qualified_op_name", packet)).split("::")[-1].split(".")[-1]
    return getattr(target, "__name__", str(target)).split(".")[-1]


def backward_uses(saved_name: str, backward: torch.fx.Graph) -> list[str]:
    """The names of the ops that use the backward graph's input ``saved_name``, looking through
    :data:`PASS_THROUGH` ops; ``[]`` when the graph has no such input."""
    start = next((n for n in backward.find_nodes(op="placeholder") if n.name == saved_name), None)
    if start is None:
        return []
    uses, todo, seen = [], list(start.users), set()
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        name = aten_name(node)
        if name in PASS_THROUGH:
            todo.extend(node.users)
        else:
            uses.append(name or node.op)
    return uses


def _made_by(node: torch.fx.Node) -> str:
    """The op that made ``node``, looking back through :data:`PASS_THROUGH` ops (a ``getitem`` of a
    multi-output op counts as that op)."""
    seen = 0
    while aten_name(node) in PASS_THROUGH and node.args and isinstance(node.args[0], torch.fx.Node) and seen < 64:
        node, seen = node.args[0], seen + 1
    return aten_name(node)


def _norm_statistic(node: torch.fx.Node) -> bool:
    """A decomposed norm's per-row statistic: ``rsqrt`` (or a reciprocal) of a mean or variance, a few ops up."""
    if aten_name(node) not in ("rsqrt", "reciprocal", "sqrt"):
        return False
    todo = [(node, 0)]
    while todo:
        n, depth = todo.pop()
        if depth and aten_name(n) in ("var_mean", "var", "mean"):
            return True
        if depth < 4:
            todo.extend((a, depth + 1) for a in n.args if isinstance(a, torch.fx.Node))
    return False


def saved_role(saved: torch.fx.Node, backward: torch.fx.Graph) -> str:
    """The role of the forward node ``saved``, an input of ``backward`` under the same name (see the module
    docstring's table)."""
    uses = set(backward_uses(saved.name, backward))
    made = _made_by(saved)
    if uses & ATTENTION_BACKWARD or made in ATTENTION_FORWARD:
        return ATTENTION
    if uses & NORM_BACKWARD or made in NORM_FORWARD or _norm_statistic(saved):
        return NORM
    if uses & LOSS_BACKWARD or made in LOSS_FORWARD:
        return LOSS
    if "threshold_backward" in uses or made == "relu":
        return RELU_OUTPUT
    if uses and uses <= MATMULS:
        return LINEAR_INPUT
    if uses & ARITHMETIC:
        return NONLINEAR_INPUT
    return OTHER
