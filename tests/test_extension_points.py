"""docs/extending.md's "Adding a mixer / a task / a figure", held true.

In a temporary copy of the repository (the packages, the results fixture and the document), each
test writes a throwaway mixer, task or figure by exactly the files the document lists, and
nothing else, then finds it where it should be picked up: a mixer in every experiment's expanded
sweep that chooses its mixers by what they are (none that names a chosen few), in the wandb sweep files and in the tables of every figure (drawn from synthetic results);
a task trained through the CLI; a figure in the list `python -m analysis.figures` draws, its
notebook among those tests/test_notebooks.py runs, its experiment in the smoke and the wandb
sweeps, and its PNG and table written by the real command. The work runs in a subprocess of the
copy, so the package it imports is the copy's.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "extending.md"
COPIED = ("harness", "analysis", "tests/fixtures", "docs/extending.md")
SKIP = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build")


def doc_files(heading: str, **names: str) -> list[str]:
    """The files a subsection of the document lists (each numbered item's leading `path`), with
    its placeholders (<name>, <experiment>) filled in."""
    text = DOC.read_text()
    section = re.split(r"\n##+ ", text.split(f"\n### {heading}\n", 1)[1], maxsplit=1)[0]
    files = re.findall(r"^\d+\. `([^`]+)`", section, re.M)
    assert files, f"docs/extending.md: no numbered files under '### {heading}'"
    for key, value in names.items():
        files = [f.replace(f"<{key}>", value) for f in files]
    return files


@pytest.fixture
def repo(tmp_path) -> Path:
    copy = tmp_path / "repo"
    for part in COPIED:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, copy / part, ignore=SKIP)
        else:
            (copy / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / part)
    return copy


def add(repo: Path, files: dict[str, str], documented: list[str]) -> None:
    """Write ``files`` into the copy: exactly the files the document lists, none of them there yet."""
    assert sorted(files) == sorted(documented), f"the test writes {sorted(files)}, the document lists {documented}"
    for name, text in files.items():
        path = repo / name
        assert not path.exists(), f"{name} exists already: the extension would edit, not add"
        path.write_text(text)


def run_in(repo: Path, code: str, *args: str, timeout: int = 600) -> dict:
    """Run ``code`` with the copy's packages (python -c, in the copy); its last line of output is JSON."""
    env = {**os.environ, "PYTHONPATH": str(repo), "WANDB_MODE": "disabled", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# a mixer

MIXER = '''"""A throwaway built-in mixer: elu attention under its own name, with a setting of its own."""
from dataclasses import dataclass

from harness import checks
from harness.layers import register
from harness.layers.kernel import EluAttention
from harness.layers.options import KernelOptions


@dataclass(frozen=True)
class ThrowawayOptions(KernelOptions):
    read_scale: float = 1.0  # the read-out times this

    def check(self):
        super().check()
        checks.number("model.options.read_scale", self.read_scale, "(0, inf)")


@register("throwaway")
class ThrowawayAttention(EluAttention):
    Options = ThrowawayOptions

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.read_scale = self.options_of(config).read_scale

    def forward(self, x):
        return super().forward(x) * self.read_scale
'''

MODEL_YAML = "defaults:\n  - model_schema\n\nname: throwaway\n"

# In the copy: every experiment's grid and the wandb sweep of one, then every figure drawn from the
# synthetic results, in which each elu run has a twin under the new mixer's name (what its sweep
# would write), and which of its tables name the new mixer.
MIXER_CHECK = r'''
import json, shutil, sys
from pathlib import Path

from harness.conf import CONF_DIR
from harness.config.compose import compose_experiment, experiment_grid
from harness.run import wandb_sweeps

root = CONF_DIR / "experiment"
names = sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))
grids = {name: experiment_grid(name) for name in names}
# an experiment whose variable is the stack (model.layers: hybrid, anatomy) sweeps no mixer list
# (tests/test_experiments.py holds its slots to built-ins); its figure names no new mixer either
stacks = {name.split("/")[-1] for name, grid in grids.items() if "model" not in grid and "model.layers" in grid}
grids = {name: grid["model"] for name, grid in grids.items() if name.split("/")[-1] not in stacks}
# a budget check (no plateau stop) rechecks named mixers' cells of another experiment
# (findings/mechanism_budget): it sweeps those mixers, not every built-in
def budget_check(name):
    composed = compose_experiment(name)
    return composed.mode == "train" and composed.trainer.patience is None


grids = {name: models for name, models in grids.items() if not budget_check(name)}
# how each grid chooses (its `model` line as written): a chosen few (`only`) or by nature
from omegaconf import OmegaConf
lines = {name: str(OmegaConf.to_container(compose_experiment(name).hydra.sweeper.params, resolve=False)["model"])
         for name in grids}
sweep = wandb_sweeps.from_experiment("mqar")["parameters"]["model"]["values"]

sys.path.insert(0, "tests/fixtures")
import make_results

results = make_results.write_results_tree(Path("results"))
paths = sorted(results.rglob("results.json"))
models = {}  # each sweep's runs of one mixer become the new mixer's: elu's, or its first mixer's
for path in paths:
    models.setdefault(path.relative_to(results).parts[0], set()).add(json.loads(path.read_text()).get("model"))
twin_of = {sweep: "elu" if "elu" in names else min(n for n in names if n) for sweep, names in models.items()}
for path in paths:
    payload = json.loads(path.read_text())
    if payload.get("model") != twin_of[path.relative_to(results).parts[0]]:
        continue
    twin = path.parent.with_name(f"throwaway-{path.parent.name}")
    shutil.copytree(path.parent, twin)
    payload["model"] = payload["config"]["model.name"] = "throwaway"
    (twin / "results.json").write_text(json.dumps(payload))
    saved = twin / ".hydra" / "config.yaml"
    saved.write_text(saved.read_text().replace(f"name: {twin_of[path.relative_to(results).parts[0]]}",
                                               "name: throwaway"))

from analysis import figures

tables = {}
for spec in figures.FIGURES:
    if spec.experiment is None or spec.reopens_runs or spec.experiment in stacks:
        continue
    fig = spec.draw(figures.load_figure_data(results, spec))
    drawn = {k: v for k, v in getattr(fig, "tables", {}).items() if v is not None and len(v)}
    tables[spec.name] = {"declared": sorted(spec.tables), "drawn": sorted(getattr(fig, "tables", {})),
                         "naming": sorted(k for k, v in drawn.items() if "throwaway" in v.to_csv())}

# its own setting: from model.options on the command line, checked by the mixer, on the built layer
from dataclasses import fields
from harness.config.compose import compose_config
from harness.config.build import model_config
from harness.model import LanguageModel, ModelConfig

built = LanguageModel(model_config(compose_config(["model=throwaway", "model.options.read_scale=0.5"]).model), 16, 32)
try:
    compose_config(["model=throwaway", "model.options.read_scale=-1"])
    refused = ""
except Exception as exc:
    refused = str(exc)
setting = {"read_scale": [float(m.read_scale) for m in built.modules() if hasattr(m, "read_scale")],
           "refused": refused, "model_fields": [f.name for f in fields(ModelConfig)]}
print(json.dumps({"grids": grids, "lines": lines, "sweep": sweep, "tables": tables, "setting": setting}))
'''


def test_a_mixer_is_its_module_and_its_model_file(repo):
    add(repo, {"harness/layers/throwaway.py": MIXER, "harness/conf/model/throwaway.yaml": MODEL_YAML},
        doc_files("A built-in mixer", name="throwaway"))
    out = run_in(repo, MIXER_CHECK)
    assert len(out["grids"]) >= 20
    by_nature = 0
    for name, models in out["grids"].items():
        line = out["lines"][name]
        if "only:" in line:  # a chosen few, named with the reason: a new mixer joins by an edit only
            assert "throwaway" not in models, f"{name} chose its mixers by name, yet sweeps the new one"
        elif "where:" in line:  # by what the mixers are: the new mixer is an elu in all but its name
            assert ("throwaway" in models) == ("elu" in models), (name, line, models)
        else:
            by_nature += 1
            assert "throwaway" in models, f"{name} does not sweep the new mixer: {models}"
    assert by_nature >= 15
    assert "throwaway" in out["sweep"]
    # its setting reaches its layers from model.options, is checked by the mixer, and adds no
    # field to the model config (the module and the model file are all that changed)
    setting = out["setting"]
    assert setting["read_scale"] == [0.5, 0.5], setting
    assert "model.options.read_scale" in setting["refused"], setting
    assert "read_scale" not in setting["model_fields"] and len(setting["model_fields"]) <= 22
    assert len(out["tables"]) >= 10
    for name, seen in out["tables"].items():
        assert seen["drawn"] == seen["declared"], f"figure {name} writes {seen['drawn']}, declares {seen['declared']}"
        if seen["declared"]:
            assert seen["naming"], f"no table of figure {name} has the new mixer's runs"


# ---------------------------------------------------------------------------------------------
# a task

TASK = '''"""A throwaway task: the first token asked again at the end."""
from dataclasses import dataclass, field

from harness.tasks.base import (Batch, as_config, check_call, check_int, empty_labels, eval_grid, longest,
                                make_generator, randint, validate_settings)

NAME = "throwaway_task"


@dataclass
class Config:
    seq_len: int = 16
    vocab_size: int = 32
    test_seq_len: list[int] = field(default_factory=list)


def _validate_setting(cfg, where):
    check_int(NAME, f"{where}seq_len", cfg.seq_len, minimum=2)
    check_int(NAME, "vocab_size", cfg.vocab_size, minimum=3)


def validate(cfg):
    validate_settings(NAME, as_config(Config, cfg, NAME), _validate_setting, eval_settings)


def eval_settings(cfg):
    return eval_grid(as_config(Config, cfg, NAME), "seq_len")


def seq_len(cfg):
    return as_config(Config, cfg, NAME).seq_len


def max_seq_len(cfg):
    return longest(cfg, seq_len, eval_settings(cfg))


def make_batch(cfg, batch_size, *, seed, device="cpu", split="train"):
    cfg = as_config(Config, cfg, NAME)
    check_call(NAME, batch_size, seed, split)
    gen = make_generator(seed, split, device)
    inputs = randint(gen, 1, cfg.vocab_size, batch_size, cfg.seq_len)            # (B, T)
    targets, slice_value, target_pos = empty_labels(batch_size, cfg.seq_len, inputs.device)
    targets[:, -1], slice_value[:, -1], target_pos[:, -1] = inputs[:, 0], cfg.seq_len, 0
    return Batch(inputs, targets, slice_value, target_pos, "seq_len")
'''

TASK_YAML = "defaults:\n  - throwaway_task_schema\n\nname: throwaway_task\n"

TASK_CHECK = r'''
import json, subprocess, sys

from harness.tasks import TASKS

out = sys.argv[1]
run = subprocess.run([sys.executable, "-m", "harness", "task=throwaway_task", "task.test_seq_len=[16,32]",
                      "trainer=debug", "trainer.max_steps=2", "trainer.threads=1", "trainer.measure=false",
                      "logger=none", f"out_dir={out}"], capture_output=True, text=True)
print(json.dumps({"tasks": sorted(TASKS), "code": run.returncode, "stderr": run.stderr[-2000:]}))
'''


def test_a_task_is_its_module_and_its_task_file(repo, tmp_path):
    add(repo, {"harness/tasks/throwaway_task.py": TASK, "harness/conf/task/throwaway_task.yaml": TASK_YAML},
        doc_files("A task", name="throwaway_task"))
    out = run_in(repo, TASK_CHECK, str(tmp_path / "run"))
    assert "throwaway_task" in out["tasks"]
    assert out["code"] == 0, out["stderr"]
    result = json.loads((tmp_path / "run" / "results.json").read_text())
    assert result["status"] == "ok" and result["task"] == "throwaway_task"
    assert sorted(r["value"] for r in result["slices"]) == [16, 32]  # one slice per test length


# ---------------------------------------------------------------------------------------------
# a figure

FIGURE = '''"""A throwaway figure: the runs of each mixer in its sweep."""
from matplotlib.figure import Figure

from analysis.plots import FigureSpec
from analysis.plots.common import figure, table
from analysis.synthetic import result

FIGURES = (FigureSpec("throwaway_fig", "throwaway_exp", "throwaway_fig_figure", notebook="nb_throwaway_fig",
                      tables=("throwaway_fig_runs",), synthetic="throwaway_runs"),)


def throwaway_runs(rng):
    """What its tests draw it from: two mixers, three seeds."""
    return [result("train", "needle", model, {"seed": seed}, {"accuracy": float(rng.uniform())})
            for model in ("softmax", "elu") for seed in range(3)]


@figure("throwaway_fig")
def throwaway_fig_figure(data) -> Figure:
    runs = table(data, "runs").groupby("model").size().rename("runs").reset_index()
    fig = Figure()
    ax = fig.add_subplot()
    ax.bar(runs["model"], runs["runs"])
    ax.set_ylabel("runs (count)")
    fig.tables = {"throwaway_fig_runs": runs}
    return fig
'''

NOTEBOOK = '''# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% tags=["parameters"]
results_dir = None

# %%
from analysis import params
from analysis.plots.throwaway_fig import throwaway_fig_figure

throwaway_fig_figure(params.results("throwaway_exp", results_dir))
'''

EXPERIMENT = '''# @package _global_
# A throwaway experiment: the needle task, every built-in mixer.
defaults:
  - override /task: needle
  - override /logger: none

hydra:
  sweep:
    dir: results/quick/throwaway_exp
  sweeper:
    params:
      model: ${mixers:}
'''

PAPER_EXPERIMENT = '''# @package _global_
defaults:
  - /experiment/throwaway_exp

hydra:
  sweep:
    dir: results/paper/throwaway_exp
'''

FIGURE_CHECK = r'''
import json, subprocess, sys
from pathlib import Path

from analysis import figures, smoke
from analysis.plots import notebooks
from harness.config.compose import experiment_grid
from harness.layers.registry import builtin_names
from harness.run import wandb_sweeps

sys.path.insert(0, "tests/fixtures")
import make_results

# the figure's own synthetic runs, declared beside it
results = make_results.write_results_tree(Path("results"), experiments=("throwaway_exp",))
run = subprocess.run([sys.executable, "-m", "analysis.figures", "--results", "results", "--out", "figs",
                      "--only", "throwaway_fig"], capture_output=True, text=True)
print(json.dumps({
    "figures": [s.name for s in figures.FIGURES], "notebooks": notebooks(),
    "smoke": {p: smoke.experiments(p) for p in ("quick", "paper")}, "wandb": list(wandb_sweeps.swept()),
    "mixers": experiment_grid("paper/throwaway_exp")["model"] == builtin_names(),
    "code": run.returncode, "stderr": run.stderr[-2000:], "written": sorted(p.name for p in Path("figs").glob("*"))}))
'''


def test_a_figure_is_its_module_and_its_notebook(repo):
    add(repo, {"analysis/plots/throwaway_fig.py": FIGURE, "analysis/nb_throwaway_fig.py": NOTEBOOK,
               "harness/conf/experiment/throwaway_exp.yaml": EXPERIMENT,
               "harness/conf/experiment/paper/throwaway_exp.yaml": PAPER_EXPERIMENT},
        doc_files("A figure", name="throwaway_fig", experiment="throwaway_exp"))
    out = run_in(repo, FIGURE_CHECK)
    assert "throwaway_fig" in out["figures"] and "nb_throwaway_fig" in out["notebooks"]
    assert all("throwaway_exp" in names for names in out["smoke"].values())
    assert "throwaway_exp" in out["wandb"] and out["mixers"]
    assert out["code"] == 0, out["stderr"]
    assert {"throwaway_fig.png", "throwaway_fig.pdf", "throwaway_fig_runs.csv"} <= set(out["written"])


# ---------------------------------------------------------------------------------------------
# the wheel

def test_the_wheel_installs_the_harness_and_no_top_level_analysis(tmp_path):
    """A top-level `analysis` in a user's environment would collide with any other so named: the
    figure code runs from the checkout and stays out of the wheel."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "harness", source / "harness", ignore=SKIP)
    shutil.copytree(ROOT / "analysis", source / "analysis", ignore=SKIP)
    for part in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / part, source / part)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "wheels"), str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    names = zipfile.ZipFile(next((tmp_path / "wheels").glob("*.whl"))).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"harness"}, tops
    assert "harness/conf/config.yaml" in names and any(n.startswith("harness/ops/") and n.endswith(".cpp") for n in names)
