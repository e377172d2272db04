"""Rules: bad ones fail when they are built, not at the first forward, and the message lists what would fit."""

import pytest
import torch
import torch.nn as nn

from actzip.codecs.quant import QuantCodec
import actzip
from actzip.errors import ConfigError, UnknownCodecError
from actzip.memory.cache import CacheConfig, Rule, preset_rules
from actzip.memory.cache.roles import tracking


def always(t):
    return True


# -- rules naming a codec -----------------------------------------------------------------------------------


def test_unknown_codec_lists_the_available_ones():
    with pytest.raises(UnknownCodecError, match=r"rule 'acts': unknown codec 'qaunt'; available: .*quant.*sparse"):
        Rule("acts", always, "qaunt")
    with pytest.raises(UnknownCodecError, match=r"unknown codec 'qaunt'; available: .*quant"):
        CacheConfig(codec="qaunt")


@pytest.mark.parametrize(
    "codec,options,match",
    [
        ("quant", {"bits": 3}, r"rule 'acts': quant: option bits must be one of 1, 2, 4, 8, got 3"),
        ("quant", {"bits": 16}, r"bits must be one of 1, 2, 4, 8, got 16"),
        ("quant", {"bits": 1, "scale": "absmax"}, r"needs bits >= 2"),
        ("sketch", {"rank": 0}, r"rule 'acts': sketch: option rank must be an int >= 1, got 0"),
        ("sketch", {"rank": 2.5}, r"rank must be an int >= 1"),
        ("quant", {"bitz": 4}, r"codec 'quant' has no option\(s\) bitz; its options: bits, group_size, scale"),
        ("fp8", {"format": "e3m4"}, r"format must be one of 'e4m3', 'e5m2'"),
    ],
)
def test_out_of_range_options_fail_at_rule_construction(codec, options, match):
    with pytest.raises(ConfigError, match=match):
        Rule("acts", always, codec, codec_options=options)


def test_a_named_codec_is_built_with_its_options():
    rule = Rule("acts", always, "quant", codec_options={"bits": 2, "check": False})
    assert isinstance(rule.codec, QuantCodec) and rule.codec.bits == 2 and not rule.codec.check_values


def test_config_errors_at_cache_config_time():
    with pytest.raises(ConfigError, match=r"bits must be one of 1, 2, 4, 8, got 5"):
        CacheConfig(codec="quant", codec_options={"bits": 5}, allow_lossy=True)
    with pytest.raises(ConfigError, match=r"lossy; set allow_lossy=True"):
        CacheConfig(codec="quant")


# -- dtypes -------------------------------------------------------------------------------------------------


def test_a_codec_that_cannot_take_a_dtype_is_refused_with_the_alternatives():
    msg = (r"rule 'acts': codec 'quant' cannot take float8_e4m3fn; it takes float32, float16, bfloat16, float64; "
           r"codecs that take float8_e4m3fn: .*sparse")  # fmt: skip
    with pytest.raises(ConfigError, match=msg):
        Rule("acts", always, "quant", dtypes=(torch.bfloat16, torch.float8_e4m3fn))
    with pytest.raises(ConfigError, match=r"cannot take int64.*codecs that take int64: none"):
        Rule("ids", always, QuantCodec(), dtypes=[torch.int64])
    Rule("acts", always, "sparse", dtypes=[torch.float8_e4m3fn, torch.bfloat16])  # the sparse codec takes both
    Rule("ids", always, dtypes=(torch.int64,))  # keeping takes anything


@pytest.mark.parametrize("dtypes", [(), ("float32",), torch.float32])
def test_dtypes_must_be_torch_dtypes(dtypes):
    with pytest.raises(ConfigError, match="dtypes must be a non-empty sequence of torch dtypes"):
        Rule("acts", always, "quant", dtypes=dtypes)


def test_rules_only_match_what_their_codec_takes():
    # An embedding saves its int64 indices: the quant rule passes them on to the next rule instead of failing.
    model = nn.Sequential(nn.Embedding(50, 32), nn.Linear(32, 32))
    ids = torch.randint(0, 50, (64, 16))
    cache = actzip.cache(rules=[
        Rule("bf16 only", always, "quant", codec_options={"check": False}, dtypes=(torch.bfloat16,)),
        Rule("quant", always, "quant", codec_options={"check": False}),
        Rule("kept", always),
    ])  # fmt: skip
    with cache:
        model(ids).sum().backward()
    by_rule = cache.last.by_rule
    assert by_rule["kept"].tensors >= 1 and by_rule["quant"].tensors >= 1 and "bf16 only" not in by_rule


def test_other_bad_fields():
    with pytest.raises(ConfigError, match="when must be a function"):
        Rule("acts", "always", "quant")
    with pytest.raises(ConfigError, match="codec_options need a codec given by name"):
        Rule("acts", always, QuantCodec(), codec_options={"bits": 2})
    with pytest.raises(ConfigError, match=r"codec must be a codec name \(.*quant.*\), a Codec or None; got int"):
        Rule("acts", always, 4)
    with pytest.raises(ConfigError, match="needs_role must be True or False"):
        Rule("acts", always, needs_role="yes")


# -- presets ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "treatments,match",
    [
        ({"mlp": "kept"}, r"unknown role 'mlp' in treatments; roles: linear_input, nonlinear_input, relu_output"),
        ({"linear_input": "quant3-sr"}, r"bit width 3 is out of range; widths: 1, 2, 4, 8"),
        ({"linear_input": "quant16-rn"}, r"bit width 16 is out of range"),
        ({"linear_input": "quant4"}, r"write quant<bits>-<sr\|rn>; treatments: kept, sparse, quant<bits>"),
        ({"linear_input": "quantx-sr"}, r"write quant<bits>-<sr\|rn>"),
        ({"attention": "zip"}, r"unknown treatment 'zip' for role 'attention'; treatments: kept, sparse"),
        ({"attention": "kept+disk"}, r"unknown suffix '\+disk'"),
        ({"nonlinear_input": "quant4-sr"}, r"nonlinear inputs must keep at least 8 bits"),
        ({"norm": 8}, r"treatments are strings"),
    ],
)
def test_bad_treatments_fail_when_the_rules_are_built(treatments, match):
    with pytest.raises(ConfigError, match=match):
        preset_rules("balanced", treatments=treatments)
    with pytest.raises(ConfigError, match=match), actzip.cache("conservative", treatments=treatments):
        pytest.fail("the block must not be entered")
    assert not tracking()


def test_treatments_override_a_preset():
    names = [r.name for r in preset_rules("balanced", treatments={"attention": "quant8-rn", "norm": "sparse"})]
    assert "attention:quant8" in names and "norm:sparse" in names and "attention:kept" not in names
    # lossless by role: every role sparse when sparse enough, except the one overridden.
    names = [r.name for r in preset_rules("lossless", treatments={"linear_input": "quant4-sr"})]
    assert "linear_input:quant4" in names and "relu_output:sparse" in names and "attention:sparse" in names


def test_the_4bit_preset_lowers_the_nonlinear_floor_to_4_bits_only():
    preset_rules("4bit", treatments={"nonlinear_input": "quant4-sr"})  # its own floor
    with pytest.raises(ConfigError, match=r"at least 4 bits, got 'quant2-rn' \(only the 4bit preset opts out"):
        preset_rules("4bit", treatments={"nonlinear_input": "quant2-rn"})


def test_static_rules_decide_once_per_kind_of_tensor_and_others_every_time():
    import actzip
    from actzip.memory.cache.rules import Rule, is_leaf_storage

    def run(static: bool) -> int:
        calls = []
        rules = [Rule("leaf", is_leaf_storage, static=True),
                 Rule("kept", lambda t: calls.append(1) or True, static=static)]
        cache = actzip.cache(rules=rules)
        x = torch.randn(8, 8, requires_grad=True)
        for _ in range(3):
            with cache:
                (x * 2).sin().cos().sum().backward()  # sin and cos save their same-sized inputs
        assert cache.last.by_rule["kept"].tensors >= 2
        return len(calls)

    assert run(static=True) == 1
    assert run(static=False) >= 6
