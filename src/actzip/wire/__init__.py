"""Compression of the tensors sent between pipeline stages.

- :mod:`~actzip.wire.transport`: messages of tensors and payloads over ``torch.distributed`` point-to-point
  ops, metered to the byte, with a configuration handshake, sequence checks and bounded waits;
- :mod:`~actzip.wire.codecs`: a codec per direction of a boundary, by spec string (``"quant:bits=4"``,
  ``"mask:keep=0.05,mode=topk+quant:bits=8"``, ``"delta:bits=4"``);
- :mod:`~actzip.wire.delta`: AQ-SGD-style delta against a per-sample cache;
- :mod:`~actzip.wire.link`: a software link model with a schedule simulator, and a network-namespace harness;
- :mod:`~actzip.wire.pipeline`: the GPipe / 1F1B runner, one stage per process or all in one.
"""

from actzip.wire.codecs import BoundaryCodec, CodecSpec, parse_codec
from actzip.wire.delta import DeltaCodec
from actzip.wire.link import (
    Action,
    LinkModel,
    LinkSpec,
    NetnsLink,
    Timeline,
    netns_unavailable_reason,
    simulate,
)
from actzip.wire.pipeline import (
    PipelineConfig,
    SimulatedPipeline,
    StageWorker,
    pipelining_stage,
    run_stage,
    schedule_actions,
)
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

__all__ = [
    "Action",
    "BoundaryCodec",
    "ByteMeter",
    "CodecSpec",
    "DeltaCodec",
    "DistBackend",
    "LinkModel",
    "LinkSpec",
    "LoopbackHub",
    "Message",
    "NetnsLink",
    "PipelineConfig",
    "SimulatedPipeline",
    "StageWorker",
    "Timeline",
    "Transport",
    "WireConfigMismatchError",
    "WireDesyncError",
    "WireError",
    "WirePeerError",
    "WireTimeoutError",
    "netns_unavailable_reason",
    "parse_codec",
    "pipelining_stage",
    "run_stage",
    "schedule_actions",
    "simulate",
]
