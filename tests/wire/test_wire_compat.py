"""The wire's old names keep working for one release, each warning once; and the docstring examples run."""

import doctest
import importlib
import warnings

import pytest
import torch
from torch import nn

from actzip import compat
from actzip.errors import ConfigError


def _fresh(*old: str) -> None:
    for name in old:
        compat.warned.discard(name)


def _warns_once(fn, match: str):
    with pytest.warns(FutureWarning, match=match):
        first = fn()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn()
    return first


def test_renamed_classes_warn_once_and_are_the_new_ones():
    import actzip.wire as wire

    _fresh("actzip.wire.SimulatedPipeline", "actzip.wire.BoundaryCodec")
    stages = [nn.Sequential(nn.Embedding(8, 4)), nn.Linear(4, 8)]
    pipe = _warns_once(lambda: wire.SimulatedPipeline(stages, wire.PipelineConfig(microbatches=1)),
                       "SimulatedPipeline is deprecated.*actzip.wire.Pipeline")
    assert isinstance(pipe, wire.Pipeline)
    x = torch.randint(0, 8, (2, 3))
    assert pipe.train_step(x, x) > 0
    codec = _warns_once(lambda: wire.BoundaryCodec("quant:bits=4"), "BoundaryCodec is deprecated.*WireCodec")
    assert isinstance(codec, wire.WireCodec) and codec.describe()["bits"] == 4


def test_run_stage_warns_and_runs_the_pipeline_of_this_rank():
    from actzip.wire import PipelineConfig, run_stage

    _fresh("actzip.wire.run_stage")
    with pytest.warns(FutureWarning, match="run_stage is deprecated.*distributed=True"):
        with pytest.raises(ConfigError, match="initialized torch.distributed process group"):
            run_stage(nn.Linear(2, 2), PipelineConfig(), lambda step: (None, None, None), 1)


def test_moved_modules_and_names_warn_once():
    _fresh("actzip.wire.boundary", "actzip.wire.stiefel_ends", "actzip.wire.stages.COMPRESSORS",
           "actzip.wire.stages.parse_boundary_options", "BoundaryConfig.compressor",
           "StiefelConfig.compressor_name", "PipelineConfig(compressor=..., ratio=...)")
    with pytest.warns(FutureWarning, match="actzip.wire.boundary is deprecated.*actzip.wire.boundaries"):
        old = importlib.import_module("actzip.wire.boundary")
    assert old.make_boundary is importlib.import_module("actzip.wire.boundaries").make_boundary
    with pytest.warns(FutureWarning, match="stiefel_ends"):
        ends = importlib.import_module("actzip.wire.stiefel_ends")
    from actzip.wire import StiefelConfig, make_boundary, stages

    assert isinstance(make_boundary(StiefelConfig(n_embd=8, width=2))[0], ends.StiefelSender)
    assert _warns_once(lambda: stages.COMPRESSORS, "COMPRESSORS is deprecated.*BOUNDARIES")[0] == "dense"
    assert _warns_once(lambda: stages.parse_boundary_options("anchor_rank=8"), "parse_boundary_options") == {
        "anchor_rank": 8}
    assert _warns_once(lambda: StiefelConfig(n_embd=8, width=2).compressor, "compressor.*kind") == "stiefel"
    assert _warns_once(lambda: StiefelConfig(n_embd=8, width=2).compressor_name, "compressor_name") == "stiefel"


def test_the_old_pipeline_config_fields_fold_into_boundary():
    from actzip.wire import PipelineConfig

    _fresh("PipelineConfig(compressor=..., ratio=...)")
    cfg = _warns_once(lambda: PipelineConfig(compressor="stiefel", ratio=16.0), "boundary='name:ratio'")
    assert cfg.boundary == "stiefel:ratio=16.0" and cfg.compressor is None
    assert PipelineConfig(compressor="dense", ratio=1.0).boundary == "dense"
    new = PipelineConfig(codec="quant:bits=8", bwd_codec="none")
    assert (new.fwd_spec, new.bwd_spec) == ("quant:bits=8", "none")
    assert PipelineConfig.from_dict(new.to_dict()) == new
    with pytest.raises(ConfigError, match="PipelineConfig.boundary: boundary 'zip'"):
        PipelineConfig(boundary="zip:4")


@pytest.mark.parametrize("module", ["actzip.wire", "actzip.wire.pipeline.runner", "actzip.wire.stages",
                                    "actzip.wire.boundaries"])
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
