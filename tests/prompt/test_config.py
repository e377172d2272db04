"""PromptVectorConfig: every bad field is refused by name, the dict round trip, the top-level names."""

import math

import pytest

import actzip
from actzip.api import config_from_dict
from actzip.errors import ConfigError
from actzip.prompt import PromptVectorConfig


def test_defaults_and_a_dict_round_trip():
    config = PromptVectorConfig(extract_layer=3, inject_layer=1)
    assert (config.mode, config.over_layers, config.learn_scale, config.steps) == ("replace", 0, True, 200)
    assert config.slot_token_id is None and config.vector_path is None
    full = PromptVectorConfig(extract_layer=2, inject_layer=0, mode="add", over_layers=1, learn_scale=False,
                              steps=5, lr=0.5, seed=3, slot_token_id=7, vector_path="v.safetensors")
    for c in (config, full):
        assert config_from_dict(c.to_dict()) == c


@pytest.mark.parametrize("fields, field", [
    (dict(extract_layer=-1), "extract_layer"),
    (dict(extract_layer=1.0), "extract_layer"),
    (dict(inject_layer=True), "inject_layer"),
    (dict(mode="multiply"), "mode"),
    (dict(over_layers=-2), "over_layers"),
    (dict(learn_scale=1), "learn_scale"),
    (dict(steps=-1), "steps"),
    (dict(lr=0), "lr"),
    (dict(lr=math.nan), "lr"),
    (dict(seed=-1), "seed"),
    (dict(slot_token_id=-3), "slot_token_id"),
    (dict(vector_path=""), "vector_path"),
    (dict(vector_path=3), "vector_path"),
])
def test_bad_fields_name_the_field(fields, field):
    with pytest.raises(ConfigError, match=f"PromptVectorConfig.{field}"):
        PromptVectorConfig(**{"extract_layer": 1, "inject_layer": 0, **fields})


def test_layers_are_required_and_bounded_only_by_a_model():
    with pytest.raises(TypeError):
        PromptVectorConfig()
    PromptVectorConfig(extract_layer=1000, inject_layer=999)  # no model yet: any index >= 0


def test_top_level_names():
    assert actzip.PromptVectorConfig is PromptVectorConfig and "PromptVectorConfig" in actzip.__all__
    assert actzip.prompt.PromptVector.__name__ == "PromptVector"
    assert issubclass(actzip.PromptVectorMismatchError, actzip.ConfigError)
