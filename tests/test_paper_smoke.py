"""The paper profile, smoke-tested through the real command: every paper experiment's mixers at
the largest point of its grid (`--smoke-grid last`), one training step per job on the CPU at the
paper's sizes, through each experiment's own launcher; every figure drawn from those results and
the full profile's cost printed. The probe (snr) and cost experiments run whole, as they have no
steps to cut: they are left to the full smoke (`--smoke` without --only), which also runs every
job of every grid (see the README for its time)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import smoke

REPO = Path(__file__).resolve().parents[1]
FIGURES = ["capacity", "sharpness", "mqar", "induction", "state_vs_kv"]


@pytest.mark.slow
def test_paper_smoke_runs_every_mixer_at_the_largest_sizes_and_draws_the_figures(tmp_path):
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "analysis.figures", "--profile", "paper", "--smoke", "--smoke-grid", "last",
           "--out", str(tmp_path / "figs"), "--only", *FIGURES]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    for name in FIGURES:
        assert (tmp_path / "figs" / f"{name}.png").stat().st_size > 10_000
    root = tmp_path / "results" / "paper-smoke"
    grids = {name: smoke.sweep_params("paper", name) for name in ("capacity", "sharpness", "mqar", "induction")}
    for experiment, params in grids.items():
        runs = [json.loads(p.read_text()) for p in (root / experiment).rglob("results.json")]
        # every mixer of the grid (every built-in; capacity adds its variants), one job each
        assert len(runs) == len(params["model"]) and all(r["status"] == "ok" for r in runs), experiment
        assert all(r["summary"]["steps"] == 1 and r["summary"]["step_time_s"] > 0 for r in runs)
    estimate = json.loads((root / "cost_estimate.json").read_text())["experiments"]
    assert {k: v["jobs"] for k, v in estimate.items()} == {k: smoke.job_count(p, "all") for k, p in grids.items()}
    assert estimate["mqar"]["jobs"] == len(grids["mqar"]["model"]) * 4 * 3 * 3 * 4 * 5
    assert all(v["total_seconds"] > 0 for v in estimate.values())
    # the GPU cost, named as an estimate, per figure: every experiment here trains, so each has one
    assert all(v["gpu_hours_estimate"] > 0 for v in estimate.values())
    assert "GPU column: an estimate, not a measurement" in done.stdout
    assert "expected cost of the full paper profile on cpu" in done.stdout


def test_the_cost_estimate_counts_attention_in_every_layer_that_keeps_keys():
    """The score and mixing products are added for each layer whose mixer's class keeps keys
    (memory_kind "kv_cache"), a hybrid's attention slots included, with swa's window cutting the
    keys; a recurrent layer adds none."""
    from harness.layers import builtin_names
    from harness.layers.registry import keeps_keys

    assert {name for name in builtin_names() if keeps_keys(name)} == {"softmax", "swa"}
    assert not keeps_keys("examples.dpfp.DPFPAttention")  # outside code is not imported to answer
    full = {"batch_size": 1, "max_steps": 1}
    base = {"mode": "train", "task.name": "recall", "task.seq_len": 64, "model.d_model": 8, "model.n_layers": 4}

    def extra(**model):
        config = {**base, **{f"model.{k}": v for k, v in model.items()}}
        run = {"mode": "train", "summary": {"params": 0}, "config": config}
        return smoke.job_flops(run, full)

    T = smoke.train_length(base)
    per_layer = 6.0 * 2 * T * T * 8
    assert extra(name="elu") == 0
    assert extra(name="softmax") == pytest.approx(4 * per_layer)
    assert extra(name="swa", window=16) == pytest.approx(4 * per_layer * 16 / T)
    assert extra(name="gated_deltanet", layers=["gated_deltanet", "softmax", "gated_deltanet", "softmax"]) \
        == pytest.approx(2 * per_layer)
    assert extra(name="mamba", attn_every=4, attn="softmax") == pytest.approx(per_layer)
