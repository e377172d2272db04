"""The anchor circuit's side: what the occasional unmasked gradients do for the masked fast circuit."""

from actzip.wire.anchor.spectral import SPECTRAL_MODES, SpectralConfig, SpectralCorrection

__all__ = ["SPECTRAL_MODES", "SpectralConfig", "SpectralCorrection"]
