"""The anchor circuit's side: what the occasional unmasked gradients do for the masked fast circuit."""

from actzip.wire.anchor.circuit import AnchorCircuit, AnchorConfig
from actzip.wire.anchor.spectral import SPECTRAL_MODES, SpectralConfig, SpectralCorrection

__all__ = ["AnchorCircuit", "AnchorConfig", "SPECTRAL_MODES", "SpectralConfig", "SpectralCorrection"]
