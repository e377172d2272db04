"""Compression of the tensors sent between pipeline stages, for the stages of any model.

- :mod:`~actzip.wire.stages`: :class:`Stage` wraps a user module with the boundary ends on either side
  (receiver -> body -> sender), the token ids travelling as an explicit side channel; :func:`run_chain` runs
  stages in one process;
- :mod:`~actzip.wire.boundaries`: learned sender/receiver ends at a stage cut (``dense``, ``subspace``,
  ``bottleneck``, ``stiefel``, ``stiefel-rvq``), built by spec string (``"stiefel:16,anchor_rank=8"``);
- :mod:`~actzip.wire.codecs`: a byte codec per direction, by spec string (``"quant:bits=4"``,
  ``"mask:keep=0.05,mode=topk+quant:bits=8"``, ``"delta:bits=4"``); :mod:`~actzip.wire.delta`: AQ-SGD's delta
  against a per-sample cache;
- :mod:`~actzip.wire.pipeline`: :class:`Pipeline`, GPipe / 1F1B training, all stages in one process or one
  per rank under torchrun;
- :mod:`~actzip.wire.transport`: messages over ``torch.distributed`` point-to-point ops, metered to the byte,
  with a configuration handshake, sequence checks and bounded waits; :mod:`~actzip.wire.link`: a software link
  model with a schedule simulator, and a network-namespace harness.

Example: a 2-stage pipeline of ``nn.Sequential`` layers with 8-bit activations and gradients on the wire, then
the same model's stages with a learned 4x bottleneck at the cut::

    >>> import torch
    >>> from torch import nn
    >>> import actzip.wire as wire
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> stages = [nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 8)), nn.Sequential(nn.ReLU(), nn.Linear(8, 16))]
    >>> pipe = wire.Pipeline(stages, wire.PipelineConfig(microbatches=2, codec="quant:bits=8", lr=1e-2))
    >>> x = torch.randint(0, 16, (4, 5))
    >>> losses = [pipe.train_step(x, x) for _ in range(20)]
    >>> losses[-1] < losses[0]
    True
    >>> sender, receiver = wire.make_boundary(wire.boundary_config("bottleneck:4", n_embd=8))
    >>> stages = [wire.Stage(stages[0], sender=sender), wire.Stage(stages[1], receiver=receiver)]
    >>> pipe = wire.Pipeline(stages, wire.PipelineConfig(microbatches=2, boundary="bottleneck:4", lr=1e-2))
    >>> pipe.train_step(x, x) > 0
    True
"""

from actzip import compat
from actzip.wire.boundaries import (
    BOUNDARIES,
    BottleneckConfig,
    BoundaryConfig,
    BoundaryReceiver,
    BoundarySender,
    DenseConfig,
    StiefelConfig,
    SubspaceConfig,
    boundary_config,
    code_width,
    confine_to_subspace,
    make_boundary,
    parse_boundary,
)
from actzip.wire.codecs import BoundaryCodec, CodecSpec, WireCodec, parse_codec
from actzip.wire.delta import DeltaCodec
from actzip.wire.link import (
    Action,
    LinkModel,
    LinkSpec,
    NetnsLink,
    NetnsMesh,
    Timeline,
    netns_unavailable_reason,
)
from actzip.wire.pipeline import (
    Pipeline,
    PipelineConfig,
    SimulatedPipeline,
    StageWorker,
    codebook_desyncs,
    pipelining_stage,
    run_stage,
    schedule_actions,
)
from actzip.wire.replay import Sync, dp_sync, dp_sync_seconds, simulate
from actzip.wire.stages import Stage, WireMeter, exchange_backward, message_nbytes, run_chain
from actzip.wire.transport import (
    ByteMeter,
    DistBackend,
    LoopbackHub,
    Message,
    Transport,
    WireConfigMismatchError,
    WireDesyncError,
    WireError,
    WirePeerError,
    WireTimeoutError,
)

compat.MOVED_MODULES.update({
    "actzip.wire.boundary": "actzip.wire.boundaries",
    "actzip.wire.stiefel_ends": "actzip.wire.boundaries.stiefel",
})
compat.install()

__all__ = [
    "BOUNDARIES", "Action", "BottleneckConfig", "BoundaryCodec", "BoundaryConfig", "BoundaryReceiver",
    "BoundarySender", "ByteMeter", "CodecSpec", "DeltaCodec", "DenseConfig", "DistBackend", "LinkModel", "LinkSpec",
    "LoopbackHub", "Message", "NetnsLink", "NetnsMesh", "Pipeline", "PipelineConfig", "SimulatedPipeline", "Stage",
    "StageWorker", "StiefelConfig", "SubspaceConfig", "Sync", "Timeline", "Transport", "WireCodec",
    "WireConfigMismatchError", "WireDesyncError", "WireError", "WireMeter", "WirePeerError", "WireTimeoutError",
    "boundary_config", "code_width", "codebook_desyncs", "confine_to_subspace", "dp_sync", "dp_sync_seconds",
    "exchange_backward",
    "make_boundary", "message_nbytes", "netns_unavailable_reason", "parse_boundary", "parse_codec",
    "pipelining_stage", "run_chain", "run_stage", "schedule_actions", "simulate",
]
