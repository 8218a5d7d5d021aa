"""analysis.loader on synthetic results trees: sweeps, single runs, failures, half-written sweeps."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_results
from analysis.synthetic.capacity import CAPACITY, CAPACITY_TEST_N

from analysis.loader import NoResultsError, find_results, load_all, load_results, results_root


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Path]:
    return make_results.write_loader_cases(tmp_path_factory.mktemp("cases"))


CAPACITY_RUNS = len(CAPACITY) * 4 * 5  # labels x (training N, the reference one at 2 lrs) x seeds


def test_multirun_gives_one_row_per_run_in_job_order(tree):
    runs = load_results(tree / "capacity")
    assert len(runs) == CAPACITY_RUNS + 1                    # + 1 failed
    assert list(runs.columns[:6]) == ["run_dir", "mode", "status", "error", "task", "model"]
    assert [Path(d).name for d in runs["run_dir"]] == [str(i) for i in range(CAPACITY_RUNS + 1)]
    assert runs["status"].value_counts().to_dict() == {"ok": CAPACITY_RUNS, "failed": 1}
    assert set(runs["task"]) == {"interference"}
    elu = runs[runs["model"] == "elu"]
    assert elu["config.seed"].tolist() == [0, 1, 2, 3, 4] * 4   # the seed, lr and N columns of each run
    assert elu["config.trainer.lr"].tolist() == [3e-3] * 5 + [3e-3] * 5 + [1e-2] * 5 + [3e-3] * 5
    assert elu["config.task.num_pairs"].tolist() == [8] * 5 + [16] * 10 + [32] * 5
    assert (elu["config.model.d_model"] == 32).all() and (elu["summary.d_key"] == 16).all()
    assert pd.api.types.is_float_dtype(runs["summary.accuracy"])


def test_metrics_jsonl_is_the_metrics_table(tree, tmp_path):
    metrics = load_results(tree / "sharpness", "metrics")
    runs = load_results(tree / "sharpness")
    assert set(metrics["run_dir"]) == set(runs["run_dir"])   # every run's learning curve
    first = (tree / "sharpness" / "0" / "metrics.jsonl").read_text().splitlines()
    rows = metrics[metrics["run_dir"] == (tree / "sharpness" / "0").as_posix()]
    assert rows["step"].tolist() == [json.loads(line)["step"] for line in first]
    assert (rows["split"] == "val").all() and "summary.stop_reason" in rows.columns
    # a run killed mid-write leaves a partial last line: the rows before it are kept
    run = tmp_path / "run"
    make_results.write_run(run, make_results.result("train", "recall", "elu", {}, {"accuracy": 0.5}))
    (run / "metrics.jsonl").write_text('{"step": 10, "split": "val", "accuracy": 0.2}\n{"step": 20, "spl')
    assert load_results(run, "metrics")["step"].tolist() == [10]
    assert load_results(tree / "mqar", "metrics").empty      # runs without the file add no rows


def test_slices_rows_carry_their_run(tree):
    slices = load_results(tree / "capacity", "slices")
    assert len(slices) == CAPACITY_RUNS * len(CAPACITY_TEST_N)  # the failed run has no slices
    wanted = {"run_dir", "model", "slice", "value", "accuracy", "config.seed", "summary.d_key"}
    assert wanted <= set(slices.columns)
    first = json.loads((tree / "capacity" / "0" / "results.json").read_text())
    rows = slices[slices["run_dir"] == (tree / "capacity" / "0").as_posix()]
    assert rows["value"].tolist() == [s["value"] for s in first["slices"]]
    assert rows["accuracy"].tolist() == pytest.approx([s["accuracy"] for s in first["slices"]])
    assert (rows["model"] == first["model"]).all()
    assert (rows["summary.accuracy"] == first["summary"]["accuracy"]).all()


def test_table_field_keeps_its_name_and_the_run_column_moves(tree):
    probe = load_results(tree / "snr", "probe")
    assert set(probe["model"]) == {"linear", "elu", "favor"}  # the probed mixer
    assert set(probe["run.model"]) == {"linear"}              # the run's own model
    assert len(probe) == 3 * 2 * 5


def test_single_run_directory_and_results_file(cases):
    runs = load_results(cases["single"])
    assert len(runs) == 1 and runs.loc[0, "run_dir"] == cases["single"].as_posix()
    assert runs.loc[0, "summary.accuracy"] == 0.875
    same = load_results(cases["single"] / "results.json", "slices")
    assert same["value"].tolist() == [4, 8] and same["accuracy"].tolist() == [1.0, 0.75]


def test_failed_run_is_a_row_without_tables(cases):
    runs = load_results(cases["failed"])
    assert runs.loc[0, "status"] == "failed"
    assert "out of memory" in runs.loc[0, "error"]
    assert not any(c.startswith("summary.") for c in runs.columns)
    slices = load_results(cases["failed"], "slices")
    assert slices.empty and {"run_dir", "status", "model"} <= set(slices.columns)


def test_missing_table_is_an_empty_frame(cases):
    heads = load_results(cases["no_tables"], "heads")
    assert heads.empty and "run_dir" in heads.columns
    assert load_results(cases["no_tables"]).loc[0, "summary.accuracy"] == 1.0


def test_partial_sweep_skips_unfinished_and_keeps_unreadable_as_failed(cases):
    runs = load_results(cases["partial"])
    assert [Path(d).name for d in runs["run_dir"]] == ["0", "1", "3", "10"]  # 2 has no results.json
    broken = runs.set_index(runs["run_dir"].map(lambda d: Path(d).name)).loc["3"]
    assert broken["status"] == "failed" and "unreadable results.json" in broken["error"]
    # Config only in .hydra/config.yaml: read from there, nested keys flattened.
    from_hydra = runs.iloc[-1]
    assert from_hydra["model"] == "linear"
    assert from_hydra["config.model.d_model"] == 48 and from_hydra["config.seed"] == 3
    assert len(load_results(cases["partial"], "slices")) == 2 * 2  # jobs 0 and 10


def test_no_results_raises_a_clear_error(cases, tmp_path):
    with pytest.raises(NoResultsError, match="no results.json under"):
        load_results(cases["empty"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_results(tmp_path / "nowhere")


def test_load_all_is_every_table_in_one_long_frame(tree):
    long = load_all(tree)
    assert long.columns[0] == "table"
    counts = long["table"].value_counts().to_dict()
    per_experiment = [load_results(tree / e) for e in make_results.EXPERIMENTS]
    assert counts["runs"] == sum(len(r) for r in per_experiment)
    tables = ("slices", "heads", "probe", "cost", "settings", "metrics", "layers", "memory", "intervene", "ablate")
    for name in tables:
        assert counts[name] == len(load_results(tree, name))
    # layers, memory: each layer's mixer and its memory by kind; intervene: the interchange map;
    # ablate: a run's own ablation rows (trainer.ablate)
    assert set(counts) == {"runs", *tables}


def test_nested_config_lists_and_extra_scalars(tmp_path):
    from harness.config.digest import config_hash

    config = {"model": {"d_model": 32}, "task": {"test_num_pairs": [4, 8]}}
    payload = {"schema": 1, "mode": "train", "status": "ok", "error": None, "task": "recall",
               "model": "elu", "config_hash": config_hash(config), "config": config,
               "summary": {"accuracy": 0.5}, "env": {"versions": {"torch": "2.13"}}}
    (tmp_path / "results.json").write_text(json.dumps(payload))
    run = load_results(tmp_path).iloc[0]
    assert run["status"] == "ok" and run["config.model.d_model"] == 32
    assert run["config.task.test_num_pairs"] == (4, 8)      # hashable, so groupby works
    assert run["config_hash"] == config_hash(config) and run["env.versions.torch"] == "2.13"


def test_results_root_follows_the_environment(monkeypatch):
    monkeypatch.delenv("HARNESS_RESULTS", raising=False)
    assert results_root() == Path("results/quick") and results_root("paper") == Path("results/paper")
    monkeypatch.setenv("HARNESS_RESULTS", "/data/sweeps")
    assert results_root() == Path("/data/sweeps")
