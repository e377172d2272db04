"""The codec registry (:mod:`actzip.core.registry`): a spec string and keyword options build the same codec, for
every registered codec, and bad names or options are refused listing what would fit."""

import pytest

import actzip
from actzip.core import registry
from actzip.core.spec import format_spec
from actzip.errors import ConfigError, UnknownCodecError

# Options other than the defaults for every registered codec (a new codec must add its own here).
SPECS = {
    "cast": {"dtype": "float16", "check": False},
    "dct": {"bits": 1.5, "bands": 4, "axis": 0, "rounding": "nearest", "seed": 2},
    "fp8": {"format": "e5m2", "granularity": "group", "group_size": 64, "rounding": "stochastic", "seed": 3,
            "check": False, "kernel": "torch"},
    "mask": {"keep": 0.25, "mode": "topk", "rescale": True, "seed": 7, "check": False},
    "passthrough": {},
    "quant": {"bits": 2, "group_size": 64, "scale": "absmax", "rounding": "nearest", "seed": None, "check": False,
              "kernel": "torch"},
    "sketch": {"rank": 8, "seed": 5, "kind": "sign"},
    "sparse": {"tile_size": 1024, "sign_pack": True, "check": False, "kernel": "torch"},
}  # fmt: skip


def test_every_registered_codec_has_a_spec_case():
    assert sorted(SPECS) == registry.available()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_spec_string_equals_keyword_options(name):
    options = SPECS[name]
    spec = format_spec(name, options)
    by_spec, by_keywords = actzip.codecs.get(spec), actzip.codecs.get(name, **options)
    assert type(by_spec) is type(by_keywords) is registry.codec_class(name)
    assert by_spec.options() == by_keywords.options()
    for key, value in options.items():
        assert by_spec.options()[key] == value and type(by_spec.options()[key]) is type(value), key
    # Half in the spec, half as keywords: the same codec again.
    keys = sorted(options)
    half = format_spec(name, {k: options[k] for k in keys[::2]})
    assert actzip.codecs.get(half, **{k: options[k] for k in keys[1::2]}).options() == by_keywords.options()


def test_the_example_of_the_docs():
    a, b = actzip.codecs.get("quant:bits=4,group_size=128"), actzip.codecs.get("quant", bits=4, group_size=128)
    assert a.options() == b.options() and (a.bits, a.group_size) == (4, 128)
    assert actzip.codecs.get("QUANT:bits=4").bits == 4  # names are not case-sensitive


def test_an_option_in_the_spec_and_as_a_keyword_is_refused():
    with pytest.raises(ConfigError, match=r"option\(s\) bits given both in the spec and as keywords"):
        actzip.codecs.get("quant:bits=4", bits=4)


def test_unknown_codec_lists_the_codecs():
    with pytest.raises(UnknownCodecError, match=r"unknown codec 'qaunt'; available: cast, dct, fp8, mask, passthrough, quant"):
        actzip.codecs.get("qaunt:bits=4")


def test_unknown_option_lists_the_options():
    with pytest.raises(ConfigError, match=r"codec 'sparse' has no option\(s\) bits; its options: tile_size, sign_pack"):
        actzip.codecs.get("sparse:bits=4")
    with pytest.raises(ConfigError, match=r"codec 'passthrough' has no option\(s\) x; its options: \(none\)"):
        actzip.codecs.get("passthrough", x=1)


def test_a_required_option_left_out_is_named():
    with pytest.raises(ConfigError, match=r"codec 'sketch' needs option\(s\) rank, e.g. sketch:rank=\.\.\."):
        actzip.codecs.get("sketch")


def test_bad_values_are_the_codecs_own_errors():
    with pytest.raises(ConfigError, match=r"quant: option bits must be one of 1, 2, 4, 8, got 3"):
        actzip.codecs.get("quant:bits=3")
    with pytest.raises(ConfigError, match=r"quant: option bits must be one of 1, 2, 4, 8, got 4.0"):
        actzip.codecs.get("quant:bits=4.0")  # a float in the spec stays a float
