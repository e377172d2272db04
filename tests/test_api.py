"""actzip.api: configs to and from dicts, dispatch, the module walker, and restore_ undoing compress_ in order."""

import copy

import pytest
import torch
import torch.nn as nn

import actzip
from actzip.api import CompressReport, Config, config_from_dict, replace_module
from actzip.errors import ConfigError, NothingToCompressError, NothingToRestoreError, UnknownConfigError
from actzip.memory.modules import (
    Fp8Linear,
    Fp8LinearConfig,
    SketchedLinearConfig,
    SparseMLPConfig,
    SparseReLUMLP,
    compress_,
    restore_,
)
from actzip_bench.models import GPT, GPTConfig


def tiny_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=64))


CONFIGS = [
    SparseMLPConfig(),
    SparseMLPConfig(codec_options={"sign_pack": True, "check": False, "tile_size": 256}, trust_structure=True,
                    arena="auto"),
    Fp8LinearConfig(),
    Fp8LinearConfig(fast_accum_forward=False, pow2_scales=True, recast_input=True),
    SketchedLinearConfig(),
    SketchedLinearConfig(rank=3, kind="gaussian", seed=None, factored_grad=True),
    SketchedLinearConfig(rank_ratio=0.25, seed=7),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).__name__)
def test_every_config_round_trips_through_a_dict(config):
    data = config.to_dict()
    assert data["type"] == type(config).__name__ and data["version"] == type(config).VERSION
    assert config_from_dict(data) == config
    assert type(config).from_dict(data) == config
    with pytest.raises(ConfigError, match="the dict holds a"):
        (Fp8LinearConfig if not isinstance(config, Fp8LinearConfig) else SparseMLPConfig).from_dict(data)


@pytest.mark.parametrize("build,field", [
    (lambda: SparseMLPConfig(codec_options={"bits": 2}), "no option"),
    (lambda: SparseMLPConfig(codec_options=[1]), "codec_options"),
    (lambda: SparseMLPConfig(trust_structure=1), "trust_structure"),
    (lambda: SparseMLPConfig(arena=3), "arena"),
    (lambda: Fp8LinearConfig(recast_input=None), "recast_input"),
    (lambda: SketchedLinearConfig(rank=0), "rank"),
    (lambda: SketchedLinearConfig(rank_ratio=-1), "rank_ratio"),
    (lambda: SketchedLinearConfig(kind="hadamard"), "kind"),
    (lambda: SketchedLinearConfig(seed=-1), "seed"),
    (lambda: SketchedLinearConfig(factored_grad="no"), "factored_grad"),
])
def test_bad_fields_name_the_field(build, field):
    with pytest.raises(ConfigError, match=field):
        build()


def test_bad_dicts():
    with pytest.raises(UnknownConfigError, match="config type 'NoSuchConfig' is unknown"):
        config_from_dict({"type": "NoSuchConfig"})
    with pytest.raises(ConfigError, match="needs a 'type' key"):
        config_from_dict({"rank": 3})
    with pytest.raises(ConfigError, match="has no field"):
        config_from_dict({"type": "SketchedLinearConfig", "version": 1, "rnak": 3})
    with pytest.raises(ConfigError, match="version 99"):
        config_from_dict({"type": "Fp8LinearConfig", "version": 99})


def test_unknown_config_type():
    with pytest.raises(UnknownConfigError, match="no handler for config type dict; known: .*SparseMLPConfig"):
        compress_(tiny_gpt(), {"type": "SparseMLPConfig"})

    class Unregistered(Config):
        pass

    with pytest.raises(UnknownConfigError, match="Unregistered"):
        compress_(tiny_gpt(), Unregistered())
    with pytest.raises(ConfigError, match="model must be an nn.Module"):
        compress_("model", Fp8LinearConfig())
    with pytest.raises(ConfigError, match="filter_fn must be callable"):
        compress_(tiny_gpt(), Fp8LinearConfig(), filter_fn="h.0")


@pytest.mark.parametrize("config", [SparseMLPConfig(), Fp8LinearConfig(), SketchedLinearConfig()],
                         ids=lambda c: type(c).__name__)
def test_a_filter_matching_nothing_changes_nothing(config):
    model = tiny_gpt()
    before = copy.deepcopy(model)
    with pytest.raises(NothingToCompressError, match="filter_fn excluded every candidate"):
        compress_(model, config, filter_fn=lambda module, fqn: False)
    assert [type(m) for m in model.modules()] == [type(m) for m in before.modules()]
    assert not model.__dict__.get("actzip_applied")


@pytest.mark.parametrize("config,why", [
    (SparseMLPConfig(), "nothing to swap"),
    (Fp8LinearConfig(), "no module of a kind it takes"),
    (SketchedLinearConfig(), "no module of a kind it takes"),
])
def test_a_model_with_nothing_to_compress(config, why):
    with pytest.raises(NothingToCompressError, match=why):
        compress_(nn.Sequential(nn.ReLU(), nn.LayerNorm(4)), config)


def test_restore_on_an_untouched_model():
    with pytest.raises(NothingToRestoreError, match="has nothing to restore"):
        restore_(tiny_gpt())
    model = tiny_gpt()
    compress_(model, Fp8LinearConfig())
    restore_(model)
    with pytest.raises(NothingToRestoreError):  # once restored, nothing is left to undo
        restore_(model)


def test_nested_compress_is_restored_newest_first():
    model = tiny_gpt()
    ref = copy.deepcopy(model)
    originals = {n: m for n, m in model.named_modules()}
    compress_(model, SparseMLPConfig())
    report = compress_(model, Fp8LinearConfig(), filter_fn=lambda m, fqn: ".mlp." in fqn)
    assert isinstance(report, CompressReport) and "Fp8Linear" in str(report)
    assert isinstance(model.h[0].mlp, SparseReLUMLP) and isinstance(model.h[0].mlp.c_fc, Fp8Linear)
    assert type(model.h[0].attn.c_attn) is nn.Linear
    assert restore_(model) == ["Fp8LinearConfig", "SparseMLPConfig"]
    assert {n: m for n, m in model.named_modules()}.keys() == originals.keys()
    assert all(m is originals[n] for n, m in model.named_modules())  # the very modules compress_ replaced
    assert model.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in model.state_dict().items())
    idx = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], ref(idx)[0])


def test_the_other_order_is_restored_too():
    model = tiny_gpt()
    originals = {n: m for n, m in model.named_modules()}
    compress_(model, Fp8LinearConfig(), filter_fn=lambda m, fqn: ".mlp." in fqn)
    compress_(model, SparseMLPConfig())
    assert isinstance(model.h[0].mlp.c_fc, Fp8Linear)
    assert restore_(model) == ["SparseMLPConfig", "Fp8LinearConfig"]
    assert all(m is originals[n] for n, m in model.named_modules())


def test_a_failing_handler_leaves_the_model_as_it_was():
    from dataclasses import dataclass

    from actzip.api import register_handler, walk

    @dataclass
    class SwapThenFail(Config):
        pass

    @register_handler(SwapThenFail)
    def swap_then_fail(model, config, filter_fn, report):
        for fqn, _ in walk(model, lambda m, fqn: isinstance(m, nn.Linear), filter_fn, report):
            replace_module(model, fqn, nn.Identity(), report)
        raise ConfigError("SwapThenFail: fails after swapping")

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    layers = list(model)
    with pytest.raises(ConfigError, match="fails after swapping"):
        compress_(model, SwapThenFail())
    assert list(model) == layers and not model.__dict__.get("actzip_applied")
    with pytest.raises(NothingToCompressError, match="the model itself is an nn.Linear"):
        compress_(model[0], Fp8LinearConfig())
    with pytest.raises(ConfigError, match="called inside compress_"):
        replace_module(model, "0", nn.Linear(16, 16), CompressReport())


def test_a_config_subclass_uses_its_base_handler():
    class Mine(Fp8LinearConfig):
        pass

    model = nn.Sequential(nn.Linear(16, 16))
    assert compress_(model, Mine()).swapped == [("0", "Fp8Linear")]


def test_top_level_names():
    for name in ("compress_", "restore_", "CompressReport", "SparseMLPConfig", "Fp8LinearConfig",
                 "SketchedLinearConfig"):
        assert getattr(actzip, name) is getattr(actzip.memory, name)
