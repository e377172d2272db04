"""The 2-bit figures: each role's share of the dense bytes with the ratio at 2 bits for all but nonlinear inputs,
and the probe's loss gaps over seeds; clear errors for records that lack what they need."""

import json
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench import figures
from actzip_bench.figures_cache_roles import BOUND_PROBE, ROLES_GPU


def _rule(dense: int, stored: int) -> dict:
    return {"tensors": 1, "dense_bytes": dense, "stored_bytes": stored}


def _roles_record(root: Path, strategies=("2bit", "2bit+norms")) -> None:
    # 1000 dense bytes: linear 400 (2 bits: 0.15625 kept), nonlinear 300 (4 bits), attention 300 (4 bits)
    by_rule = {"leaf": _rule(50, 50), "linear_input:quant2": _rule(400, 62.5),
               "nonlinear_input:quant4": _rule(300, 84.375), "attention:quant4": _rule(300, 84.375)}
    runs = [{"strategy": s, "bytes_dense": 1000, "x_smaller": 1000 / 231.25, "by_rule": by_rule} for s in strategies]
    rec = {"machine": {"gpu": "NVIDIA H100 80GB HBM3"},
           "config": {"batch_size": 32, "seq_len": 1024, "dtype": "bfloat16"},
           "models": [{"model": "gpt-gelu", "params": 124e6, "runs": runs}]}
    (root / ROLES_GPU).parent.mkdir(parents=True, exist_ok=True)
    (root / ROLES_GPU).write_text(json.dumps(rec))


def test_shares_and_the_ratio_with_all_but_nonlinear_inputs_at_2_bits(tmp_path):
    _roles_record(tmp_path)
    text = figures.render("memory-2bit-roles", tmp_path)
    # attention moves to the 2-bit fraction: 62.5 + 84.375 + 300 * 0.15625 = 193.75 stored of 1000
    assert "| GELU GPT 124M | `2bit` | 4.32× | 40% | 30% | 30% | - | - | - | 5.16× |" in text
    assert "below ActNN's 6.0× over bf16" in text and f"(`{ROLES_GPU}`)" in text
    assert "32 x 1024 tokens, bfloat16" in text


def test_a_missing_strategy_is_a_clear_error(tmp_path):
    _roles_record(tmp_path, strategies=("2bit",))
    with pytest.raises(ConfigError, match="no '2bit\\+norms' run of gpt-gelu"):
        figures.render("memory-2bit-roles", tmp_path)


def _probe(root: Path, seed: int, gaps: dict[str, float], drop=None) -> None:
    runs = [{"preset": "lossless", "saved_bytes_per_token": 100.0, "train_loss_gap": 0.0, "val_loss_gap": 0.0}]
    runs += [{"preset": p, "saved_bytes_per_token": 20.0, "train_loss_gap": g, "val_loss_gap": g / 2}
             for p, g in gaps.items() if p != drop]
    rec = {"config": {"model": "tiny", "activation": "gelu", "steps": 2000, "dtype": "float32", "seed": seed},
           "reference": "lossless", "runs": runs}
    path = root / BOUND_PROBE / f"gelu-seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))


def test_the_probe_gives_each_preset_mean_and_range_over_the_seeds(tmp_path):
    for seed, gap in enumerate((0.02, 0.04)):
        _probe(tmp_path, seed, {"2bit": gap, "2bit/norm=quant2-rn": 10 * gap})
    text = figures.render("memory-2bit-probe", tmp_path)
    assert "| `2bit` | 20.0% | +3.0% (+2.0% to +4.0%) | +1.5% (+1.0% to +2.0%) |" in text
    assert "| `2bit/norm=quant2-rn` | 20.0% | +30.0% (+20.0% to +40.0%)" in text
    assert "seeds 0, 1" in text and "(`lossless`)" in text


def test_a_probe_run_lacking_a_preset_is_a_clear_error(tmp_path):
    _probe(tmp_path, 0, {"2bit": 0.02, "2bit/norm=quant2-rn": 0.2})
    _probe(tmp_path, 1, {"2bit": 0.02, "2bit/norm=quant2-rn": 0.2}, drop="2bit/norm=quant2-rn")
    with pytest.raises(ConfigError, match="lacks '2bit/norm=quant2-rn'"):
        figures.render("memory-2bit-probe", tmp_path)


def test_the_derivatives_probe_groups_its_records_by_model_family(tmp_path):
    from actzip_bench.figures_cache_roles import DERIVATIVES_PROBE, derivatives_probe

    def record(activation, seed, gap):
        runs = [{"preset": "lossless", "saved_bytes_per_token": 1000, "train_loss_gap": 0.0, "val_loss_gap": 0.0},
                {"preset": "2bit", "saved_bytes_per_token": 200, "train_loss_gap": gap, "val_loss_gap": gap},
                {"preset": "2bit+derivatives", "saved_bytes_per_token": 180, "train_loss_gap": 2 * gap,
                 "val_loss_gap": gap}]
        return {"reference": "lossless", "runs": runs,
                "config": {"model": "tiny", "activation": activation, "steps": 2000, "dtype": "float32", "seed": seed}}

    folder = tmp_path / DERIVATIVES_PROBE
    folder.mkdir(parents=True)
    for activation in ("gelu", "swiglu"):
        for seed, gap in ((0, 0.01), (1, 0.03)):
            (folder / f"{activation}-seed{seed}.json").write_text(json.dumps(record(activation, seed, gap)))
    text = derivatives_probe(tmp_path)
    assert "tiny-size gelu GPT" in text and "tiny-size Llama (HF, SwiGLU)" in text
    assert text.count("| `2bit+derivatives` | 18.0% | +4.0% (+2.0% to +6.0%) | +2.0% (+1.0% to +3.0%) |") == 2
    assert "seeds 0, 1" in text
    rec = record("gelu", 2, 0.0)
    rec["runs"] = rec["runs"][:2]
    (folder / "gelu-seed2.json").write_text(json.dumps(rec))
    with pytest.raises(ConfigError, match="lacks '2bit\\+derivatives'"):
        derivatives_probe(tmp_path)


def test_the_124m_derivatives_table_reads_each_strategy_s_ratio_and_the_gpu_s_beside_it():
    from actzip_bench.figures_cache_roles import DERIVATIVE_STRATEGIES, DERIVATIVES_124M, derivatives_124m

    repo = Path(__file__).resolve().parents[2]
    text = derivatives_124m(repo)
    rec = json.loads((repo / DERIVATIVES_124M).read_text())
    for m in rec["models"]:
        runs = {r["strategy"]: r["x_smaller"] for r in m["runs"]}
        row = next(line for line in text.splitlines() if line.startswith("| ") and f"{m['params'] / 1e6:.0f}M" in line)
        assert all(f"{runs[s]:.2f}×" in row for s in DERIVATIVE_STRATEGIES)
        assert runs["2bit+derivatives"] > runs["2bit"] and runs["2bit+norms+derivatives"] > runs["2bit+norms"]
    assert "(4.73×)" in text  # the H100's 2bit+norms, beside the CPU's
