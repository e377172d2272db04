"""scripts/cache_profile.py on a CPU: a record per strategy with its step time and the kernels it ran more."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_profile_writes_one_row_per_strategy(tmp_path):
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "cache_profile.py"), "--strategies", "none,4bit",
                           "--steps", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert [r["strategy"] for r in rec["rows"]] == ["none", "4bit"]
    assert rec["config"]["gpt_preset"] == "tiny" and rec["machine"]["cores"] >= 1
    for r in rec["rows"]:
        assert r["step_ms"] > 0 and r["gpu_busy_ms"] == 0.0  # a CPU: no GPU kernels
        assert r["gpu_idle_ms"] == r["step_ms"]
        assert r["host_ops"] and all(h["self_ms"] > 0 and h["calls"] > 0 for h in r["host_ops"])
    assert "4bit:" in done.stdout
