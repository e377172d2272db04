"""The activation-cache benchmark's record as rich tables, one per model, and its target lines."""

from __future__ import annotations


def _gib(b) -> str:
    return "n/a" if b is None else f"{b / 2**30:.2f}"


def render(record: dict) -> list:
    """Rich tables, one per model, and the target lines."""
    from rich.table import Table

    out: list = []
    for m in record["models"]:
        res = "" if m["resident_bytes"] is None else f", resident {_gib(m['resident_bytes'])} GiB"
        t = Table(title=f"{m['model']} ({m['params'] / 1e6:.1f}M params, vocab {m['vocab_size']}), "
                        f"{m['batch_size']} x {m['seq_len']} tokens{res}")
        for col in ("strategy", "saved MiB", "x smaller", "w/o head", "peak GiB", "vs none", "step ms", "vs none",
                    "grad rel err", "last loss"):
            t.add_column(col, justify="left" if col == "strategy" else "right")
        for r in m["runs"]:
            rel = "" if r["peak_vs_none"] is None else f"{r['peak_vs_none'] - 1:+.1%}"
            xb = "n/a" if r["x_smaller_without_head"] is None else f"{r['x_smaller_without_head']:.2f}"
            t.add_row(r["strategy"], f"{r['bytes_saved'] / 2**20:,.1f}", f"{r['x_smaller']:.2f}", xb,
                      _gib(r["peak_bytes"]), rel, f"{r['median_ms']:.1f}", f"{r['time_vs_none'] - 1:+.1%}",
                      f"{r['grad_rel_error']:.3g}", f"{r['last_loss']:.3f}")
        out.append(t)
    out.extend(t["line"] for t in record["targets"])
    return out
