"""The learning-rate edge rule: a mixer whose chosen rate sits at its grid's edge gets a second
sweep at the next rate out, and its runs are marked lr_extended in the loaded frame."""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from analysis import figures, lr_edge
from analysis.loader import load_all

GRID = {"model": ["elu", "mamba", "softmax"], "trainer.lr": ["1e-3", "3e-3", "1e-2"]}
# mean validation accuracy: elu best at the lowest rate, mamba at the highest, softmax inside
SCORES = {"elu": {1e-3: 0.9, 3e-3: 0.5, 1e-2: 0.2}, "mamba": {1e-3: 0.1, 3e-3: 0.4, 1e-2: 0.8},
          "softmax": {1e-3: 0.5, 3e-3: 0.99, 1e-2: 0.7}}


def _run(folder: Path, model: str, lr: float, score: float) -> None:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(
        f"- model={model}\n- trainer.lr={lr:g}\n- seed=0\n- +experiment=x\n")
    (folder / "results.json").write_text(json.dumps({
        "schema": 1, "mode": "train", "status": "ok", "error": None, "task": "recall", "model": model,
        "config": {"model.name": model, "trainer.lr": lr}, "summary": {"accuracy": score, "val_accuracy": score},
        "slices": [], "settings": [], "env": {}}))


def _sweep(root: Path) -> Path:
    sweep = root / "x"
    i = 0
    for model, per_lr in SCORES.items():
        for lr, score in per_lr.items():
            _run(sweep / str(i), model, lr, score)
            i += 1
    return sweep


def test_edges_get_the_next_rate_out(tmp_path):
    todo = lr_edge.extensions(lr_edge.run_scores(_sweep(tmp_path)), lr_edge.grid_rates(GRID))
    assert set(todo) == {1e-3 / (3e-3 / 1e-3), 1e-2 * (1e-2 / 3e-3)}
    assert todo[1e-3 / 3] == ["elu"] and todo[1e-2 * 1e-2 / 3e-3] == ["mamba"]


def test_a_tie_at_the_edge_is_not_extended():
    """Accuracy flat across rates (within lr_edge.TIE) brackets nothing: no second stage."""
    rows = [{"overrides": {"model": "elu"}, "lr": lr, "score": score}
            for lr, score in ((3e-3, 0.998), (1e-2, 0.999))]
    assert lr_edge.extensions(rows, [3e-3, 1e-2]) == {}
    rows[1]["score"] = 0.998 + 2 * lr_edge.TIE
    assert lr_edge.extensions(rows, [3e-3, 1e-2]) == {1e-2 * (1e-2 / 3e-3): ["elu"]}


def test_one_rate_has_no_edge_to_extend():
    assert lr_edge.grid_rates({"trainer.lr": ["3e-3"]}) == []


def test_the_second_stage_runs_and_is_marked(tmp_path):
    sweep = _sweep(tmp_path)
    calls = []

    def runner(cmd, check=False):
        calls.append(cmd)
        out = Path(next(c for c in cmd if c.startswith("hydra.sweep.dir=")).split("=", 1)[1].strip("'"))
        model = next(c for c in cmd if c.startswith("model=")).split("=", 1)[1]
        lr = float(next(c for c in cmd if c.startswith("trainer.lr=")).split("=", 1)[1])
        _run(out / "0", model, lr, 0.95)
        return subprocess.CompletedProcess(cmd, 0)

    ran = figures.extend_edge_rates(tmp_path, "x", "quick", runner, params=GRID)
    assert len(ran) == 2 and len(calls) == 2
    assert any("model=elu" in c and "trainer.lr=0.000333" in c for c in calls)
    runs = load_all(sweep)
    runs = runs[runs["table"] == "runs"]
    extended = runs[runs["lr_extended"].fillna(False).astype(bool)]
    assert sorted(extended["model"]) == ["elu", "mamba"] and len(runs) == 11
    # a second pass finds the extensions done and runs nothing
    assert figures.extend_edge_rates(tmp_path, "x", "quick", runner, params=GRID) == [] and len(calls) == 2


def test_the_pilot_chooses_a_rate_per_mixer_on_validation(tmp_path):
    choices = lr_edge.pilot_choices(lr_edge.run_scores(_sweep(tmp_path)))
    chosen = {r["model"]: r["lr"] for r in choices if r["chosen"]}
    assert chosen == {"elu": 1e-3, "mamba": 1e-2, "softmax": 3e-3}
    edge = {r["model"] for r in choices if r["chosen_at_edge"]}
    assert edge == {"elu", "mamba"} and len(choices) == 9
    groups = lr_edge.rate_groups(choices)
    assert groups == {(1e-3, None): ["elu"], (3e-3, None): ["softmax"], (1e-2, None): ["mamba"]}
    assert lr_edge.chosen_overrides(3e-3, "8", ["softmax"]) == ["model=softmax", "trainer.lr=0.003", "model.d_model=8"]


def test_the_pilot_passes_over_a_rate_whose_rounding_twins_end_apart():
    """A rate at which a 1e-6 perturbation of the initial weights moves the final validation loss
    by more than lr_edge.ROUNDING_GAP is not chosen, however well it scores, while another holds."""
    def row(lr, seed, jitter, score, loss):
        overrides = {"model": "favor", "trainer.lr": f"{lr:g}", "seed": str(seed)}
        if jitter:
            overrides[lr_edge.JITTER_KEY] = str(jitter)
        return {"overrides": overrides, "lr": lr, "score": score, "val_loss": loss}

    rows = [row(1e-2, 0, 0, 0.50, 1.70), row(1e-2, 0, 1e-6, 0.50, 1.70 + 4e-5),
            row(3e-2, 0, 0, 0.62, 1.60), row(3e-2, 0, 1e-6, 0.55, 1.75)]
    choices = {r["lr"]: r for r in lr_edge.pilot_choices(rows)}
    assert choices[3e-2]["rounding_sensitive"] and choices[3e-2]["rounding_gap"] == pytest.approx(0.15)
    assert not choices[1e-2]["rounding_sensitive"] and choices[1e-2]["rounding_gap"] == pytest.approx(4e-5)
    assert choices[1e-2]["chosen"] and not choices[3e-2]["chosen"]
    assert choices[3e-2]["val_accuracy"] == pytest.approx(0.585)  # both twins are runs of the rate
    # where every rate is sensitive, the best is chosen and says so; without twins nothing is known
    rows[1]["val_loss"] = 1.9
    both = {r["lr"]: r for r in lr_edge.pilot_choices(rows)}
    assert both[3e-2]["chosen"] and both[3e-2]["rounding_sensitive"] and both[1e-2]["rounding_sensitive"]
    alone = lr_edge.pilot_choices([rows[0], rows[2]])
    assert all(math.isnan(r["rounding_gap"]) and not r["rounding_sensitive"] for r in alone)
    assert next(r for r in alone if r["chosen"])["lr"] == 3e-2


def _pilot_runner(calls: list, scores: dict):
    """A stand-in for subprocess.run: records each command, and where it is capacity's rate pilot
    writes one finished run per (model, rate) with that validation score."""
    def runner(cmd, check=False):
        calls.append(cmd)
        out = Path(next(c for c in cmd if c.startswith("hydra.sweep.dir=")).split("=", 1)[1].strip("'"))
        if out.name == "capacity_rates":
            for i, ((model, lr), score) in enumerate(scores.items()):
                _run(out / str(i), model, lr, score)
        return subprocess.CompletedProcess(cmd, 0)

    return runner


def test_the_experiment_runs_each_mixer_at_its_pilot_rate(tmp_path, monkeypatch):
    """capacity has a pilot (capacity_rates.yaml) and one rate: the pipeline runs the pilot, writes
    its choices, then one capacity sweep per chosen rate with that rate's mixers."""
    from analysis import pipeline

    calls = []
    runner = _pilot_runner(calls, {("elu", 3e-3): 0.5, ("elu", 1e-2): 0.9, ("deltanet", 3e-3): 0.9,
                                   ("deltanet", 1e-2): 0.5})
    monkeypatch.setattr(pipeline, "extend_edge_rates", lambda *a, **k: [])
    assert pipeline.run_missing_sweeps(tmp_path, ["capacity"], "quick", runner) == ["capacity"]
    assert "+experiment=capacity_rates" in calls[0]
    rest = sorted(" ".join(c) for c in calls[1:])
    assert len(rest) == 2 and "model=deltanet trainer.lr=0.003" in rest[0] and "model=elu trainer.lr=0.01" in rest[1]
    assert "/capacity/lr_0.003" in rest[0].replace("\\", "/")
    assert (tmp_path / "capacity_rates" / "chosen_rates.csv").read_text().count("\n") == 5


def test_an_experiment_trained_as_anothers_runs_at_that_ones_pilot_rate(tmp_path, monkeypatch):
    """findings/capacity_length names findings/capacity's pilot (analysis.rate_pilot): the
    pipeline runs its own mixer (retnet) at the rate that pilot chose for it, not at the file's
    fallback rate, and none of the pilot's other mixers."""
    from analysis import pipeline

    calls = []
    runner = _pilot_runner(calls, {("elu", 3e-3): 0.5, ("elu", 1e-2): 0.9, ("retnet", 3e-3): 0.9,
                                   ("retnet", 1e-2): 0.5})
    monkeypatch.setattr(pipeline, "extend_edge_rates", lambda *a, **k: [])
    assert pipeline.rate_pilot("findings", "capacity_length") == "capacity_rates"
    assert pipeline.rate_pilot("findings", "capacity") == "capacity_rates"  # its own, by name
    assert pipeline.run_missing_sweeps(tmp_path, ["capacity_length"], "findings", runner) == ["capacity_length"]
    assert "+experiment=findings/capacity_rates" in calls[0]
    rest = [" ".join(c) for c in calls[1:]]
    assert len(rest) == 1 and "+experiment=findings/capacity_length" in rest[0]
    assert "model=retnet trainer.lr=0.003" in rest[0] and "elu" not in rest[0]


def test_an_experiment_that_does_not_compose_has_no_pilot_and_does_not_stop_the_others(tmp_path, monkeypatch):
    """Looking for a named pilot composes the experiment; where that fails, the experiment runs
    without a pilot and its own sweep reports the error (the figures command goes on)."""
    from analysis import pipeline

    def broken(*args, **kwargs):
        raise ValueError("does not compose")

    monkeypatch.setattr(pipeline, "compose_experiment", broken)
    assert pipeline.pilot_rates(tmp_path, "mqar", "quick", runner=lambda *a, **k: 1 / 0) == {}
    assert pipeline.rate_pilot("quick", "capacity") == "capacity_rates"  # its own: nothing composed


def test_a_sweep_the_profile_does_not_have_is_left_out(tmp_path, capsys):
    """A figure may read a sweep only another profile runs: the quick profile runs nothing for it."""
    from analysis import pipeline

    calls = []
    assert pipeline.run_missing_sweeps(tmp_path, ["no_such_sweep"], "quick",
                                       lambda cmd, check=False: calls.append(cmd)) == []
    assert calls == [] and "the quick profile has no such experiment" in capsys.readouterr().err
    assert pipeline.in_profile("quick", "capacity") and pipeline.in_profile("paper", "capacity")
