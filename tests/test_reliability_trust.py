"""One trust gate for every key of a saved config that names code, at every entry point that
reopens a run: harness.load_run, mode=ablate and the figures. The code here is a throwaway module
whose import leaves a marker file: without trust the marker never appears (nothing of the module
ran), and the refusal names what to set where the user is (`trust_code=True` in Python,
`ablate.trust_code=true` for the mode, `--trust-code` for the figures); with trust it appears.

Each run is a finished run (no training) whose model.pt and results.json were then edited
together to name the module at one key, checksums and config hash refreshed: a consistent run
from someone else, not a damaged one."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import ROOT, make_results
from test_extending import MIXERS as EXTENDING_MIXERS
from test_untrusted_runs import edit_results, finished_run

import harness
from analysis import figures
from harness.config.compose import compose_config
from harness.config.digest import config_hash, flat_config
from harness.outputs import checkpoint
from harness.run.job import run_job

MODULE = "markedmixers"
CODE = f'''
from pathlib import Path
Path(__file__).with_name("imported").write_text("yes")  # what any code could do on import
''' + EXTENDING_MIXERS
MIXER = f"{MODULE}.RunningMean"


def _name(config: dict, key: str) -> None:
    """Make the nested config name the module's code at ``key``."""
    model = config["model"]
    if key == "model.name":
        model["name"] = MIXER
    elif key == "model.layers[1]":
        model.update(layers=[model["name"], MIXER], n_layers=2)
    elif key == "model.layers[1] as a mapping":
        model.update(layers=[model["name"], {"name": MIXER}], n_layers=2)
    elif key == "model.attn":
        model.update(attn=MIXER, attn_every=2, n_layers=2)
    elif key == "task.name":
        config["task"]["name"] = MODULE


KEYS = ("model.name", "model.layers[1]", "model.layers[1] as a mapping", "model.attn", "task.name")


def naming(run: Path, key: str, *, results_too: bool = True) -> Path:
    """Edit ``run``'s model.pt (its checksum refreshed in results.json) to name the module at
    ``key``; ``results_too``: results.json's config and hash as well, so the two files agree."""
    payload = torch.load(run / checkpoint.MODEL_FILE, weights_only=True)
    _name(payload["config"], key)
    files = {checkpoint.MODEL_FILE: checkpoint.save_model(run, payload)}
    config = payload["config"]
    edit_results(run, lambda r: r.update(files=files, **(
        {"config": flat_config(config), "config_hash": config_hash(config)} if results_too else {})))
    return run


@pytest.fixture
def code(tmp_path, monkeypatch):
    """The module, importable (on sys.path and PYTHONPATH) and not imported; the marker path."""
    where = tmp_path / "code"
    where.mkdir()
    (where / f"{MODULE}.py").write_text(textwrap.dedent(CODE))
    monkeypatch.syspath_prepend(str(where))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(where), os.environ.get("PYTHONPATH")))))
    yield where / "imported"
    sys.modules.pop(MODULE, None)


@pytest.fixture(scope="module")
def elu(tmp_path_factory) -> Path:
    return finished_run(tmp_path_factory.mktemp("elu") / "run", ["model=elu"])


def copy_of(run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run, tmp_path / "run"))


def the_line(err) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# ----- harness.load_run -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_load_run_refuses_every_key_that_names_code_before_importing_it(elu, tmp_path, code, key):
    run = naming(copy_of(elu, tmp_path), key)
    with pytest.raises(ValueError) as err:  # harness.outputs.trust.UntrustedCode
        harness.load_run(run)
    line = str(err.value)
    assert "\n" not in line and f"{key.split(' ')[0]}={MODULE}" in line, line
    assert "pass trust_code=True" in line and "--trust-code" not in line
    assert not code.exists()  # nothing of the module ran
    with contextlib.suppress(ValueError):  # trusted: imported (the edited weights need not fit)
        harness.load_run(run, trust_code=True)
    assert code.exists()


def test_a_slot_edited_into_model_pt_alone_is_refused_before_its_import(elu, tmp_path, code):
    """The checksum refreshed but results.json's config left: the gate reads model.pt's config
    before it compares the two files."""
    run = naming(copy_of(elu, tmp_path), "model.layers[1]", results_too=False)
    with pytest.raises(ValueError, match=r"model\.layers\[1\]=markedmixers\.RunningMean"):
        harness.load_run(run)
    assert not code.exists()


# ----- mode=ablate ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["model.layers[1]", "model.attn", "task.name"])
def test_mode_ablate_refuses_naming_ablate_trust_code(elu, tmp_path, code, capsys, key):
    run = naming(copy_of(elu, tmp_path), key)
    out = tmp_path / "ablation"
    cfg = compose_config(["mode=ablate", f"ablate.run={run}", "ablate.examples=8", "logger=none",
                          f"out_dir={out}"])
    with pytest.raises(SystemExit) as stop:
        run_job(cfg)
    line = the_line(capsys.readouterr().err)
    assert stop.value.code == 2 and line.startswith("harness: error: ")
    assert "add ablate.trust_code=true" in line and "pass trust_code=True" not in line
    assert not code.exists() and not out.exists()
    trusted = compose_config(["mode=ablate", f"ablate.run={run}", "ablate.examples=8", "logger=none",
                              f"out_dir={out}", "ablate.trust_code=true"])
    with contextlib.suppress(SystemExit):
        run_job(trusted)
    assert code.exists()


def test_the_ablate_command_line_refuses_before_any_directory(elu, tmp_path, code, run_harness):
    run = naming(copy_of(elu, tmp_path), "model.layers[1]")
    proc = run_harness("mode=ablate", f"ablate.run={run}", "logger=none", f"out_dir={tmp_path / 'ablation'}",
                       timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = the_line(proc.stderr)
    assert line.startswith("harness: error: ") and "ablate.trust_code=true" in line, line
    assert not code.exists() and not (tmp_path / "ablation").exists()


# ----- the figures -----------------------------------------------------------------------------------


@pytest.fixture
def anatomy_tree(tmp_path, code) -> Path:
    """The anatomy sweep with the second slot of the run the figure reopens (the one run whose
    ablation rows are not stored, so it keeps its weights) naming the module."""
    root = make_results.write_results_tree(tmp_path / "results", experiments=("anatomy",))
    (reopened,) = [p.parent for p in (root / "anatomy").glob("*/" + checkpoint.MODEL_FILE)]
    naming(reopened, "model.layers[1]")
    return root


def test_the_anatomy_figure_refuses_a_slot_naming_code_and_says_trust_code(anatomy_tree, tmp_path, code, capsys):
    spec = next(s for s in figures.FIGURES if s.name == "anatomy")
    written, missed = figures.render([spec], anatomy_tree, tmp_path / "figs")
    err = capsys.readouterr().err
    assert missed == ["anatomy"] and not written
    notes = [line for line in err.splitlines() if "markedmixers" in line]
    assert len(notes) == 1 and "add --trust-code" in notes[0] and "trust_code=True" not in notes[0], err
    assert not code.exists()
    with contextlib.suppress(Exception):
        figures.render([spec], anatomy_tree, tmp_path / "figs", trust_code=True)
    assert code.exists()


def test_the_figure_command_without_trust_imports_nothing(anatomy_tree, tmp_path, code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), os.environ["PYTHONPATH"])), MPLBACKEND="Agg",
               WANDB_MODE="disabled")
    proc = subprocess.run([sys.executable, "-m", "analysis.figures", "--results", str(anatomy_tree), "--only",
                           "anatomy", "--out", str(tmp_path / "figs")], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-3000:]  # a figure not drawn
    assert "Traceback" not in proc.stderr and "--trust-code" in proc.stderr, proc.stderr[-3000:]
    assert not code.exists()
