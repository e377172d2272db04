"""The process groups of S pipeline stages x R data-parallel replicas, made up front on every rank.

Global rank ``r * S + s`` is stage ``s`` of replica ``r``: each replica's stages are consecutive ranks (on a
machine per replica, the pipeline stays inside it). Every rank creates every group in one order, as
``torch.distributed.new_group`` requires: per replica the fast pipeline's two communicators (one per direction,
see :class:`~actzip.wire.backends.DistBackend`) and the anchor pipeline's two; per stage the group of its
replicas, over which its gradients are averaged.
"""

import torch.distributed as dist

from actzip.errors import ConfigError

__all__ = ["Mesh"]


class Mesh:
    """This rank's place in ``stages x replicas`` and the groups it talks in (see the module docstring)."""

    def __init__(self, stages: int, replicas: int) -> None:
        for name, v in (("stages", stages), ("replicas", replicas)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"Mesh: {name} must be an int >= 1, got {v!r}")
        if stages < 2:
            raise ConfigError(f"Mesh: a pipeline needs at least 2 stages, got {stages}")
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError("Mesh needs an initialized torch.distributed process group (e.g. under torchrun)")
        world = dist.get_world_size()
        if world != stages * replicas:
            raise ConfigError(f"Mesh: {stages} stages x {replicas} replicas need {stages * replicas} ranks, the "
                              f"world has {world}; launch torchrun --nproc-per-node={stages * replicas}")
        self.stages, self.replicas = stages, replicas
        self.rank = dist.get_rank()
        self.replica, self.stage = divmod(self.rank, stages)
        backend = dist.get_backend()
        pipes = []
        for r in range(replicas):
            ranks = self.replica_ranks(r)
            pipes.append(tuple(dist.new_group(ranks, backend=backend) for _ in range(4)))
        dps = [dist.new_group(self.stage_ranks(s), backend=backend) for s in range(stages)]
        self.pipe_group, self.pipe_down_group, self.anchor_group, self.anchor_down_group = pipes[self.replica]
        self.dp_group = dps[self.stage]

    def replica_ranks(self, replica: int) -> list[int]:
        """The global ranks of ``replica``'s stages, in stage order."""
        return [replica * self.stages + s for s in range(self.stages)]

    def stage_ranks(self, stage: int) -> list[int]:
        """The global ranks holding ``stage``, in replica order."""
        return [r * self.stages + stage for r in range(self.replicas)]

    def __repr__(self) -> str:
        return (f"Mesh(stages={self.stages}, replicas={self.replicas}; rank {self.rank} = stage {self.stage} of "
                f"replica {self.replica})")
