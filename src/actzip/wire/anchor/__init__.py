"""The anchor circuit's side: what the occasional unmasked gradients do for the masked fast circuit."""

from actzip.wire.anchor.circuit import AnchorCircuit, AnchorConfig, AnchorDelivery, PendingAnchor
from actzip.wire.anchor.spectral import SPECTRAL_MODES, SpectralConfig, SpectralCorrection

__all__ = ["AnchorCircuit", "AnchorConfig", "AnchorDelivery", "PendingAnchor", "SPECTRAL_MODES", "SpectralConfig",
           "SpectralCorrection"]
