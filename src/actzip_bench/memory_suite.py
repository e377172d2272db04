"""``actzip bench memory``: the lossless sparse cache's benchmarks in one command, each part to its own JSON.

Parts (each also a command of its own): ``kernels`` (codec throughput against the measured copy bandwidth),
``ffn`` (the residual ReLU² FFN stack; by default the sweep d = 4096 and 768 x 4k/8k/16k/32k rows x both
densities, merged into one ``ffn.json``), ``gpt`` (the reference ReLU² GPT at sequence 1024/4096/8192) and
``bits`` (bits per element against the entropy bound on a trained model). They need a CUDA device, except
``bits``. A part that fails is reported and the others still run; the exit status says whether all ran.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

PARTS = ("kernels", "ffn", "gpt", "bits")
FFN_SWEEP = {"d": (4096, 768), "rows": (4096, 8192, 16384, 32768), "density": ("mid", "low")}


def part_commands(part: str, out: Path, device: str | None, ffn_rows: tuple[int, ...] | None = None) -> list[list[str]]:
    """The ``actzip`` argument lists that make one part (the FFN sweep is one command per point)."""
    dev = ["--device", device] if device and part != "kernels" else []
    if part == "ffn":
        rows = ffn_rows or FFN_SWEEP["rows"]
        return [["bench", "ffn", "--d", str(d), "--rows", str(r), "--density", den, *dev,
                 "--json", str(out / "ffn-parts" / f"d{d}-r{r}-{den}.json")]
                for d, r, den in itertools.product(FFN_SWEEP["d"], rows, FFN_SWEEP["density"])]
    return [["bench", part, *dev, "--json", str(out / f"{part}.json")]]


def merge_parts(out: Path, name: str = "ffn") -> Path | None:
    """The runs in ``out/{name}-parts/*.json`` as one list in ``out/{name}.json`` (the report's format for a
    sweep); the parts folder is removed. ``python -m actzip_bench.memory_suite OUT NAME`` does it from a shell."""
    folder = out / f"{name}-parts"
    parts = sorted(folder.glob("*.json"))
    if not parts:
        return None
    target = out / f"{name}.json"
    target.write_text(json.dumps([json.loads(p.read_text()) for p in parts], indent=1) + "\n")
    for p in parts:
        p.unlink()
    folder.rmdir()
    return target


def run_suite(out: Path, parts: tuple[str, ...], device: str | None, ffn_rows: tuple[int, ...] | None,
              run_one) -> dict[str, str]:
    """Run every part's commands with ``run_one(argv) -> exit status``; ``{part: "ok" or why it failed}``."""
    status = {}
    for part in parts:
        failed = []
        for argv in part_commands(part, out, device, ffn_rows):
            try:
                rc = run_one(argv)
            except (Exception, SystemExit) as e:  # noqa: BLE001 - one part must not stop the others
                failed.append(f"{' '.join(argv[:2])}: {type(e).__name__}: {e}")
                continue
            if rc:
                failed.append(f"{' '.join(argv)} exited {rc}")
        if part == "ffn":
            merge_parts(out)
        status[part] = "ok" if not failed else "; ".join(failed)
    return status


if __name__ == "__main__":
    import sys

    merge_parts(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ffn")
