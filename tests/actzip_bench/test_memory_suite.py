import json
from pathlib import Path

from actzip_bench.memory_suite import FFN_SWEEP, merge_parts, part_commands, run_suite
from actzip_bench.cli import main


def test_parts_and_the_ffn_sweep(tmp_path):
    cmds = part_commands("ffn", tmp_path, "cuda")
    assert len(cmds) == len(FFN_SWEEP["d"]) * len(FFN_SWEEP["rows"]) * len(FFN_SWEEP["density"]) == 16
    assert cmds[0][:2] == ["bench", "ffn"] and "--device" in cmds[0] and cmds[0][-1].endswith(".json")
    assert part_commands("kernels", tmp_path, "cuda") == [["bench", "kernels", "--json", str(tmp_path / "kernels.json")]]
    assert len(part_commands("ffn", tmp_path, None, ffn_rows=(16384,))) == 4


def test_suite_merges_the_sweep_and_reports_failures(tmp_path):
    ran = []

    def fake(argv):
        ran.append(argv)
        if argv[1] == "gpt":
            raise RuntimeError("no GPU")
        out = Path(argv[argv.index("--json") + 1])
        out.parent.mkdir(exist_ok=True)
        with open(out, "w") as f:
            json.dump({"config": {"argv": argv}}, f)
        return 0

    status = run_suite(tmp_path, ("ffn", "gpt", "kernels"), None, (4096,), fake)
    assert status["ffn"] == "ok" and status["kernels"] == "ok" and "no GPU" in status["gpt"]
    merged = json.loads((tmp_path / "ffn.json").read_text())
    assert len(merged) == 4 and not (tmp_path / "ffn-parts").exists()
    assert merge_parts(tmp_path) is None  # nothing left to merge


def test_cli_exit_status_says_a_part_failed(tmp_path, monkeypatch):
    monkeypatch.setattr("actzip_bench.memory_suite.part_commands",
                        lambda part, out, device, rows=None: [["bench", "nope"]])
    assert main(["bench", "memory", "--out", str(tmp_path), "--parts", "bits"]) == 1
    assert main(["bench", "memory", "--out", str(tmp_path), "--parts", "nope"]) == 2


def test_merge_parts_from_a_shell_names_the_sweep(tmp_path):
    import subprocess
    import sys

    parts = tmp_path / "ffn-fp8-parts"
    parts.mkdir()
    for density in ("low", "mid"):
        (parts / f"{density}.json").write_text(json.dumps({"density": density}))
    done = subprocess.run([sys.executable, "-m", "actzip_bench.memory_suite", str(tmp_path), "ffn-fp8"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "ffn-fp8.json").read_text()) == [{"density": "low"}, {"density": "mid"}]
    assert not parts.exists() and not (tmp_path / "ffn.json").exists()
