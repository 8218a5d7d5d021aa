"""Run identities that cannot go stale. A derived run (mode=ablate) holds its source run's config
hash and model.pt checksum in its own config and hash: an ablation sweep rerun after its source
was retrained runs again instead of keeping rows about the old model, and a source that changes
between the plan and the measurement is refused. A results.json whose recorded config does not
hash to its config_hash (edited to describe another stack) is refused by harness.load_run, kept
as a failed run by the loader, and not taken as finished by a sweep's skip check.

The source runs are made without training (model.pt at initialisation, results.json as a
finished run writes it): identities are files, not accuracies."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_untrusted_runs import edit_results, finished_run

import harness
from analysis.loader import load_results
from harness.config.compose import compose_config
from harness.errors import DamagedFile
from harness.outputs import checkpoint
from harness.outputs.results import RESULTS_FILE, read_results
from harness.outputs.rundir import find_completed
from harness.run.job import plan_for

ABLATE = ["mode=ablate", "ablate.examples=8", "ablate.kinds=[zero]", "ablate.patch=false", "logger=none",
          "trainer.threads=1"]


def retrain(run: Path) -> str:
    """The run's model.pt replaced by other weights of the same config (a retrain with
    +overwrite=true), results.json recording the new checksum; returns it."""
    payload = torch.load(run / checkpoint.MODEL_FILE, weights_only=True)
    payload["model"] = {k: v + 1 if v.is_floating_point() else v for k, v in payload["model"].items()}
    files = {checkpoint.MODEL_FILE: checkpoint.save_model(run, payload)}
    edit_results(run, lambda r: r.update(files=files))
    return files[checkpoint.MODEL_FILE]["sha256"]


def test_an_ablation_sweep_runs_again_after_its_source_is_retrained(run_harness, tmp_path):
    source = finished_run(tmp_path / "source", ["model=elu"])
    sweep = [*ABLATE, f"ablate.run={source}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    first = run_harness("-m", *sweep, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    done = tmp_path / "sweep" / "0" / RESULTS_FILE
    old = json.loads(done.read_text())
    assert old["config"]["source.model_sha256"] == json.loads((source / RESULTS_FILE).read_text())[
        "files"]["model.pt"]["sha256"]
    new_sha = retrain(source)
    again = run_harness("-m", *sweep, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "skip" not in again.stdout, again.stdout[-3000:]  # rows about the old model are not kept
    now = json.loads(done.read_text())
    assert now["config"]["source.model_sha256"] == new_sha and now["config_hash"] != old["config_hash"]


def test_the_identity_of_a_derived_run_holds_its_source_and_changes_with_it(tmp_path):
    source = finished_run(tmp_path / "source", ["model=elu"])
    recorded = json.loads((source / RESULTS_FILE).read_text())
    cfg = compose_config([*ABLATE, f"ablate.run={source}"])
    before = plan_for(cfg)
    assert before.flat["source.config_hash"] == recorded["config_hash"]
    assert before.flat["source.model_sha256"] == recorded["files"]["model.pt"]["sha256"]
    retrain(source)
    assert plan_for(cfg).digest != before.digest


def test_a_source_changed_after_the_plan_is_refused(tmp_path):
    from harness.outputs.source import open_source

    source = finished_run(tmp_path / "source", ["model=elu"])
    plan = plan_for(compose_config([*ABLATE, f"ablate.run={source}"]))
    retrain(source)
    with pytest.raises(ValueError, match=r"ablate\.run=.*changed after this run was planned"):
        open_source(plan)


# ----- a results.json that lies ----------------------------------------------------------------------


@pytest.fixture
def lying(tmp_path) -> Path:
    """A finished hybrid (elu, softmax) whose results.json was edited to describe another stack
    (softmax, elu): its model label, recorded config and layers table, the config hash kept."""
    run = finished_run(tmp_path / "run", ["model.layers=[elu,softmax]"])

    def edit(r):
        r.update(model="softmax+elu", layers=[{"layer": 0, "mixer": "softmax"}, {"layer": 1, "mixer": "elu"}])
        r["config"]["model.layers"] = ["softmax", "elu"]

    edit_results(run, edit)
    return run


def test_load_run_refuses_a_results_json_whose_config_is_not_its_hash(lying):
    with pytest.raises(DamagedFile) as err:
        harness.load_run(lying)
    line = str(err.value)
    assert "\n" not in line and str(lying / RESULTS_FILE) in line and "'config_hash'" in line and "hashes to" in line


def test_the_loader_keeps_it_as_a_failed_run_and_the_skip_check_redoes_it(lying, tmp_path):
    run = load_results(lying).iloc[0]
    assert run["status"] == "failed" and str(lying / RESULTS_FILE) in run["error"] and "config_hash" in run["error"]
    digest = json.loads((lying / RESULTS_FILE).read_text())["config_hash"]
    assert read_results(lying) is None and find_completed(tmp_path, digest) is None
