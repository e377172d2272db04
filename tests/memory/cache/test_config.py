"""CacheConfig: a preset and its options, checked when made, and a dict round trip."""

import json

import pytest

import actzip
from actzip.api import config_from_dict
from actzip.errors import ConfigError
from actzip.memory.cache import CacheConfig, OffloadConfig, preset_names, register_preset
from actzip.memory.cache.presets import PRESETS


def test_every_preset_is_registered():
    assert preset_names() == tuple(PRESETS)
    for name in PRESETS:
        assert CacheConfig(preset=name).build_rules()


@pytest.mark.parametrize(
    "config",
    [
        CacheConfig(),
        CacheConfig(preset="4bit", min_bytes=0, seed=7, group_size=64, treatments={"loss": "quant8-rn"}),
        CacheConfig(preset="balanced", offload=OffloadConfig(prefetch=2), dedup=False, track_roles=True),
        CacheConfig(codec="sparse", codec_options={"tile_size": 4096}, recheck_every=0),
    ],
)
def test_dict_round_trip(config):
    data = json.loads(json.dumps(config.to_dict()))  # plain JSON values
    assert data["type"] == "CacheConfig"
    assert CacheConfig.from_dict(data) == config == config_from_dict(data)
    assert [r.name for r in actzip.cache(CacheConfig.from_dict(data)).rules] == [r.name for r in config.build_rules()]


@pytest.mark.parametrize(
    "options,match",
    [
        ({"preset": "fast"}, r"unknown activation cache preset 'fast'; presets: lossless, conservative"),
        ({"min_bytes": -1}, r"CacheConfig.min_bytes must be an int >= 0, got -1"),
        ({"min_zero_fraction": 1.5}, r"CacheConfig.min_zero_fraction must be in \[0, 1\]"),
        ({"recheck_every": 2.0}, r"CacheConfig.recheck_every must be an int >= 0"),
        ({"group_size": 0}, r"CacheConfig.group_size must be an int >= 1, got 0"),
        ({"seed": "0"}, r"CacheConfig.seed must be None or an int"),
        ({"treatments": ["kept"]}, r"CacheConfig.treatments must be a dict"),
        ({"preset": "balanced", "treatments": {"linear_input": "quant3-sr"}}, r"bit width 3 is out of range"),
        ({"offload": "cpu"}, r"CacheConfig.offload must be True, False or an OffloadConfig"),
        ({"dedup": 1}, r"CacheConfig.dedup must be True or False"),
        ({"track_roles": "auto"}, r"CacheConfig.track_roles must be None, True or False"),
        ({"codec": "quant"}, r"lossy; set allow_lossy=True"),
        ({"preset": "4bit", "codec_options": {"tile_size": 4096}}, r"CacheConfig.codec is the lossless preset's"),
    ],
)
def test_bad_fields_fail_when_the_config_is_made(options, match):
    with pytest.raises(ConfigError, match=match):
        CacheConfig(**options)


def test_a_lossy_codec_with_allow_lossy_and_a_bad_dict():
    assert CacheConfig(codec="quant", codec_options={"bits": 8}, allow_lossy=True).build_codec().bits == 8
    with pytest.raises(ConfigError, match=r"CacheConfig has no field\(s\) bits"):
        CacheConfig.from_dict({"type": "CacheConfig", "version": 1, "bits": 4})


def test_a_preset_name_is_registered_once():
    with pytest.raises(ConfigError, match="cache preset '4bit' is already registered"):
        register_preset("4bit", lambda config: [])
    with pytest.raises(ConfigError, match="needs a non-empty name"):
        register_preset("", lambda config: [])
