"""Pipeline-parallel training with compressed stage boundaries: all stages in one process, or one per rank.

- :mod:`~actzip.wire.pipeline.config`: :class:`PipelineConfig`;
- :mod:`~actzip.wire.pipeline.schedule`: GPipe and 1F1B orders of a stage's microbatches;
- :mod:`~actzip.wire.pipeline.worker`: one stage's actions: codecs, transport, optimizer, the record;
- :mod:`~actzip.wire.pipeline.runner`: :class:`Pipeline`, the one entry (in this process, or per rank);
- :mod:`~actzip.wire.pipeline.torch_pipelining`: stages on ``torch.distributed.pipelining``'s schedules.
"""

from collections.abc import Callable

from torch import nn

from actzip.compat import deprecated
from actzip.wire.pipeline.config import PipelineConfig
from actzip.wire.pipeline.runner import Pipeline
from actzip.wire.pipeline.schedule import SCHEDULES, schedule_actions
from actzip.wire.pipeline.torch_pipelining import pipelining_stage
from actzip.wire.pipeline.worker import StageWorker, codebook_desyncs, lm_loss

__all__ = [
    "SCHEDULES", "Pipeline", "PipelineConfig", "SimulatedPipeline", "StageWorker", "codebook_desyncs", "lm_loss",
    "pipelining_stage", "run_stage", "schedule_actions",
]


def _run_rank(module: nn.Module, cfg: PipelineConfig, batches: Callable[[int], tuple], steps: int, *, device=None,
              group=None, loss_fn: Callable | None = None, **run_options) -> dict | None:
    return Pipeline(module, cfg, device, loss_fn, distributed=True, group=group).run(batches, steps, **run_options)


# Old names, kept for one release.
SimulatedPipeline = deprecated(Pipeline, "actzip.wire.SimulatedPipeline", "actzip.wire.Pipeline")
run_stage = deprecated(_run_rank, "actzip.wire.run_stage",
                       "actzip.wire.Pipeline(stage, config, distributed=True).run(batches, steps)")
