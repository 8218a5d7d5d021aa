"""Sweeps: Hydra multirun through the basic, joblib and submitit_local launchers; reruns skip
completed runs; a failing run keeps the others; wandb sweep files, written at use, are their paper
experiments and expand into valid configs."""

import math
from pathlib import Path

import pytest

from analysis.loader import load_results
from analysis.pipeline import compose_experiment, sweep_params
from harness.config.compose import CONF_DIR, compose_config, sweep_values
from harness.run import wandb_sweeps

TINY = ["task=recall", "trainer=debug", "logger=none", "trainer.measure=false",
        "trainer.checkpoint=false"]


def _sweep(run_harness, tmp_path, *extra, launcher=None):
    args = ["-m", *TINY, "model=softmax,elu", f"hydra.sweep.dir={tmp_path / 'sweep'}", *extra]
    if launcher:
        args.append(f"hydra/launcher={launcher}")
    return run_harness(*args, timeout=600)


@pytest.mark.parametrize("launcher", [None, "processes", "local"])
def test_multirun_through_each_launcher_is_read_by_the_loader(run_harness, tmp_path, launcher):
    proc = _sweep(run_harness, tmp_path, launcher=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = load_results(tmp_path / "sweep")
    assert sorted(runs["model"]) == ["elu", "softmax"]
    assert (runs["status"] == "ok").all()
    slices = load_results(tmp_path / "sweep", table="slices")
    assert set(slices["run.model"] if "run.model" in slices else slices["model"]) == {"elu", "softmax"}
    assert "2 ok, 0 failed" in proc.stdout


def test_rerun_skips_completed_runs(run_harness, tmp_path):
    first = _sweep(run_harness, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    files = sorted((tmp_path / "sweep").rglob("results.json"))
    stamps = [f.stat().st_mtime_ns for f in files]
    second = _sweep(run_harness, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count("skip: results for this config exist") == 2
    assert [f.stat().st_mtime_ns for f in files] == stamps


def test_a_grown_grid_keeps_the_runs_it_renumbers(run_harness, tmp_path):
    """model=softmax,elu then model=softmax,linear,elu: job 1 is now linear, and its directory
    held elu's finished run; elu's results move aside, are found there and not redone."""
    first = _sweep(run_harness, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    args = ["-m", *TINY, "model=softmax,linear,elu", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    second = run_harness(*args, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "held the finished run of another config" in second.stdout
    assert second.stdout.count("skip: results for this config exist") == 2  # softmax and elu, run once
    runs = load_results(tmp_path / "sweep")
    assert sorted(runs["model"]) == ["elu", "linear", "softmax"] and (runs["status"] == "ok").all()


def test_one_failing_run_keeps_the_others(run_harness, tmp_path):
    # num_pairs=40 cannot fit in seq_len=64: that job fails validation, the other runs.
    proc = run_harness("-m", *TINY, "model=softmax", "task.num_pairs=4,40",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}", timeout=600)
    assert proc.returncode == 1
    assert "1 ok, 1 failed" in proc.stdout
    assert "num_pairs=40" in proc.stdout  # the summary says why
    runs = load_results(tmp_path / "sweep")
    by_status = dict(zip(runs["config.task.num_pairs"], runs["status"]))
    assert by_status == {4: "ok", 40: "failed"}


def covering(sweep: dict) -> list[dict]:
    """The sweep cut to the runs in which every value of every swept key appears at least once
    (the i-th run takes each key's (i mod count)-th value), for a grid too large to compose whole
    (paper MQAR: 7,920 runs); the full expansion is what `expand` is checked on above."""
    params = sweep["parameters"]
    width = max(len(spec.get("values", [0])) for spec in params.values())
    runs = []
    for i in range(width):
        runs.append({k: {"value": spec["values"][i % len(spec["values"])]} if "values" in spec else spec
                     for k, spec in params.items()})
    return runs


@pytest.mark.parametrize("name", wandb_sweeps.swept())
def test_wandb_sweep_file_is_its_paper_experiment_and_its_commands_compose(name, tmp_path):
    path, = wandb_sweeps.write([name], tmp_path)
    sweep = wandb_sweeps.load(path)
    assert wandb_sweeps.validate(sweep) == []
    assert sweep == wandb_sweeps.from_experiment(name)  # the file reads back as what was written
    commands = wandb_sweeps.expand(sweep)
    grid = compose_experiment("paper", name).hydra.sweeper.params
    assert len(commands) == math.prod(len(sweep_values(str(k), str(v))) for k, v in grid.items())
    assert all(f"+experiment=paper/{name}" in c and "logger=wandb" in c for c in commands)
    for run in covering(sweep):
        overrides = wandb_sweeps.expand({"parameters": run})[0]
        cfg = compose_config(overrides)  # raises on any invalid key, value or combination
        assert cfg.logger.name == "wandb" and cfg.logger.mode == "online"
    models = {c.split("=", 1)[1] for run in commands for c in run if c.startswith("model=")}
    assert models == set(sweep_params("paper", name).get("model", ()))  # every mixer of the experiment


def test_every_paper_experiment_but_cost_is_a_wandb_sweep():
    assert set(wandb_sweeps.swept()) == {p.stem for p in (CONF_DIR / "experiment" / "paper").glob("*.yaml")} - {"cost"}


def test_every_figure_that_trains_or_probes_has_a_wandb_sweep():
    from analysis.pipeline import in_profile
    from analysis.plots import experiments

    # a sweep only the findings profile runs (capacity_length) has no paper counterpart to sweep
    assert {e for e in experiments() if in_profile("paper", e)} - {"cost"} <= set(wandb_sweeps.swept())
    assert {"capacity", "snr", "sharpness", "mqar"} <= {e for e in experiments() if in_profile("paper", e)}


def test_the_sweep_command_writes_the_files_asked_for_and_refuses_an_unknown_one(tmp_path, capsys):
    assert wandb_sweeps.main(["needle", "snr", "--out", str(tmp_path / "sw")]) == 0
    assert sorted(p.name for p in (tmp_path / "sw").iterdir()) == ["needle.yaml", "snr.yaml"]
    assert f"wandb sweep {tmp_path / 'sw' / 'needle.yaml'}" in capsys.readouterr().out
    assert wandb_sweeps.main(["cost", "--out", str(tmp_path / "sw")]) == 2
    assert "no wandb sweep for cost" in capsys.readouterr().err


def test_wandb_validation_catches_broken_files():
    broken = {"method": "grid", "parameters": {"model": {"values": []}},
              "command": ["python", "-m", "harness", "${args}"]}
    errors = wandb_sweeps.validate(broken)
    assert any("values" in e for e in errors) and any("args_no_hyphens" in e for e in errors)


def _grid(params: dict[str, list[str]]) -> list[list[str]]:
    """First and last combination of a sweeper grid (as harness.config.compose.experiment_grid reads it)."""
    return [[f"{k}={v[0]}" for k, v in params.items()], [f"{k}={v[-1]}" for k, v in params.items()]]


def test_experiment_files_compose():
    from harness.config.compose import experiment_grid

    root = CONF_DIR / "experiment"
    names = sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))
    for figure in ("capacity", "snr", "mqar", "induction", "sharpness", "cost", "length", "needle", "frontier",
                   "forgetting"):
        assert figure in names and f"paper/{figure}" in names
    for name in names:
        for combo in _grid(experiment_grid(name)):
            cfg = compose_config([f"+experiment={name}", *combo])
            assert cfg.mode in ("train", "probe", "cost")


TRAINED_EXPERIMENTS = ("capacity", "mqar", "induction", "sharpness")
RANKING_QUICK = ("capacity", "sharpness")  # the quick figures that rank mixers


@pytest.mark.parametrize("profile", ["quick", "paper"])
@pytest.mark.parametrize("name", TRAINED_EXPERIMENTS)
def test_trained_experiments_sweep_seeds_and_every_setting_is_valid(profile, name):
    """Trained figures run five seeds where a figure ranks mixers (the quick capacity and
    sharpness figures, and every paper figure: intervals only from five) and at least one
    elsewhere (drawn, no interval); the learning rate is a swept key (its value is recorded per
    run, the choice made on validation); every combination of the task settings a sweep
    crosses composes and validates (no job fails for its grid)."""
    import itertools

    from harness.config.validate import validate_config

    values = sweep_params(profile, name)
    ranks = profile == "paper" or name in RANKING_QUICK
    assert len(values["seed"]) >= (5 if ranks else 1)
    assert "trainer.lr" in values  # every learning rate's result is kept, the choice on validation
    varied = [k for k in values if k.startswith(("task.", "model.d_model"))]
    experiment = name if profile == "quick" else f"paper/{name}"
    for combo in itertools.product(*(values[k] for k in varied)):
        overrides = [f"+experiment={experiment}", f"model={values['model'][0]}",
                     *(f"{k}={v}" for k, v in zip(varied, combo))]
        validate_config(compose_config(overrides))


def test_no_sweep_file_is_kept_in_the_package():
    """Sweep files are written at use, so none can drift from its experiment; every directory
    under harness/conf is a config group `python -m harness --help` lists."""
    import harness
    package = Path(harness.__file__).parent
    assert not list(package.rglob("sweeps/*.yaml")) and not (package / "conf" / "wandb").exists()
    assert package not in (Path.cwd() / wandb_sweeps.OUT_DIR).resolve().parents


# A budget check asks whether runs leave a plateau within a fixed number of steps: no plateau
# stop (that is what it checks), and a threshold that only ends a run that has plainly learned
BUDGET_CHECKS = {"findings/mechanism_budget", "findings/mechanism_positions", "findings/lr_window_budget"}


@pytest.mark.parametrize("profile", ["quick", "paper", "findings"])
def test_trained_experiments_stop_on_a_plateau_never_at_a_threshold(profile):
    """A run stopped at trainer.target_accuracy reports the threshold; every trained experiment
    stops on its validation plateau (trainer.patience) or at max_steps instead."""
    from analysis import smoke

    trained = 0
    for name in smoke.experiments(profile):
        cfg = compose_experiment(profile, name)
        if cfg.mode != "train" or f"{profile}/{name}" in BUDGET_CHECKS:
            continue
        trained += 1
        assert cfg.trainer.target_accuracy is None, f"{profile}/{name}: trainer.target_accuracy set"
        assert cfg.trainer.patience is not None, f"{profile}/{name}: no plateau rule"
    assert trained >= (2 if profile == "findings" else 8)
