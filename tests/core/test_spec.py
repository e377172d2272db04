"""The codec spec grammar (:mod:`actzip.core.spec`): values, round trips, and a clear error for every bad spec."""

import math

import pytest

from actzip.core.spec import format_spec, parse_spec, parse_value
from actzip.errors import ConfigError


@pytest.mark.parametrize("text,value", [
    ("4", 4), ("-3", -3), ("0.5", 0.5), ("1e-4", 1e-4), ("true", True), ("False", False), ("none", None),
    ("NONE", None), ("e4m3", "e4m3"), ("minmax", "minmax"), ("0x10", "0x10"),
])  # fmt: skip
def test_values_parse_to_their_type(text, value):
    got = parse_value(text)
    assert got == value and type(got) is type(value)


def test_a_spec_is_a_lower_case_name_and_ordered_options():
    assert parse_spec("quant") == ("quant", {})
    assert parse_spec(" Quant : bits = 4 , group_size=128 ") == ("quant", {"bits": 4, "group_size": 128})
    assert list(parse_spec("fp8:granularity=group,format=e5m2")[1]) == ["granularity", "format"]
    assert parse_spec("quant:") == ("quant", {}) and parse_spec("quant:bits=4,") == ("quant", {"bits": 4})


@pytest.mark.parametrize("spec", [
    "quant:bits=4,group_size=128",
    "quant:scale=absmax,rounding=nearest,seed=none,check=false,kernel=torch,bits=2",
    "fp8:format=e5m2,granularity=group,group_size=64",
    "mask:keep=0.25,mode=topk,rescale=true",
    "sketch:rank=16,kind=sign,seed=3",
    "sparse:tile_size=1024,sign_pack=true",
    "passthrough",
    "quant:lr=1e-05,x=inf",
])  # fmt: skip
def test_format_of_parse_round_trips(spec):
    name, options = parse_spec(spec)
    text = format_spec(name, options)
    assert parse_spec(text) == (name, options)
    assert format_spec(*parse_spec(text)) == text  # a fixed point: sorted options, canonical values
    assert list(parse_spec(text)[1]) == sorted(options)


def test_parse_of_format_round_trips_python_values():
    options = {"bits": 4, "keep": 0.1, "big": 1e300, "tiny": 5e-324, "neg": -2, "flag": True, "off": False,
               "seed": None, "format": "e4m3"}  # fmt: skip
    assert parse_spec(format_spec("quant", options)) == ("quant", options)
    name, back = parse_spec(format_spec("quant", {"x": math.nan}))
    assert math.isnan(back["x"])


@pytest.mark.parametrize("spec,match", [
    ("", "no codec name"),
    (":bits=4", "no codec name"),
    ("quant:bits", r"option 'bits' must look like name=value"),
    ("quant:=4", r"option '=4' must look like name=value"),
    ("quant:bits=", r"option 'bits' has no value"),
    ("quant:bits=4,bits=8", r"option 'bits' is given twice"),
    ("quant:bits=4, bits = 4", r"option 'bits' is given twice"),
])  # fmt: skip
def test_bad_specs_are_refused_naming_the_problem(spec, match):
    with pytest.raises(ConfigError, match=match):
        parse_spec(spec)


@pytest.mark.parametrize("bad", [None, 4, b"quant", ("quant",)])
def test_a_spec_must_be_a_string(bad):
    with pytest.raises(ConfigError, match="codec spec must be a string"):
        parse_spec(bad)


@pytest.mark.parametrize("name,options,match", [
    ("quant", {"scale": "4"}, r"option scale='4' cannot be written in a spec \(it would read back as 4\)"),
    ("quant", {"scale": "true"}, r"read back as True"),
    ("quant", {"scale": "none"}, r"read back as None"),
    ("quant", {"scale": "a,b"}, r"option scale='a,b' cannot be written"),
    ("quant", {"scale": "a=b"}, r"cannot be written"),
    ("quant", {"scale": " a"}, r"cannot be written"),
    ("quant", {"scale": ""}, r"cannot be written"),
    ("quant", {"shape": (1, 2)}, r"cannot be written"),
    ("quant", {"bad key": 1, "a,b": 2}, r"'a,b' is not an option name"),
    ("quant:bits=4", {}, r"is not a codec name"),
    ("", {}, r"is not a codec name"),
])  # fmt: skip
def test_format_refuses_what_would_not_read_back(name, options, match):
    with pytest.raises(ConfigError, match=match):
        format_spec(name, options)
