"""Where a compiled graph runs the cache's codecs: right after a saved tensor's last use in the forward graph,
right before its first use in the backward graph.

PyTorch inlines the cache's hooks at the end of the forward graph and the start of the backward graph
(:mod:`actzip.memory.cache.graph_hooks`): every saved tensor would live at full size until the forward ends, and
every decoded one from the start of the backward, so a compressed step would peak as high as an uncompressed
one. :func:`place_codec_ops` moves each ``actzip::encode_saved`` / ``actzip::note_kept`` node to just after the
last other use of its input, and each ``actzip::decode_saved`` node to just before its first user: the full
tensor is freed as soon as the forward is done with it, and made again only when the backward needs it.
:func:`install` runs it (:func:`pass_class`) as an inductor post-grad pass (chained after a pass of the user's own, if any); the
``aot_eager`` backend runs the graphs as they are.
"""

from __future__ import annotations

import operator
import threading

import torch
import torch.fx

from actzip.memory.cache.compiled_ops import register

__all__ = ["forget_install", "install", "pass_class", "place_codec_ops"]


def _targets():
    register()
    ops = torch.ops.actzip
    return {ops.encode_saved.default, ops.note_kept.default}, {ops.decode_saved.default}


def place_codec_ops(graph: torch.fx.Graph) -> int:
    """Move the cache's codec nodes of ``graph`` next to the uses of what they encode or decode (see the module
    docstring); returns how many were moved."""
    encoders, decoders = _targets()
    order = {n: i for i, n in enumerate(graph.nodes)}
    moved = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in encoders:
            x = node.args[0]
            others = [u for u in x.users if u is not node and u.op != "output" and u.target not in encoders]
            last = max(others, key=order.__getitem__, default=x)
            if order[last] < order[node] and last.next is not node:
                last.append(node)
                at = node
                for u in sorted(node.users, key=order.__getitem__):  # its buffers (getitem nodes) follow it
                    if u.op == "call_function" and u.target is operator.getitem:
                        at.append(u)
                        at = u
                moved += 1
        elif node.target in decoders and node.users:
            first = min(node.users, key=order.__getitem__)
            if node.next is not first:
                first.prepend(node)
                moved += 1
    moved += _place_hook_chains(graph)
    graph.lint()
    return moved


def _is_hook(node: torch.fx.Node) -> bool:
    return "_hook_" in node.name  # PyTorch names a saved node's packed values "<saved>_hook_<i>"


def _place_hook_chains(graph: torch.fx.Graph) -> int:
    """The packing and unpacking the graph does in its own operations (a quant payload): in a forward graph,
    the nodes that only feed packed outputs move to just after their inputs (a full tensor is then read for its
    payload as soon as it exists, not at the end); in a backward graph, the nodes that only read packed inputs
    move to just before their first user."""
    nodes = list(graph.nodes)
    pos = {n: float(i) for i, n in enumerate(nodes)}
    output = nodes[-1]
    moved = 0
    outs = output.args[0] if output.op == "output" and isinstance(output.args[0], (tuple, list)) else ()
    hooks_out = {a for a in outs if isinstance(a, torch.fx.Node) and _is_hook(a)}
    if hooks_out:  # forward: the nodes whose every use leads only to packed outputs
        chain: set[torch.fx.Node] = set()
        for n in reversed(nodes):
            if n.op != "call_function" or not n.users:
                continue
            users = set(n.users)
            if n in hooks_out and users <= {output} or (users - {output}) and users - {output} <= chain and (
                    output not in users or n in hooks_out):
                chain.add(n)
        for n in sorted(chain, key=pos.__getitem__):
            inputs = n.all_input_nodes
            if inputs:
                after = max(inputs, key=pos.__getitem__)
                if after.next is not n:
                    after.append(n)
                    moved += 1
                    # right after `after`, before what was moved there earlier
                    pos[n] = pos[after] + 1e-3 - moved * 1e-9
        return moved
    packed = {n for n in nodes if n.op == "placeholder" and _is_hook(n)}
    if packed:  # backward: the nodes that read only packed values, sunk to their first use
        chain = set()
        for n in nodes:
            if n.op == "call_function" and n.all_input_nodes and all(a in chain or a in packed
                                                                     for a in n.all_input_nodes):
                chain.add(n)
        for n in sorted(chain, key=pos.__getitem__, reverse=True):
            if n.users:
                first = min(n.users, key=pos.__getitem__)
                if n.next is not first:
                    first.prepend(n)
                    moved += 1
                    pos[n] = pos[first] - 1e-3 + moved * 1e-9  # right before `first`, after what came earlier
    return moved


_PASS_CLASS = None


def pass_class():
    """:class:`PlaceCodecOps`'s class, built on first use: inductor (and with it Triton) is imported only by a
    cache that is entered, never by ``import actzip``."""
    global _PASS_CLASS
    if _PASS_CLASS is None:
        from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

        class PlaceCodecOps(CustomGraphPass):
            """:func:`place_codec_ops` as an inductor post-grad pass, after ``then`` (a pass installed before)."""

            def __init__(self, then=None) -> None:
                self.then = then

            def __call__(self, graph: torch.fx.Graph) -> None:
                if self.then is not None:
                    self.then(graph)
                place_codec_ops(graph)

            def uuid(self):
                before = self.then.uuid() if hasattr(self.then, "uuid") else repr(self.then)
                return (get_hash_for_files((__file__,)), before)

        _PASS_CLASS = PlaceCodecOps
    return _PASS_CLASS


_lock = threading.Lock()
_installed = False  # the pass is in inductor's config (install)


def forget_install() -> None:
    """Forget that :func:`install` ran (it checks inductor's config again on the next call)."""
    global _installed
    _installed = False


def install() -> bool:
    """Run the pass (:func:`pass_class`) on every graph inductor compiles from now on (once per process); ``False``
    where this PyTorch has no custom post-grad passes."""
    global _installed
    if _installed:
        return True
    try:
        from torch._inductor import config

        cls = pass_class()
    except ImportError:  # pragma: no cover - a PyTorch without inductor's custom passes
        return False
    if not hasattr(config, "post_grad_custom_post_pass"):
        return False
    with _lock:
        current = config.post_grad_custom_post_pass
        if not isinstance(current, cls):
            config.post_grad_custom_post_pass = cls(current)
        _installed = True
    return True
