"""The prompt benchmark: its protocol end to end on a tiny model, the batched greedy decoder, the reference model's
file, the cost model and the per-seed merge."""

import json

import pytest
import torch

from actzip.errors import ConfigError, DataError
from actzip_bench.cli import main
from actzip_bench.data.instructions import InstructionSuite, InstructionSuiteConfig, prompt_ids, query_ids
from actzip.prompt.layers import forward_logits
from actzip_bench.prompt_bench import PromptBenchConfig, prefill_cost, run_prompt_bench
from actzip_bench.prompt_methods import FitSettings, evaluate_tasks, greedy_answers
from actzip_bench.prompt_model import (PromptModelConfig, load_reference_model, save_reference_model,
                                       train_reference_model)

TINY = PromptModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=112, steps=30, batch_size=8, corpus_rows=0,
                         warmup=5)


def _cfg(tmp_path, **kw):
    base = dict(model=TINY, fit=FitSettings(steps=4, extract_layer=1, inject_layer=0), seeds=(0,),
                splits=("heldout_labels",), min_tasks=0, n_fit=2, n_test=3, sweep_extract=(1, 2), sweep_inject=(0,),
                sweep_tasks=1, device="cpu", model_dir=str(tmp_path))
    base.update(kw)
    return PromptBenchConfig(**base)


def test_protocol_rows_are_complete_and_a_saved_model_gives_the_same_rows(tmp_path):
    cfg = _cfg(tmp_path)
    first = run_prompt_bench(cfg)
    tasks = InstructionSuite().tasks("heldout_labels", 1, 0)
    assert len(first["rows"]) == len(tasks) * 6
    for row in first["rows"]:
        assert 0.0 <= row["accuracy"] <= 1.0 and row["split"] == "heldout_labels"
        want = {"full": row["prompt_bytes"], "none": 0, "i2cl": 0}.get(row["method"], 1)
        assert row["prompt_positions"] == want
    assert (tmp_path / "reference-seed0.pt").is_file()
    assert {(r["extract_layer"], r["inject_layer"]) for r in first["sweep"]} == {(1, 0), (2, 0)}
    assert set(first["summary"]["heldout_labels"]) == {"full", "none", "vector", "task_vector", "soft_prompt", "i2cl"}
    assert first["cost"]["kv_ratio"] > 1
    second = run_prompt_bench(cfg)  # loads the model the first run saved
    assert second["training"][0]["loaded_from"].endswith("reference-seed0.pt")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "fit_seconds"} for r in rows]  # noqa: E731
    assert strip(second["rows"]) == strip(first["rows"])


def test_a_saved_model_trained_otherwise_is_refused(tmp_path):
    run_prompt_bench(_cfg(tmp_path, methods=("none",)))
    with pytest.raises(ConfigError, match="another model"):
        run_prompt_bench(_cfg(tmp_path, methods=("none",), model=PromptModelConfig(**{**TINY.__dict__, "steps": 31})))


def test_i2cl_with_no_fit_steps_answers_as_no_prompt():
    model = TINY.build().eval()
    suite = InstructionSuite()
    tasks = suite.tasks("heldout_family", 1, 0)[:3]
    pairs = [suite.split_examples(t, 2, 4, 0) for t in tasks]
    out = evaluate_tasks(model, tasks, [f for f, _ in pairs], [t for _, t in pairs], ("none", "i2cl"),
                         FitSettings(steps=0, extract_layer=1, inject_layer=0))
    for none, i2cl in zip(out["none"], out["i2cl"]):
        assert i2cl.answers == none.answers and i2cl.prompt_positions == 0


def test_tasks_answered_together_answer_as_alone():
    """Rows of several tasks in one batch, each with its own vector (and layer), give each task's own answers."""
    torch.manual_seed(1)
    model = TINY.build().eval()
    suite = InstructionSuite()
    tasks = suite.tasks("heldout_labels", 1, 0)[:3] + suite.tasks("heldout_family", 1, 0)[:2]
    pairs = [suite.split_examples(t, 3, 4, i) for i, t in enumerate(tasks)]
    fits, tests = [f for f, _ in pairs], [t for _, t in pairs]
    settings = FitSettings(steps=3, extract_layer=1, inject_layer=0)
    methods = ("full", "task_vector", "vector")
    together = evaluate_tasks(model, tasks, fits, tests, methods, settings)
    for i in range(len(tasks)):
        alone = evaluate_tasks(model, tasks[i:i + 1], fits[i:i + 1], tests[i:i + 1], methods, settings)
        for m in methods:
            assert together[m][i].answers == alone[m][0].answers, (m, i)
    assert {r.detail["layer"] for r in together["task_vector"]} <= {1}
    with pytest.raises(ConfigError, match="one fit and one test list per task"):
        evaluate_tasks(model, tasks, fits[:1], tests, methods, settings)


def test_batched_greedy_matches_one_row_at_a_time():
    torch.manual_seed(0)
    model = TINY.build().eval()
    task = InstructionSuite().tasks("train", 1, 0)[3]
    rows = [torch.cat([prompt_ids(task), query_ids(q)]) for q in ("ab", "hello", "x")] + [query_ids("abcdefgh")]
    batched = greedy_answers(model, rows, 6)
    alone = [greedy_answers(model, [r], 6)[0] for r in rows]
    assert batched == alone
    # the plain loop: append the argmax until the end byte
    seq = rows[1].clone()
    out = []
    for _ in range(6):
        tok = int(forward_logits(model, seq[None])[0, -1].argmax())
        seq = torch.cat([seq, torch.tensor([tok])])
        if tok == ord("\n"):
            break
        out.append(tok)
    assert batched[1].rstrip("\x00") == bytes(out).decode("latin-1")


def test_reference_model_file_round_trip(tmp_path):
    model, log = train_reference_model(TINY, InstructionSuiteConfig(), 0, torch.device("cpu"))
    assert log["log"][-1]["answer_loss"] < log["log"][0]["answer_loss"]
    save_reference_model(tmp_path / "m.pt", model, TINY, InstructionSuiteConfig(), log)
    again, cfg, suite_cfg, _ = load_reference_model(tmp_path / "m.pt", torch.device("cpu"))
    x = torch.randint(0, 256, (2, 20))
    assert cfg == TINY and suite_cfg == InstructionSuiteConfig()
    assert torch.equal(forward_logits(model, x), forward_logits(again, x))
    with pytest.raises(DataError, match="does not exist"):
        load_reference_model(tmp_path / "none.pt", torch.device("cpu"))


def test_prefill_cost_by_hand():
    cfg = PromptModelConfig(n_layer=2, n_head=2, n_embd=8, steps=10, warmup=1)
    cost = prefill_cost(cfg, 4)
    assert cost["flops"] == 2 * 4 * 12 * 2 * 64 + 2 * 2 * 16 * 8
    assert cost["kv_bytes"] == 2 * 2 * 4 * 8 * 2


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="unknown methods"):
        PromptBenchConfig(methods=("full", "oracle"))
    with pytest.raises(ConfigError, match="inject_layer"):
        PromptBenchConfig(model=TINY, fit=FitSettings(extract_layer=1, inject_layer=2))
    with pytest.raises(ConfigError, match="unknown splits"):
        PromptBenchConfig(splits=("test",))


def test_cli_merges_per_seed_records(tmp_path, capsys):
    paths = []
    for seed in (0, 1):
        rec = run_prompt_bench(_cfg(tmp_path, seeds=(seed,), methods=("full", "none"), sweep_extract=()))
        rec["command"] = f"seed {seed}"
        paths.append(tmp_path / f"s{seed}.json")
        paths[-1].write_text(json.dumps(rec))
    out = tmp_path / "merged.json"
    assert main(["bench", "prompt", "--merge", *map(str, paths), "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["config"]["seeds"] == [0, 1]
    assert len(merged["summary"]["heldout_labels"]["full"]["per_seed"]) == 2
    assert "prompt -> one vector" in capsys.readouterr().out
    assert main(["bench", "prompt", "--merge", str(paths[0]), str(paths[0])]) == 2  # a seed twice


def test_a_sweep_alone_runs_on_the_saved_model_and_merges_beside_the_seeds(tmp_path):
    main_rec = run_prompt_bench(_cfg(tmp_path, methods=("full", "vector"), sweep_tasks=0))
    assert main_rec["sweep"] == []
    sweep_rec = run_prompt_bench(_cfg(tmp_path, methods=("full", "vector"), sweep_only=True))
    assert sweep_rec["rows"] == [] and sweep_rec["training"][0]["loaded_from"].endswith("reference-seed0.pt")
    paths = []
    for name, rec in (("main", main_rec), ("sweep", sweep_rec)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(rec))
    out = tmp_path / "merged.json"
    assert main(["bench", "prompt", "--merge", *map(str, paths), "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["sweep"] == sweep_rec["sweep"] and merged["rows"] == main_rec["rows"]
    assert (tmp_path / "merged.png").is_file()
    with pytest.raises(ConfigError, match="model_dir"):
        PromptBenchConfig(sweep_only=True)
