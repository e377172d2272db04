"""LoRAConfig: every field checked at construction, errors naming the option, a dict round trip."""

import pytest

from actzip.errors import ConfigError
from actzip.memory.lora import LoRAConfig

@pytest.mark.parametrize("kw,match", [({"method": "qlora"}, "qlora"), ({"lam": 0}, "lam"),
                                      ({"lam": float("inf")}, "lam"), ({"fit_chunk_rows": 0}, "fit_chunk_rows"),
                                      ({"extra_rank": -1}, "extra_rank"), ({"method": "fa", "extra_rank": 2}, "'fa'"),
                                      ({"dropout_mask": "keep"}, "dropout_mask"),
                                      ({"fit_group_rows": -1}, "fit_group_rows"),
                                      ({"method": "lora", "fit_group_rows": 8}, "'lora'"),
                                      ({"power_iters": -1}, "power_iters"), ({"power_iters": 1}, "extra_rank")])
def test_config_errors_name_the_option(kw, match):
    with pytest.raises(ConfigError, match=match):
        LoRAConfig(**kw)


def test_defaults_and_dict_round_trip():
    cfg = LoRAConfig(method="care", lam=1e-4, extra_rank=8, power_iters=1, fit_group_rows=64, dropout_mask="bool",
                     use_attention_mask=False)
    data = cfg.to_dict()
    assert data["type"] == "LoRAConfig" and data["extra_rank"] == 8
    assert LoRAConfig.from_dict(data) == cfg
    assert LoRAConfig() == LoRAConfig(method="care", lam=1e-6, fit_chunk_rows=4096, dropout_mask="bitmask",
                                      use_attention_mask=True)


def test_use_attention_mask_must_be_a_bool():
    with pytest.raises(ConfigError, match="use_attention_mask"):
        LoRAConfig(use_attention_mask="yes")
