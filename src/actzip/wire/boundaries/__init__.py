"""Stage boundaries: a learned sender at the end of one stage and a receiver at the start of the next.

- :mod:`~actzip.wire.boundaries.config`: one config per kind, and the ratio-to-width rule;
- :mod:`~actzip.wire.boundaries.ends`: the sender and receiver base classes and their runner hooks;
- :mod:`~actzip.wire.boundaries.dense`, :mod:`~.subspace`, :mod:`~.bottleneck`, :mod:`~.stiefel`,
  :mod:`~.principal` (``pca``): the ends of each kind (``subspace`` also gives the model surgery its stream needs: :func:`confine_to_subspace`);
- :mod:`~actzip.wire.boundaries.build`: configs and ends from a spec string (``"stiefel:16,anchor_rank=8"``).

Example::

    >>> import torch
    >>> from actzip.wire.boundaries import boundary_config, make_boundary
    >>> sender, receiver = make_boundary(boundary_config("bottleneck:8", n_embd=32))
    >>> msg = sender(torch.randn(2, 4, 32))
    >>> tuple(msg["code"].shape), tuple(receiver(msg)[0].shape)
    ((2, 4, 4), (2, 4, 32))
"""

from actzip.wire.boundaries.build import (
    BOUNDARIES,
    boundary_config,
    format_boundary,
    make_boundary,
    parse_boundary,
    parse_boundary_options,
)
from actzip.wire.boundaries.bottleneck import BottleneckReceiver, BottleneckSender, adopt_sublayer
from actzip.wire.boundaries.config import (
    BottleneckConfig,
    BoundaryConfig,
    DenseConfig,
    PCAConfig,
    StiefelConfig,
    SubspaceConfig,
    code_width,
)
from actzip.wire.boundaries.ends import BoundaryEnd, BoundaryReceiver, BoundarySender
from actzip.wire.boundaries.principal import PCAReceiver, PCASender, principal_basis
from actzip.wire.boundaries.stiefel import StiefelReceiver, StiefelSender
from actzip.wire.boundaries.subspace import (
    SubspaceEmbedding,
    SubspaceLinear,
    confine_to_subspace,
    subspace_tensors,
)
from actzip.wire.protocol import id_bytes

__all__ = [
    "BOUNDARIES", "BottleneckConfig", "BottleneckReceiver", "BottleneckSender", "BoundaryConfig", "BoundaryEnd", "BoundaryReceiver", "BoundarySender",
    "DenseConfig", "PCAConfig", "PCAReceiver", "PCASender", "StiefelConfig", "StiefelReceiver", "StiefelSender", "SubspaceConfig", "SubspaceEmbedding",
    "SubspaceLinear", "adopt_sublayer", "boundary_config", "code_width", "confine_to_subspace", "format_boundary", "id_bytes",
    "make_boundary", "parse_boundary", "parse_boundary_options", "principal_basis", "subspace_tensors",
]
