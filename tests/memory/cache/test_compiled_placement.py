"""The codec nodes of a compiled graph move next to the uses of what they encode or decode."""

import torch
import torch.fx

from actzip.codecs import get
from actzip.memory.cache import compiled_ops

compiled_ops.register()
from actzip.memory.cache import compiled_placement
from actzip.memory.cache.compiled_placement import install, pass_class, place_codec_ops

aten = torch.ops.aten


def names(graph):
    return [n.name for n in graph.nodes]


def test_an_encoder_follows_the_last_use_and_a_decoder_precedes_the_first():
    key = compiled_ops.codec_key(get("quant", check=False))
    g = torch.fx.Graph()
    x = g.placeholder("x")
    h = g.call_function(aten.relu.default, (x,), name="h")
    used = g.call_function(aten.mul.Tensor, (h, 2.0), name="used")
    later = g.call_function(aten.exp.default, (used,), name="later")
    enc = g.call_function(torch.ops.actzip.encode_saved.default, (h, key, "r"), name="enc")
    g.output((later, enc))
    assert place_codec_ops(g) == 1
    order = names(g)
    assert order.index("enc") == order.index("used") + 1 < order.index("later")

    b = torch.fx.Graph()
    codes, lo, span = (b.placeholder(n) for n in ("codes", "lo", "span"))
    tangent = b.placeholder("tangent")
    early = b.call_function(aten.neg.default, (tangent,), name="early")
    dec = b.call_function(torch.ops.actzip.decode_saved.default, ([codes, lo, span], key, [4, 4], [4, 1],
                                                                  torch.float32), name="dec")
    early.prepend(dec)  # as inlined: the decoder first, before the work that does not need it
    use = b.call_function(aten.mul.Tensor, (early, dec), name="use")
    b.output((use,))
    assert names(b).index("dec") < names(b).index("early")
    assert place_codec_ops(b) == 1
    assert names(b).index("dec") == names(b).index("use") - 1 > names(b).index("early")
    assert place_codec_ops(b) == 0  # in place already


def test_install_chains_a_pass_of_ones_own_once():
    from torch._inductor import config

    calls = []
    before = config.post_grad_custom_post_pass
    try:
        config.post_grad_custom_post_pass = None
        config.post_grad_custom_post_pass = lambda graph: calls.append(graph)
        compiled_placement.forget_install()  # as in a fresh process
        assert install() and install()
        chained = config.post_grad_custom_post_pass
        assert isinstance(chained, pass_class()) and chained.then is not None
        g = torch.fx.Graph()
        g.output(g.placeholder("x"))
        chained(g)
        assert calls == [g] and chained.uuid()
    finally:
        config.post_grad_custom_post_pass = before
        compiled_placement.forget_install()
