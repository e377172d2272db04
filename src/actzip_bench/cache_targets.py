"""The activation-cache benchmark's targets: each figure against the threshold it was asked to meet."""

from __future__ import annotations

# (key, strategies it applies to, models it applies to (None: all), text)
TARGETS = (
    ("cache_4bit_x", ("balanced", "4bit", "4bit+norms"), None, "4-bit: activation cache >= 3.5x smaller than bf16 (none)"),
    ("peak_4bit_llama", ("balanced", "4bit", "4bit+norms"), ("llama-swiglu",), "4-bit: peak memory of the Llama-style model >= 30% lower"),
    ("time_4bit", ("balanced", "4bit", "4bit+norms"), None, "4-bit: step overhead <= 5%"),
    ("peak_sketch", ("sketch-d8", "sketch-d8+norms"), None, "sketch d/8: peak memory >= 25% lower (CompAct reports 25-30%)"),
    ("cache_2bit_x", ("aggressive", "2bit", "2bit+norms", "2bit+derivatives", "2bit+norms+derivatives"), None, "2-bit: activation cache vs ActNN's 12x (over fp32, ~6x over bf16)"),
)


def evaluate_targets(record: dict) -> list[dict]:
    """One entry per (target, model, strategy) measured: the figure, the threshold and whether it is met."""
    timed_on_gpu = bool(record.get("machine", {}).get("gpu"))  # CPU wall-clock says nothing about the H200
    out = []
    for key, strategies, models, text in TARGETS:
        for m in record["models"]:
            if models is not None and m["model"] not in models:
                continue
            for r in m["runs"]:
                if r["strategy"] not in strategies:
                    continue
                if key.startswith("cache"):
                    value, threshold = r["x_smaller"], (3.5 if key == "cache_4bit_x" else 6.0)
                    met = None if value is None else value >= threshold
                    extra = {"without_head": r["x_smaller_without_head"]} if r["head_bytes"] else {}
                elif key.startswith("peak"):
                    v = r["peak_vs_none"]
                    value, threshold = (None if v is None else 1 - v), (0.30 if key == "peak_4bit_llama" else 0.25)
                    met, extra = (None if value is None else value >= threshold), {}
                else:
                    value, threshold = r["time_vs_none"] - 1, 0.05
                    met, extra = (value <= threshold if timed_on_gpu else None), {}
                out.append({"target": key, "text": text, "model": m["model"], "strategy": r["strategy"],
                            "value": value, "threshold": threshold, "met": met, **extra})
    return out


def format_target(t: dict) -> str:
    """One line: what was asked, what was measured, met or not (``n/a`` where not measured, e.g. on a CPU)."""
    v = t["value"]
    if v is None:
        fig = "not measured"
    elif t["target"].startswith("cache"):
        fig = f"{v:.2f}x (without the loss head {t['without_head']:.2f}x)" if t.get("without_head") else f"{v:.2f}x"
    elif t["target"].startswith("peak"):
        fig = f"{v:.1%} lower"
    else:
        fig = f"{v:+.1%}"
    verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "not met")
    if t["target"] == "cache_2bit_x" and t["met"] is not None:
        verdict = "reaches ActNN's bf16-equivalent 6x" if t["met"] else "below ActNN's bf16-equivalent 6x"
    return f"{t['text']} — {t['model']} / {t['strategy']}: {fig}: {verdict}"

