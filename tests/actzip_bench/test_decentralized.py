"""``bench decentralized`` end to end on a 2 x 2 mesh of a tiny model: rows per method with bytes per axis,
losses, link times and time to target; configs refuse what they cannot run."""

import copy
import dataclasses

import pytest

from actzip.errors import ConfigError
from actzip.errors import ActzipError
from actzip.wire import netns_unavailable_reason
from actzip_bench.decentralized import (
    failure_lines,
    merge_records,
    replay_times,
    run_decentralized,
    set_targets,
    with_calibration,
    with_speed,
)
from actzip_bench.decentralized_config import METHODS, DecentralizedBenchConfig, method_boundary

ROW_FIELDS = {"method", "pp_bytes_per_step", "dp_bytes_per_step", "final_loss", "tokens", "time_to_target_s"}


@pytest.fixture(scope="module")
def record():
    cfg = dataclasses.replace(DecentralizedBenchConfig.quick(), n_embd=32, block_size=16, steps=6,
                              pretrain_steps=2, tasks=("domain",), corpus_bytes=40_000, dataset_windows=32,
                              methods=("dense", "bf16", "mask+diloco", "two-circuit", "pca"), anchor_every=2,
                              anchor_delay=1, diloco_steps=3, eval_batches=1, keep_replay=True)
    return run_decentralized(cfg)


def test_every_method_has_a_row_with_the_documented_fields(record):
    rows = record["rows"]
    assert [r["method"] for r in rows] == ["dense", "bf16", "mask+diloco", "two-circuit", "pca"]
    assert isinstance(record["teardown_exit"], int)  # non-zero only where gloo failed in teardown (announced)
    for r in rows:
        assert ROW_FIELDS <= set(r)
        assert r["tokens"] == 6 * 8 * 16 * 2 and len(r["losses"]) == 6
    by = {r["method"]: r for r in rows}
    assert by["bf16"]["pp_bytes_per_step"] < by["dense"]["pp_bytes_per_step"]
    assert by["mask+diloco"]["pp_bytes_per_step"] < by["bf16"]["pp_bytes_per_step"] / 8
    assert by["mask+diloco"]["dp_bytes_per_step"] < by["bf16"]["dp_bytes_per_step"] / 4
    assert by["dense"]["target_step"] is not None  # dense reaches its own final loss
    assert by["two-circuit"]["anchors"]["launched"] == 4 * 3  # 4 ranks, every 2nd of 6 steps
    # its anchors are dense passes, every 2nd step: half of dense's pipeline bytes a step, beside its own
    assert by["two-circuit"]["anchor_bytes_per_step"] == pytest.approx(by["dense"]["pp_bytes_per_step"] / 2, rel=0.05)
    assert by["mask+diloco"]["anchor_bytes_per_step"] == 0
    # an eighth of the width in 8-bit codes each way, and the bases it sent: about a fourteenth of bf16's bytes
    assert by["pca"]["pp_bytes_per_step"] < by["bf16"]["pp_bytes_per_step"] / 8
    assert by["pca"]["dp_bytes_per_step"] == by["bf16"]["dp_bytes_per_step"]  # the same bf16 all-reduce


def test_the_trained_model_is_evaluated_with_the_codecs_off_too(record):
    by = {r["method"]: r for r in record["rows"]}
    assert by["dense"]["model_val_loss"] == by["dense"]["val_loss"]  # no codec: the same function, the same loss
    assert by["mask+diloco"]["model_val_loss"] != by["mask+diloco"]["val_loss"]  # the masks' function is another
    agg = {a["method"]: a for a in record["aggregate"]}
    assert agg["dense"]["model_val_loss_vs_dense"] == 0.0
    lo, hi = agg["two-circuit"]["model_val_loss_vs_dense_range"]
    assert lo <= agg["two-circuit"]["model_val_loss_vs_dense"] <= hi


def test_the_pca_methods_build_their_boundary_at_the_masks_keep():
    cfg = DecentralizedBenchConfig.quick()
    assert method_boundary("pca", cfg) == "pca:8" and method_boundary("mask", cfg) == "dense"
    assert method_boundary("pca+diloco", dataclasses.replace(cfg, mask_keep=0.25)) == "pca:4"


def test_records_of_other_seeds_merge_into_one_and_bad_merges_are_named(record):
    other = copy.deepcopy(record)
    other["config"]["seeds"] = [1]
    for row in other["rows"]:
        row["seed"] = 1
    merged = merge_records([record, other])
    assert list(merged["config"]["seeds"]) == [0, 1] and len(merged["rows"]) == 2 * len(record["rows"])
    assert all(a["seeds"] == 2 for a in merged["aggregate"])
    assert "shaping" not in merged  # run on one host: no shaping to carry
    shaped = [{**record, "shaping": "tbf"}, {**other, "shaping": "tbf"}]
    assert merge_records(shaped)["shaping"] == "tbf"  # the records' qdisc, when they agree
    assert "shaping" not in merge_records([shaped[0], {**other, "shaping": "netem"}])
    with pytest.raises(ActzipError, match="seeds repeat"):
        merge_records([record, record])
    changed = copy.deepcopy(other)
    changed["config"]["steps"] = 7
    with pytest.raises(ActzipError, match="another config"):
        merge_records([record, changed])


def test_a_method_short_of_a_seed_is_compared_with_dense_on_its_own_seeds(record):
    other = copy.deepcopy(record)
    other["config"]["seeds"] = [1]
    for row in other["rows"]:
        row["seed"] = 1
        row["final_loss"] += 1.0  # a seed whose losses are all higher
    other["rows"] = [r for r in other["rows"] if r["method"] != "pca"]  # cut off before its pca run
    merged = merge_records([record, other])
    pca = next(a for a in merged["aggregate"] if a["method"] == "pca")
    mine = next(r for r in record["rows"] if r["method"] == "pca")
    dense = next(r for r in record["rows"] if r["method"] == "dense")
    assert pca["seeds"] == 1 and pca["dense_reference"] == dense["final_loss"]
    assert pca["loss_vs_dense"] == pytest.approx(mine["final_loss"] / dense["final_loss"] - 1)


def test_step_times_of_a_run_alone_replace_the_shared_ones_and_the_times_to_target_follow(record):
    speed = copy.deepcopy(record)
    speed["config"].update(steps=3, seeds=[5])  # a shorter run on another seed: only the shapes must match
    for a in speed["aggregate"]:
        for name, link in a["links"].items():
            link["step_s"], link["pp_step_s"] = (2.0, 1.5) if a["method"] == "dense" else (0.5, 0.25)
    out = with_speed(record, speed)
    assert [r["losses"] for r in out["rows"]] == [r["losses"] for r in record["rows"]]
    for row, before in zip(out["rows"], record["rows"]):
        step = 2.0 if row["method"] == "dense" else 0.5
        for name, link in row["links"].items():
            assert link["step_s"] == step and link["shared_step_s"] == before["links"][name]["step_s"]
            reach = row["target_step"]
            assert link["time_to_target_s"] == (None if reach is None else step * (reach + 1))
    dense = next(a for a in out["aggregate"] if a["method"] == "dense")
    bf16 = next(a for a in out["aggregate"] if a["method"] == "bf16")
    assert bf16["links"]["200mbps-50ms"]["throughput_vs_bf16"] == 1.0
    assert dense["links"]["200mbps-50ms"]["throughput_vs_bf16"] == 0.25
    other = copy.deepcopy(speed)
    other["config"]["n_embd"] = 64
    with pytest.raises(ActzipError, match="other shapes \\(n_embd\\)"):
        with_speed(record, other)
    fewer = copy.deepcopy(speed)
    fewer["aggregate"] = [a for a in fewer["aggregate"] if a["method"] != "pca"]
    with pytest.raises(ActzipError, match="no run of \\['pca'\\]"):
        with_speed(record, fewer)


def test_a_kept_schedule_replays_to_the_rows_modelled_step_times(record):
    from actzip.wire import LinkSpec

    cfg = DecentralizedBenchConfig(**{k: tuple(tuple(x) for x in v) if k == "links" else
                                      tuple(v) if isinstance(v, list) else v for k, v in record["config"].items()})
    for row in record["rows"]:
        assert {r["replica"] for r in row["replay"]} == {0} and len(row["replay"]) == cfg.stages
        for (bw, lat), name in zip(cfg.links, cfg.link_names):
            times = replay_times(row["replay"], cfg, LinkSpec(bandwidth_mbps=bw, latency_ms=lat))
            assert row["links"][name]["cumulative_s"][-1] == pytest.approx(sum(times))
        assert all(h >= 0 for r in row["replay"] for h in r["dp_host_seconds"])


def test_a_link_calibration_replays_the_kept_schedules_with_the_measured_exchanges(record):
    # all-gathers twice as slow as the rate at every size: each sync's wire time doubles, nothing else changes
    sizes = (1_000, 100_000, 10_000_000)
    probe = {"config": {"mbps": 200.0}, "gathers": [{"bytes": n, "measured_s": 2 * 8 * n / 200e6} for n in sizes],
             "machine": {"host_cpu": "here"}, "command": "actzip bench link"}
    got = with_calibration(record, probe)
    assert got["config"]["exchange_mbps"] == 200.0 and got["link_calibration"]["command"] == "actzip bench link"
    for before, row in zip(record["rows"], got["rows"]):
        plain, cal = row["links"]["200mbps-50ms"], row["links"]["200mbps-50ms calibrated"]
        assert plain == before["links"]["200mbps-50ms"] and cal["pp_step_s"] == pytest.approx(plain["pp_step_s"])
        sync = sum(sum(b.values()) for r in row["replay"] for b in r["dp_bytes"]) / len(row["losses"])
        if sync:  # the syncs' bytes now take twice their time: the run is longer, never shorter
            assert cal["cumulative_s"][-1] > plain["cumulative_s"][-1]
        else:
            assert cal["cumulative_s"][-1] == pytest.approx(plain["cumulative_s"][-1])
        assert "80mbps-50ms calibrated" not in row["links"]  # measured at 200 Mbit/s only
    assert {a["method"] for a in got["aggregate"]} == {a["method"] for a in record["aggregate"]}
    bare = copy.deepcopy(record)
    del bare["rows"][0]["replay"]
    with pytest.raises(ActzipError, match="keep no schedule"):
        with_calibration(bare, probe)
    with pytest.raises(ConfigError, match="no modelled link has that rate"):
        with_calibration(record, {**probe, "config": {"mbps": 100.0}})


def test_a_calibrated_record_merges_with_a_new_seed_and_is_calibrated_again_as_one(record):
    def probe(slowdown):  # all-gathers ``slowdown`` times as slow as the rate
        sizes = (1_000, 100_000, 10_000_000)
        return {"config": {"mbps": 200.0}, "gathers": [{"bytes": n, "measured_s": slowdown * 8 * n / 200e6}
                                                       for n in sizes],
                "machine": {"host_cpu": f"x{slowdown}"}, "command": "actzip bench link"}

    calibrated = with_calibration(record, probe(2))
    other = copy.deepcopy(record)
    other["config"]["seeds"] = [1]
    for row in other["rows"]:
        row["seed"] = 1
    merged = merge_records([calibrated, other])  # its calibration and the other's lack of one differ: dropped
    assert merged["config"]["exchange"] == () and "link_calibration" not in merged
    assert all("200mbps-50ms calibrated" not in r["links"] for r in merged["rows"])
    assert merged["config"]["keep_replay"]  # every row keeps its schedule
    again = with_calibration(merged, probe(3))  # the new probe's times for every seed, none of the old one's
    assert again["link_calibration"]["machine"]["host_cpu"] == "x3"
    twice = with_calibration(calibrated, probe(3))
    for a, b in zip(twice["rows"], again["rows"][:len(twice["rows"])]):
        assert a["links"]["200mbps-50ms calibrated"] == b["links"]["200mbps-50ms calibrated"]
    slower = [r for r in twice["rows"] if sum(sum(d.values()) for x in r["replay"] for d in x["dp_bytes"])]
    for new, old in zip(twice["rows"], calibrated["rows"]):
        if new in slower:  # replayed again at the slower exchanges, not kept from the first probe
            assert new["links"]["200mbps-50ms calibrated"]["cumulative_s"][-1] > \
                old["links"]["200mbps-50ms calibrated"]["cumulative_s"][-1]
    assert slower


def test_the_cli_says_when_a_merge_drops_a_calibration(record, tmp_path, capsys):
    import json

    from actzip_bench.cli import main

    probe = {"config": {"mbps": 200.0}, "gathers": [{"bytes": n, "measured_s": 8 * n / 100e6}
                                                    for n in (1_000, 100_000, 10_000_000)],
             "machine": {"host_cpu": "here"}, "command": "actzip bench link"}
    other = copy.deepcopy(record)
    other["config"]["seeds"] = [1]
    for row in other["rows"]:
        row["seed"] = 1
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    paths[0].write_text(json.dumps(with_calibration(record, probe)))
    paths[1].write_text(json.dumps(other))
    out = tmp_path / "merged.json"
    assert main(["bench", "decentralized", "--merge", ",".join(map(str, paths)), "--json", str(out)]) == 0
    assert f"the link calibration of {paths[0]} was dropped" in capsys.readouterr().err.replace("\n", "")
    assert "200mbps-50ms calibrated" not in json.loads(out.read_text())["rows"][0]["links"]


def test_dense_loss_is_reached_only_once_a_whole_window_has_run():
    # a task whose first loss is below the final one (a fresh optimizer's first update shakes the model): the
    # first step "reaches" nothing; pca's mean over its last 2 steps does at step 4, dense's own at its last
    def row(method, losses):
        return {"seed": 0, "task": "continual", "method": method, "losses": losses,
                "final_loss": sum(losses[-2:]) / 2, "links": {"l": {"cumulative_s": [float(i + 1) for i in
                                                                                      range(len(losses))]}}}

    rows = [row("dense", [1.0, 3.0, 2.0, 1.4, 1.2, 1.2]), row("pca", [1.0, 3.0, 2.0, 1.2, 1.0, 1.1])]
    set_targets(rows, window=2)
    assert [r["target_step"] for r in rows] == [5, 4] and rows[1]["time_to_target_s"] == 5.0
    rows[1]["losses"] = [1.0, 3.0, 2.5, 2.0, 1.9, 1.8]
    set_targets(rows, window=2)
    assert rows[1]["target_step"] is None and rows[1]["links"]["l"]["time_to_target_s"] is None


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


def test_methods_train_on_until_dense_loss_with_until_target():
    cfg = dataclasses.replace(DecentralizedBenchConfig.quick(), n_embd=32, block_size=16, steps=6, pretrain_steps=2,
                              tasks=("domain",), corpus_bytes=40_000, dataset_windows=32, eval_batches=1,
                              methods=("mask", "dense"), until_target=3.0)
    done = []
    rows = {r["method"]: r for r in run_decentralized(cfg, progress=done.append)["rows"]}
    assert done == ["0 domain dense", "0 domain mask"]  # dense first (the target), each run said once
    assert rows["dense"]["steps_run"] == 6
    mask = rows["mask"]
    assert 6 <= mask["steps_run"] <= 18 and len(mask["losses"]) == mask["steps_run"]
    if mask["steps_run"] < 18:  # it stopped early only because its loss (a one-step window here) reached dense's
        assert mask["losses"][-1] <= rows["dense"]["final_loss"] and mask["target_step"] is not None
    else:
        assert mask["target_step"] is None or mask["target_step"] == 17
    assert mask["final_loss"] == pytest.approx(mask["losses"][5])  # still the loss at step 6 (a one-step window)
    assert mask["tokens"] == rows["dense"]["tokens"]  # equal tokens for the final loss
    with pytest.raises(ConfigError, match="until_target"):
        DecentralizedBenchConfig(until_target=0.5)


def test_a_failure_shows_the_ranks_errors_and_torchruns_root_cause_without_warnings():
    stderr = "\n".join([
        "/x/trainer.py:113: UserWarning: actzip SpectralCorrection: no anchor gradient yet",
        "  self.correction.correct()",
        "actzip: error: rank 1: the peer went away",
        "",
        "Root Cause (first observed failure):",
        "  exitcode  : -6 (pid: 7)  (SIGABRT)",
    ])
    got = failure_lines(stderr).splitlines()
    assert got == ["actzip: error: rank 1: the peer went away", "Root Cause (first observed failure):",
                   "  exitcode  : -6 (pid: 7)  (SIGABRT)"]
    assert len(failure_lines("\n".join(f"line {i}" for i in range(100)), keep=5).splitlines()) == 5
    # a rank's error above the tail comes first, once however many ranks printed it
    crash = ["Traceback (most recent call last):", "[rank2]: RuntimeError: boom"] * 2 + [f"torchrun {i}" for i in range(9)]
    assert failure_lines("\n".join(crash), keep=3).splitlines() == ["[rank2]: RuntimeError: boom", "torchrun 6",
                                                                    "torchrun 7", "torchrun 8"]


def test_a_failure_after_some_runs_keeps_them_in_a_record_marked_failed(monkeypatch):
    """The worker writes each finished run at once; when the processes then fail (here: torchrun's exit made 1
    and the ranks' 'finished' lines dropped, as after a rank's crash), the error carries a record of those runs
    and names the rank's own error even when torchrun's block fills the tail."""
    import subprocess

    import actzip_bench.decentralized as bench

    real = subprocess.Popen

    class Crashed:
        def __init__(self, argv, **kw):
            self.proc = real(argv, **kw)
            self.err = kw["stderr"]
            self.stdout = (line for line in self.proc.stdout if not line.startswith("finished "))

        def wait(self):
            self.proc.wait()
            self.err.write("torch.OutOfMemoryError: CUDA out of memory on rank 3\n")
            self.err.write("\n".join(f"  torchrun block line {i}" for i in range(40)) + "\n")
            self.err.flush()
            return 1

    def popen(argv, *args, **kw):  # only the training processes' launch (machine_record runs commands too)
        return Crashed(argv, **kw) if "torch.distributed.run" in argv else real(argv, *args, **kw)

    monkeypatch.setattr(subprocess, "Popen", popen)
    cfg = dataclasses.replace(DecentralizedBenchConfig.quick(), n_embd=32, block_size=16, steps=3, pretrain_steps=1,
                              tasks=("domain",), corpus_bytes=40_000, dataset_windows=16, eval_batches=1,
                              methods=("dense", "bf16"))
    with pytest.raises(bench.DecentralizedRunError, match="OutOfMemoryError: CUDA out of memory") as err:
        run_decentralized(cfg)
    rec = err.value.record
    assert [r["method"] for r in rec["rows"]] == ["dense", "bf16"] and "OutOfMemoryError" in rec["failed"]
    assert list(rec["config"]["tasks"]) == ["domain"] and {a["method"] for a in rec["aggregate"]} == {"dense", "bf16"}



def test_a_shaped_link_is_named_by_its_numbers_and_its_model_runs_beside_it():
    cfg = DecentralizedBenchConfig(shaped_link=(20, 5), links=((200.0, 50.0),))
    assert cfg.shaped_link == (20.0, 5.0) and cfg.links == ((200.0, 50.0), (20.0, 5.0))
    assert cfg.link_names == ["200mbps-50ms", "20mbps-5ms", "shaped 20mbps-5ms"]
    for bad in ((0, 5), (20,), (20, -1), ("20", 5)):
        with pytest.raises(ConfigError, match="shaped_link"):
            DecentralizedBenchConfig(shaped_link=bad)


@pytest.mark.skipif(netns_unavailable_reason(shaped=True) is not None,
                    reason=f"shaped real link: {netns_unavailable_reason(shaped=True)}")
def test_on_a_shaped_link_every_rank_has_a_namespace_and_step_times_are_measured():
    """The same losses as under torchrun (the link changes times, never values); measured steps are at least the
    two one-way latencies a step's boundary crossing takes each way."""
    cfg = dataclasses.replace(DecentralizedBenchConfig.quick(), n_embd=32, block_size=16, steps=4, pretrain_steps=1,
                              tasks=("domain",), corpus_bytes=40_000, dataset_windows=16, eval_batches=1,
                              methods=("dense", "bf16"), links=((100.0, 20.0),))
    local = run_decentralized(cfg)
    shaped = run_decentralized(dataclasses.replace(cfg, shaped_link=(100.0, 20.0)))
    assert [r["losses"] for r in shaped["rows"]] == [r["losses"] for r in local["rows"]]
    assert shaped["shaping"] in ("netem", "tbf") and "shaping" not in local  # which shaping the times came from
    for row in shaped["rows"]:
        measured = row["links"]["shaped 100mbps-20ms"]
        assert len(measured["cumulative_s"]) == 4 and measured["pp_step_s"] is None
        assert measured["step_s"] > 2 * 0.020
        assert row["links"]["100mbps-20ms"]["step_s"] > 2 * 0.020  # the model of the same link beside it


@pytest.mark.skipif(netns_unavailable_reason(shaped=True) is not None,
                    reason=f"shaped real link: {netns_unavailable_reason(shaped=True)}")
def test_dense_off_the_link_sets_the_others_target_and_its_time_there_is_the_models():
    cfg = dataclasses.replace(DecentralizedBenchConfig.quick(), n_embd=32, block_size=16, steps=4, pretrain_steps=1,
                              tasks=("domain",), corpus_bytes=40_000, dataset_windows=16, eval_batches=1,
                              methods=("dense", "bf16"), links=((100.0, 20.0),), until_target=2.0)
    local = run_decentralized(cfg)
    split = run_decentralized(dataclasses.replace(cfg, shaped_link=(100.0, 20.0), dense_off_link=True))
    mine = {r["method"]: r for r in split["rows"]}
    theirs = {r["method"]: r for r in local["rows"]}
    for m in ("dense", "bf16"):  # the same values, and bf16 trained on to the same target
        assert mine[m]["losses"] == theirs[m]["losses"] and mine[m]["target_loss"] == theirs[m]["target_loss"]
    dense = mine["dense"]["links"]
    assert dense["shaped 100mbps-20ms"]["modelled"] and dense["shaped 100mbps-20ms"]["step_s"] == \
        dense["100mbps-20ms"]["step_s"]
    assert "modelled" not in mine["bf16"]["links"]["shaped 100mbps-20ms"]
    with pytest.raises(ConfigError, match="dense_off_link"):
        DecentralizedBenchConfig(dense_off_link=True)
