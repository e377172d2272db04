"""A plan: the measured costs of every unit's options, and the option each unit takes per token-count bucket.

Costs are measured at the probe's token count; a step with another count (another sequence length or batch)
falls in a power-of-two bucket, for which the costs are scaled by tokens / probe tokens (saved activations grow
linearly with tokens) and the solver runs again, once per bucket: a step's lookup is a dict read. A step's
exposure (how much gradient its loss puts on the activations, relative to the probe step's: an RL batch whose
advantages are small perturbs little whatever is compressed) scales every unit's risk; it is bucketed to a power
of two as well (0 for a step that carries no gradient). Plans are
saved and loaded as JSON; a plan loaded for another model (its signature) is refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from actzip.errors import ConfigError
from actzip.memory.planner.solver import UnitCosts, solve

__all__ = ["Plan", "bucket_of", "exposure_bucket"]

FORMAT = 1  # the JSON layout's version


def bucket_of(tokens: int) -> int:
    """The power of two at or above ``tokens`` (at least 1)."""
    return 1 << max(int(tokens) - 1, 0).bit_length()


def exposure_bucket(exposure: float) -> float:
    """The nearest power of two of ``exposure`` in [2^-20, 2^20] (0 for no exposure)."""
    if exposure <= 0:
        return 0.0
    return 2.0 ** min(max(round(math.log2(exposure)), -20), 20)


@dataclass
class Plan:
    """Every unit's costs at ``probe_tokens`` and the options chosen per bucket."""

    signature: str  # actzip.memory.planner.units.model_signature of the model it was measured on
    probe_tokens: int  # tokens of the probe step the costs come from
    budget_bytes: float  # the peak the plan must stay under
    base_bytes: float  # what the step holds besides the units' saved tensors (parameters, optimizer, head)
    max_risk: float  # bound of the exposure-weighted relative gradient error
    units: list[UnitCosts]
    # (token bucket, exposure bucket) -> option per unit
    chosen: dict[tuple[int, float], list[str]] = field(default_factory=dict)
    # [predicted, measured] peak of each planned probe step that checked the plan (CUDA); a measured peak past
    # the budget raised base_bytes by the difference and the plan was solved again
    checks: list[list[float]] = field(default_factory=list)

    def options_for(self, tokens: int, exposure: float = 1.0) -> list[str]:
        """The option of each unit for a step of ``tokens`` tokens and ``exposure`` (solved once per bucket)."""
        key = (bucket_of(tokens), exposure_bucket(exposure))
        found = self.chosen.get(key)
        if found is None:
            scale = key[0] / bucket_of(self.probe_tokens)
            scaled = [dataclasses.replace(u, bytes=tuple(x * scale for x in u.bytes),
                                          transient=tuple(x * scale for x in u.transient),
                                          exposure=u.exposure * key[1]) for u in self.units]
            picks = solve(scaled, self.budget_bytes, self.base_bytes, self.max_risk)
            found = self.chosen[key] = [u.options[k] for u, k in zip(self.units, picks)]
        return found

    def predicted_peak(self, tokens: int, exposure: float = 1.0) -> float:
        """``base + Σ bytes + the largest transient`` of the bucket's options."""
        scale = bucket_of(tokens) / bucket_of(self.probe_tokens)
        opts = self.options_for(tokens, exposure)
        idx = [u.options.index(o) for u, o in zip(self.units, opts)]
        kept = sum(u.bytes[k] for u, k in zip(self.units, idx)) * scale
        transient = max((u.transient[k] for u, k in zip(self.units, idx)), default=0.0) * scale
        return self.base_bytes + kept + transient

    def table(self, tokens: int | None = None) -> str:
        """One line per unit: its option, and that option's bytes, seconds and risk (at the probe's tokens)."""
        tokens = self.probe_tokens if tokens is None else tokens
        opts = self.options_for(tokens)
        rows = [("unit", "option", "MiB kept", "ms added", "risk")]
        for u, o in zip(self.units, opts):
            k = u.options.index(o)
            rows.append((u.name, o, f"{u.bytes[k] / 2**20:,.2f}", f"{u.seconds[k] * 1e3:,.2f}", f"{u.risk[k]:.3g}"))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                 for r in rows]
        lines.append(f"predicted peak {self.predicted_peak(tokens) / 2**20:,.1f} MiB of a budget of "
                     f"{self.budget_bytes / 2**20:,.1f} MiB at {tokens} tokens")
        if self.checks:
            lines.append("checked on the probe: " + ", ".join(
                f"predicted {p / 2**20:,.1f} / measured {m / 2**20:,.1f} MiB" for p, m in self.checks))
        return "\n".join(lines)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["format"] = FORMAT
        d["chosen"] = {f"{b}/{e!r}": v for (b, e), v in self.chosen.items()}
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        try:
            d = json.loads(text)
            if d.pop("format", None) != FORMAT:
                raise ConfigError(f"planner: the plan's format is not {FORMAT}")
            d["units"] = [UnitCosts(**{k: tuple(v) if isinstance(v, list) else v for k, v in u.items()})
                          for u in d["units"]]
            d["chosen"] = {(int(k.split("/")[0]), float(k.split("/")[1])): list(v) for k, v in d["chosen"].items()}
            return cls(**d)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as e:
            raise ConfigError(f"planner: not a plan ({e})") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return cls.from_json(Path(path).read_text())
