"""The real process: bad input fails before training with exit code 2 and one readable line.

The full table of bad inputs runs in-process in tests/test_validation.py; here one case of
each kind (unknown choice, unknown key, wrong type, value out of range) goes through
`python -m harness`.
"""
import json

import pytest


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["task=nope"], "unknown task 'nope'; valid: forgetting, induction, interference, needle, recall"),
        (["trainer.lrr=0.1"], "unknown key 'trainer.lrr'; valid keys here: ablate, batch_size,"),
        (["trainer.lr=fast"], "bad value for 'trainer.lr': must be a number, got 'fast'"),
        (["model.d_model=0"], "model.d_model must be a positive integer, got 0"),
    ],
)
def test_bad_input_is_one_line_before_training(run_harness, tmp_path, overrides, expected):
    proc = run_harness(*overrides, "logger=none", f"out_dir={tmp_path / 'run'}", timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("harness: error: ")
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "run" / "results.json").exists()  # nothing ran


def test_hydra_full_error_shows_the_traceback(run_harness, tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    proc = run_harness("model.d_model=0", "logger=none", f"out_dir={tmp_path / 'run'}", timeout=120)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr
    assert "model.d_model must be a positive integer, got 0" in proc.stderr
    assert not (tmp_path / "run" / "results.json").exists()


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


@pytest.mark.parametrize("value", ["a" * 100_000, "pkg." * 25_000 + "Mixer", "x " * 50_000],
                         ids=["a-name", "a-dotted-path", "many-words"])
def test_a_huge_value_is_cut_in_the_error_line(value, tmp_path, capsys, monkeypatch):
    """The line names the value by its start and end, and says how much is left out."""
    import sys

    from harness.run import cli

    monkeypatch.setattr(sys, "argv", ["harness"])
    with pytest.raises(SystemExit) as stop:
        cli.main([f"model.name='{value}'", "trainer=debug", "logger=none", f"out_dir={tmp_path / 'run'}"])
    assert stop.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("harness: error: "), lines[0][:300]
    assert len(lines[0]) < 2_100 and "characters]..." in lines[0] and "model.name" in lines[0]
    assert value[:100] in lines[0]


def test_shown_cuts_only_what_is_long():
    from harness.errors import LONG_VALUE, shown

    path = "/very/" + "deep/" * 60 + "results.json"  # a long path still reads whole
    assert len(path) < LONG_VALUE and shown(f"cannot write {path}: full") == f"cannot write {path}: full"
    cut = shown("model.name=" + "a" * 10_000 + " is unknown")
    assert cut.startswith("model.name=aaa") and cut.endswith("aaa is unknown")
    assert "...[9,665 characters]..." in cut
