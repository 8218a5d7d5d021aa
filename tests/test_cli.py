"""Bad input fails before training with exit code != 0 and one readable line."""
import json

import pytest


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["task=nope"], "unknown task 'nope'; valid: induction, interference, recall"),
        (["model=transformerxl"], "unknown model 'transformerxl'; valid:"),
        (["trainer.lrr=0.1"], "unknown key 'trainer.lrr'"),
        (["trainer.lr=fast"], "bad value for 'trainer.lr'"),
        (["model.d_model=0"], "d_model"),
        (["trainer.batch_size=-4"], "trainer.batch_size must be positive"),
        (["model.d_model=64", "model.n_heads=3"], "n_heads"),
        (["task.seq_len=8", "task.num_pairs=8"], "seq_len"),
        (["trainer.precision=fp8"], "unknown trainer.precision 'fp8'"),
    ],
)
def test_bad_input_is_one_line_before_training(run_harness, tmp_path, overrides, expected):
    proc = run_harness(*overrides, "logger=none", f"out_dir={tmp_path / 'run'}", timeout=120)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("harness: error: ")
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "run" / "results.json").exists()  # nothing ran


def test_unknown_choice_names_every_valid_option(run_harness):
    proc = run_harness("model=nope", timeout=120)
    for name in ("softmax", "linear", "elu", "favor", "retnet", "mamba"):
        assert name in proc.stderr


def test_single_run_writes_outputs(run_harness, tmp_path):
    out = tmp_path / "run"
    proc = run_harness("task=recall", "model=softmax", "trainer=debug", "logger=none",
                       f"out_dir={out}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "accuracy" in proc.stdout and "results.json" in proc.stdout
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "ok" and res["mode"] == "train"
    assert (out / "config.yaml").exists() and (out / "model.pt").exists()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) >= 2 and all("accuracy" in json.loads(x) for x in lines)
