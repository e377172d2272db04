import pytest
import torch

from actzip.codecs.rvq import RVQConfig
from actzip.errors import ActzipError, ConfigError
from actzip.wire.boundaries import (
    BottleneckConfig,
    DenseConfig,
    StiefelConfig,
    SubspaceConfig,
    boundary_config,
    code_width,
    confine_to_subspace,
    id_bytes,
    make_boundary,
    parse_boundary,
    parse_boundary_options,
    subspace_tensors,
)
from actzip.wire.stiefel import orthonormality_error

D, B, T, V = 32, 2, 8, 256


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see tests/conftest.py


def _x():
    return torch.randn(B, T, D)


def _ids():
    return torch.randint(0, V, (B, T))


def test_code_width_from_ratio():
    # d = 768, float32: 100x leaves 30.72 bytes per token.
    assert code_width(768, 100) == 7  # 28 bytes: ratio 110
    assert code_width(768, 100, side_bytes=2) == 7  # 28 + 2 bytes of ids: ratio 102
    assert code_width(768, 100, code_dtype=torch.bfloat16) == 15
    assert code_width(768, 1) == 768
    assert code_width(64, 1000) == 1  # never below one value
    for ratio in (4, 16, 50, 100, 128):
        k = code_width(768, ratio, side_bytes=2)
        assert 768 * 4 / (4 * k + 2) >= ratio
    with pytest.raises(ConfigError, match="ratio"):
        code_width(768, 0.5)


def test_id_bytes():
    assert (id_bytes(256), id_bytes(257), id_bytes(50304), id_bytes(70000)) == (1, 2, 2, 4)


def test_nominal_bytes_per_token():
    assert DenseConfig(n_embd=D).nominal_bytes_per_token() == {"fwd": 4 * D, "bwd": 4 * D}
    sub = SubspaceConfig(n_embd=D, width=3, vocab_size=V)
    assert sub.nominal_bytes_per_token() == {"fwd": 13.0, "bwd": 12.0}
    half = BottleneckConfig(n_embd=D, width=4, code_dtype=torch.bfloat16)
    assert half.nominal_bytes_per_token() == {"fwd": 8.0, "bwd": 8.0}
    rvq = StiefelConfig(n_embd=D, width=4, vocab_size=V, rvq=RVQConfig(dim=4, levels=3))
    assert rvq.nominal_bytes_per_token() == {"fwd": 4.0, "bwd": 16.0}


@pytest.mark.parametrize(
    "make",
    [
        lambda: SubspaceConfig(n_embd=D, width=D + 1),
        lambda: BottleneckConfig(n_embd=D, width=0),
        lambda: StiefelConfig(n_embd=D, width=4, retraction="svd"),
        lambda: StiefelConfig(n_embd=D, width=4, rvq=RVQConfig(dim=5)),
        lambda: SubspaceConfig(n_embd=D, width=4, code_dtype=torch.int8),
    ],
)
def test_configs_reject_bad_values(make):
    with pytest.raises(ConfigError):
        make()


def test_subspace_code_is_exact_for_vectors_in_the_subspace():
    cfg = SubspaceConfig(n_embd=D, width=4, vocab_size=V, block_size=T)
    sender, receiver = make_boundary(cfg)
    U, tok, pos = subspace_tensors(cfg)
    assert orthonormality_error(U) < 1e-6
    assert torch.linalg.matrix_rank(tok) == D  # the fixed embedding is full rank
    ids = _ids()
    x = tok[ids] + pos[:T] + torch.randn(B, T, 4) @ U.t()
    msg = sender(x, ids)
    assert msg["code"].shape == (B, T, 4) and msg["ids"].dtype == torch.uint8
    rebuilt, got_ids = receiver(msg)
    assert torch.equal(got_ids, ids)
    assert torch.allclose(rebuilt, x, atol=1e-6)
    # With a zero code the receiver still rebuilds the full-rank embedding from the ids alone.
    zero = dict(msg, code=torch.zeros_like(msg["code"]))
    assert torch.allclose(receiver(zero)[0], tok[ids] + pos[:T])


def test_bottleneck_starts_as_its_identity_path():
    sender, receiver = make_boundary(BottleneckConfig(n_embd=D, width=5))
    x = _x()
    msg = sender(x)
    assert set(msg) == {"code", "cfg"}
    assert torch.equal(msg["code"], x[..., :5])
    out, ids = receiver(msg)
    assert ids is None
    assert torch.equal(out[..., :5], x[..., :5]) and not out[..., 5:].any()


def test_stiefel_anchor_lives_outside_the_code_span():
    cfg = StiefelConfig(n_embd=D, width=4, vocab_size=V, block_size=T, anchor_rank=3)
    sender, receiver = make_boundary(cfg)
    x, ids = _x(), _ids()
    msg = sender(x, ids)
    out, _ = receiver(msg)
    assert torch.allclose(out @ receiver.V, msg["code"], atol=1e-5)
    assert torch.allclose(msg["code"], x @ sender.V)


def test_code_gradient_has_the_code_size_and_dtype():
    sender, receiver = make_boundary(StiefelConfig(n_embd=D, width=3, vocab_size=V, code_dtype=torch.bfloat16))
    x = _x().requires_grad_()
    msg = sender(x, _ids())
    assert msg["code"].dtype == torch.bfloat16
    leaf = msg["code"].detach().requires_grad_()
    out, _ = receiver(dict(msg, code=leaf))
    out.square().sum().backward()
    assert leaf.grad.shape == (B, T, 3) and leaf.grad.dtype == torch.bfloat16


def _message(cfg, ids=True):
    sender, _ = make_boundary(cfg)
    return sender(_x(), _ids() if ids else None)


@pytest.mark.parametrize(
    "sent,expected,match",
    [
        (SubspaceConfig(n_embd=D, width=4, seed=1), SubspaceConfig(n_embd=D, width=4, seed=2), r"\['seed'\]"),
        (SubspaceConfig(n_embd=D, width=4), SubspaceConfig(n_embd=D, width=5), r"\['width'\]"),
        (BottleneckConfig(n_embd=D, width=4), SubspaceConfig(n_embd=D, width=4), "'bottleneck'.*'subspace'"),
        (
            StiefelConfig(n_embd=D, width=4, rvq=RVQConfig(dim=4, levels=2)),
            StiefelConfig(n_embd=D, width=4, rvq=RVQConfig(dim=4, levels=3)),
            r"rvq.levels",
        ),
        (DenseConfig(n_embd=D), BottleneckConfig(n_embd=D, width=4), "tensor"),
        (BottleneckConfig(n_embd=D, width=4), DenseConfig(n_embd=D), "activation of shape"),
    ],
)
def test_mismatched_ends_raise_a_clear_config_error(sent, expected, match):
    msg = _message(sent)
    _, receiver = make_boundary(expected)
    with pytest.raises(ConfigError, match=match) as info:
        receiver(receiver.wire_decode(msg))
    assert isinstance(info.value, ActzipError)


def test_local_fields_may_differ_between_ends():
    a = StiefelConfig(n_embd=D, width=4, vocab_size=V, lr=1e-3)
    b = StiefelConfig(n_embd=D, width=4, vocab_size=V, lr=5e-2, retraction="polar")
    sender, _ = make_boundary(a)
    _, receiver = make_boundary(b)
    out, _ = receiver(sender(_x(), _ids()))
    assert out.shape == (B, T, D)


def test_senders_that_need_ids_say_so():
    for cfg in (SubspaceConfig(n_embd=D, width=4), StiefelConfig(n_embd=D, width=4)):
        sender, _ = make_boundary(cfg)
        with pytest.raises(ConfigError, match="token ids"):
            sender(_x(), None)


def test_boundary_specs_parse_with_the_codec_grammar_and_a_ratio_shorthand():
    assert parse_boundary("stiefel:16") == ("stiefel", {"ratio": 16})
    assert parse_boundary("stiefel:ratio=16,anchor_rank=8,code_dtype=bfloat16,tie=true") == (
        "stiefel", {"ratio": 16, "anchor_rank": 8, "code_dtype": torch.bfloat16, "tie": True})
    assert parse_boundary("dense") == ("dense", {})
    assert parse_boundary_options("anchor_rank=256, lr=1e-4,code_dtype=bfloat16,retraction=polar") == {
        "anchor_rank": 256, "lr": 1e-4, "code_dtype": torch.bfloat16, "retraction": "polar"}
    assert parse_boundary_options("") == {}
    with pytest.raises(ConfigError, match="name=value"):
        parse_boundary_options("anchor_rank")
    with pytest.raises(ConfigError, match="boundary 'zip'.*unknown"):
        parse_boundary("zip:4")
    with pytest.raises(ConfigError, match="twice"):
        parse_boundary("stiefel:16,ratio=4")


def test_boundary_config_maps_ratio_to_width():
    small = {"n_embd": 256, "vocab_size": 256, "block_size": 128}
    assert boundary_config("subspace:100", **small).width == 2  # 10.24 bytes - 1 byte of ids
    assert boundary_config("subspace", ratio=100, **small).width == 2
    assert boundary_config("bottleneck:16", **small).width == 16
    rvq = boundary_config("stiefel-rvq:100", **small).rvq
    assert (rvq.dim, rvq.levels, rvq.codebook_size) == (16, 9, 256)
    assert boundary_config("stiefel:16,anchor_rank=0", **small).width == 16
    over = boundary_config("stiefel-rvq:100", width=8, rvq_levels=4, **small)
    assert (over.width, over.rvq.dim, over.rvq.levels) == (8, 8, 4)
    assert boundary_config("dense", **small).name == "dense" and over.name == "stiefel-rvq"
    with pytest.raises(ConfigError, match="ratio"):
        boundary_config("bottleneck:0.5", **small)
    with pytest.raises(ConfigError, match="anchors"):
        boundary_config("stiefel:16,anchors=4", **small)
    with pytest.raises(ConfigError, match="stiefel-rvq"):
        boundary_config("stiefel:16,rvq_levels=2", **small)
    with pytest.raises(ConfigError, match="rvq_levels"):
        boundary_config("stiefel-rvq:16,rvq_level=2", **small)
    with pytest.raises(ConfigError, match="ratio is given both"):
        boundary_config("stiefel:16", ratio=4, **small)


def test_confine_to_subspace_keeps_a_module_output_in_span_u():
    cfg = SubspaceConfig(n_embd=D, width=4)
    U, _, _ = subspace_tensors(cfg)
    body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, D))
    confine_to_subspace(body, U, ["2"])
    out = body(torch.randn(3, 8))
    assert torch.allclose(out, (out @ U) @ U.t(), atol=1e-6)
    with pytest.raises(ConfigError, match="out_features"):
        confine_to_subspace(body, U, ["0"])
    with pytest.raises(ConfigError, match="no module 'head'"):
        confine_to_subspace(body, U, ["head"])


def test_resbm_style_bottleneck_ends_and_their_sublayers():
    from torch import nn

    from actzip.wire.boundaries import adopt_sublayer

    sender, receiver = make_boundary(boundary_config("bottleneck:8", n_embd=32, style="resbm"))
    x = torch.randn(2, 5, 32)
    msg = sender(x)
    assert msg["code"].shape == (2, 5, 4)
    rebuilt, _ = receiver(msg)
    # the identity path: the code's first b features pass straight into the rebuilt activation's first b
    with torch.no_grad():
        receiver.sublayer[-1].weight.zero_()
        receiver.sublayer[-1].bias.zero_()
    assert torch.equal(receiver(msg)[0][..., :4], msg["code"])
    assert not receiver(msg)[0][..., 4:].any()
    adopt_sublayer(sender, nn.Identity())
    assert isinstance(sender.sublayer, nn.Identity)
    plain, _ = make_boundary(boundary_config("bottleneck:8", n_embd=32))
    with pytest.raises(ConfigError, match="style='resbm'"):
        adopt_sublayer(plain, nn.Identity())
    with pytest.raises(ConfigError, match="nn.Module"):
        adopt_sublayer(sender, lambda t: t)
