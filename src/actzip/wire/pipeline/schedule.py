"""The order in which a stage runs its microbatches' forwards (``F``) and backwards (``B``) in one step.

- ``"gpipe"``: every stage runs all forwards, then all backwards;
- ``"1f1b"``: stage ``s`` of ``S`` runs ``S - s - 1`` warm-up forwards, then alternates one forward and one
  backward, then drains the backwards: fewer activations held at once, the same result.
"""

from __future__ import annotations

from actzip.errors import ConfigError

__all__ = ["SCHEDULES", "schedule_actions"]

SCHEDULES = ("gpipe", "1f1b")


def schedule_actions(schedule: str, n_stages: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    """The ("F" | "B", microbatch) actions of ``stage`` in one step, in order."""
    m = microbatches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule != "1f1b":
        raise ConfigError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")
    warm = min(n_stages - stage - 1, m)
    out = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        out += [("F", warm + i), ("B", i)]
    return out + [("B", i) for i in range(m - warm, m)]
