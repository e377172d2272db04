"""Roles of a compiled graph's saves, from the backward graph's uses and the forward op that made them."""

import operator

import torch
import torch.fx

from actzip.memory.cache.compiled_roles import aten_name, backward_uses, saved_role

aten = torch.ops.aten


def forward_node(target, *args):
    """A forward graph with one saved node made by ``target`` (args: placeholders by name, or constants)."""
    g = torch.fx.Graph()
    ins = [g.placeholder(a) if isinstance(a, str) else a for a in args]
    node = g.call_function(target, tuple(ins))
    g.output(node)
    return node


def backward_graph(saved: str, *uses):
    """A backward graph whose input ``saved`` goes through each chain of ops in ``uses`` (each a list of
    targets, the first ones taking the saved tensor and the tangent)."""
    g = torch.fx.Graph()
    s, tangent = g.placeholder(saved), g.placeholder("tangent")
    outs = []
    for chain in uses:
        v = s
        for target in chain:
            v = g.call_function(target, (v, tangent) if target in (aten.mm.default, aten.mul.Tensor) else (v,))
        outs.append(v)
    g.output(tuple(outs))
    return g


def test_op_names_drop_namespace_and_overload():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    assert aten_name(g.call_function(aten.mm.default, (x, x))) == "mm"
    assert aten_name(g.call_function(operator.getitem, (x, 0))) == "getitem"
    assert aten_name(x) == ""


def test_uses_are_found_through_views_and_casts():
    bw = backward_graph("h", [aten.t.default, aten.mm.default], [aten._to_copy.default, aten.view.default,
                                                                  aten.mul.Tensor])
    assert sorted(backward_uses("h", bw)) == ["mm", "mul"]
    assert backward_uses("absent", bw) == []


def test_each_role_of_the_table():
    mm = forward_node(aten.mm.default, "a", "b")
    assert saved_role(mm, backward_graph(mm.name, [aten.permute.default, aten.mm.default])) == "linear_input"
    assert saved_role(mm, backward_graph(mm.name, [aten.mul.Tensor], [aten.mm.default])) == "nonlinear_input"
    relu = forward_node(aten.relu.default, "a")
    assert saved_role(relu, backward_graph(relu.name, [aten.mm.default])) == "relu_output"
    ln = forward_node(aten.native_layer_norm.default, "a")
    assert saved_role(ln, backward_graph(ln.name, [aten.mul.Tensor])) == "norm"
    sm = forward_node(aten._log_softmax.default, "a", -1, False)
    assert saved_role(sm, backward_graph(sm.name, [aten.exp.default])) == "loss"
    att = forward_node(aten._scaled_dot_product_flash_attention_for_cpu.default, "q", "k", "v")
    assert saved_role(att, backward_graph(att.name, [aten.mm.default])) == "attention"
    opaque = forward_node(aten.mm.default, "a", "b")
    assert saved_role(opaque, backward_graph(opaque.name, [aten.cumsum.default])) == "other"


def test_a_decomposed_norms_statistic_is_a_norm_tensor():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    var = g.call_function(aten.mean.dim, (g.call_function(aten.pow.Tensor_Scalar, (x, 2)), [-1], True))
    rstd = g.call_function(aten.rsqrt.default, (g.call_function(aten.add.Tensor, (var, 1e-6)),))
    g.output(rstd)
    assert saved_role(rstd, backward_graph(rstd.name, [aten.mul.Tensor])) == "norm"
    plain = g.call_function(aten.rsqrt.default, (x,))  # no mean behind it: an ordinary nonlinear input
    assert saved_role(plain, backward_graph(plain.name, [aten.mul.Tensor])) == "nonlinear_input"
