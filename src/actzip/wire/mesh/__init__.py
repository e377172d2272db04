"""Two-circuit training over S pipeline stages x R data-parallel replicas (one process each, under torchrun):
:class:`Mesh` makes the process groups, :class:`TwoCircuit` runs this rank's stage in the fast circuit (masked
pipeline + compressed data-parallel sync) and the anchor circuit (unmasked passes for the spectral correction),
checking that replicas agree."""

from actzip.wire.mesh.anchors import PipelineAnchors
from actzip.wire.mesh.fingerprint import check_replicas_agree, fingerprint
from actzip.wire.mesh.groups import Mesh
from actzip.wire.mesh.trainer import TwoCircuit, TwoCircuitConfig

__all__ = ["Mesh", "PipelineAnchors", "TwoCircuit", "TwoCircuitConfig", "check_replicas_agree", "fingerprint"]
