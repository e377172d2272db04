"""Core types shared by every layer: payloads, the codec registry, errors, dtype helpers."""
