"""``bench decentralized`` end to end on a 2 x 2 mesh of a tiny model: rows per method with bytes per axis,
losses, link times and time to target; configs refuse what they cannot run."""

import dataclasses

import pytest

from actzip.errors import ConfigError
from actzip_bench.decentralized import run_decentralized
from actzip_bench.decentralized_config import METHODS, DecentralizedBenchConfig

ROW_FIELDS = {"method", "pp_bytes_per_step", "dp_bytes_per_step", "final_loss", "tokens", "time_to_target_s"}


@pytest.fixture(scope="module")
def record():
    cfg = dataclasses.replace(DecentralizedBenchConfig.quick(), n_embd=32, block_size=16, steps=6,
                              pretrain_steps=2, tasks=("domain",), corpus_bytes=40_000, dataset_windows=32,
                              methods=("dense", "bf16", "mask+diloco", "two-circuit"), anchor_every=2,
                              anchor_delay=1, diloco_steps=3, eval_batches=1)
    return run_decentralized(cfg)


def test_every_method_has_a_row_with_the_documented_fields(record):
    rows = record["rows"]
    assert [r["method"] for r in rows] == ["dense", "bf16", "mask+diloco", "two-circuit"]
    for r in rows:
        assert ROW_FIELDS <= set(r)
        assert r["tokens"] == 6 * 8 * 16 * 2 and len(r["losses"]) == 6
    by = {r["method"]: r for r in rows}
    assert by["bf16"]["pp_bytes_per_step"] < by["dense"]["pp_bytes_per_step"]
    assert by["mask+diloco"]["pp_bytes_per_step"] < by["bf16"]["pp_bytes_per_step"] / 8
    assert by["mask+diloco"]["dp_bytes_per_step"] < by["bf16"]["dp_bytes_per_step"] / 4
    assert by["dense"]["target_step"] is not None  # dense reaches its own final loss
    assert by["two-circuit"]["anchors"]["launched"] == 4 * 3  # 4 ranks, every 2nd of 6 steps


def test_link_times_and_ratios_are_reported_per_link(record):
    for a in record["aggregate"]:
        assert set(a["links"]) == {"200mbps-50ms", "80mbps-50ms"}
        for link in a["links"].values():
            assert link["step_s"] >= link["pp_step_s"] > 0
            assert link["throughput_vs_bf16"] > 0
    machine = record["machine"]
    assert {"date", "torch", "host_cpu", "cores", "code_version"} <= set(machine)  # the provenance a figure cites
    assert machine["code_version"] is None or isinstance(machine["code_version"], str)


def test_configs_name_what_they_refuse():
    with pytest.raises(ConfigError, match="unknown methods"):
        DecentralizedBenchConfig(methods=("dense", "zip"))
    with pytest.raises(ConfigError, match="dense"):
        DecentralizedBenchConfig(methods=("bf16",))
    with pytest.raises(ConfigError, match="tasks"):
        DecentralizedBenchConfig(tasks=("translation",))
    assert "two-circuit" in METHODS
