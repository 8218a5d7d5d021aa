"""Run directories as data from anywhere: a results.json of another shape, checksums that are
missing or malformed, the files of two runs mixed, weights that do not fit their config, and a
config that names outside code. Each is one line (or one warning), never a traceback, and
nothing is imported that the caller did not allow.

The runs here are made as a finished run leaves them (model.pt with the resolved config,
results.json with the config hash and model.pt's checksum), without training: loading checks
files, not accuracy.
"""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import make_results
from test_extending import MIXERS as EXTENDING_MIXERS
from omegaconf import OmegaConf

import harness
from analysis import figures
from analysis.loader import load_all
from harness.config.digest import config_hash, identify
from harness.config.plan import prepare
from harness.config.compose import compose_config
from harness.errors import DamagedFile
from harness.outputs import checkpoint
from harness.outputs.results import RESULTS_FILE, base_results, read_results, write_json
from harness.outputs.rundir import find_completed

SMALL = ["task=recall", "trainer=debug", "logger=none", "model.d_model=16"]


def finished_run(run_dir: Path, overrides=(), *, weights_of=None) -> Path:
    """A finished run of `overrides` (results.json and model.pt); `weights_of`: the weights are
    those of another config's model (saved under this run's config)."""
    cfg = compose_config([*SMALL, *overrides])
    torch.manual_seed(0)
    model = prepare(compose_config([*SMALL, *weights_of]) if weights_of else cfg).build_model()
    run_dir.mkdir(parents=True, exist_ok=True)
    results = base_results(cfg, *identify(cfg))
    results["files"] = {checkpoint.MODEL_FILE: checkpoint.save_model(
        run_dir, {"model": model.state_dict(), "config": OmegaConf.to_container(cfg, resolve=True)})}
    write_json(run_dir / RESULTS_FILE, results)
    return run_dir


def edit_results(run_dir: Path, edit) -> None:
    path = run_dir / RESULTS_FILE
    data = json.loads(path.read_text())
    edit(data)  # in place
    path.write_text(json.dumps(data))


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and isinstance(exc_info.value, ValueError)
    return message


@pytest.fixture(scope="module")
def elu(tmp_path_factory) -> Path:
    return finished_run(tmp_path_factory.mktemp("elu") / "run", ["model=elu"])


def copy_of(run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run, tmp_path / "copy"))


def test_a_whole_run_loads_without_a_word(elu, capsys):
    run = harness.load_run(elu)
    assert run.config.model.name == "elu" and run.results["status"] == "ok"
    assert capsys.readouterr().err == ""


# ----- results.json of another shape (item: one malformed file must not stop a sweep) ------------


@pytest.mark.parametrize("text", ["[1]", '"ok"', "3", "null", "[" * 100_000])
def test_a_results_file_that_is_no_json_object_is_damaged(elu, tmp_path, text):
    run = copy_of(elu, tmp_path)
    (run / RESULTS_FILE).write_text(text)
    assert read_results(run) is None  # the skip check redoes such a run
    assert find_completed(tmp_path, config_hash(compose_config([*SMALL, "model=elu"]))) is None
    with pytest.raises(DamagedFile) as err:
        harness.load_run(run)
    line = one_line(err)
    assert str(run / RESULTS_FILE) in line and "damaged" in line


def test_the_sweep_skip_check_survives_a_list_and_finds_the_good_run(elu, tmp_path):
    import shutil

    shutil.copytree(elu, tmp_path / "sweep" / "1")
    (tmp_path / "sweep" / "0").mkdir()
    (tmp_path / "sweep" / "0" / RESULTS_FILE).write_text("[1]")
    digest = config_hash(compose_config([*SMALL, "model=elu"]))
    assert find_completed(tmp_path / "sweep", digest) == tmp_path / "sweep" / "1"


@pytest.mark.parametrize("edit, what", [
    (lambda r: r.update(config="model=elu"), "'config' is str, not an object"),
    (lambda r: r.update(summary=[1]), "'summary' is list, not an object"),
    (lambda r: r.update(model={"name": "elu"}), "'model' is dict, not a single value"),
], ids=["config-string", "summary-list", "model-dict"])
def test_a_figure_leaves_out_a_malformed_run_by_name_and_draws_the_rest(tmp_path, capsys, edit, what):
    root = make_results.write_results_tree(tmp_path / "results", experiments=("capacity",))
    bad = root / "capacity" / "3" / RESULTS_FILE
    data = json.loads(bad.read_text())
    edit(data)
    bad.write_text(json.dumps(data))
    runs = load_all(root / "capacity").query("table == 'runs'")
    assert runs.loc[runs["run_dir"] == bad.parent.as_posix(), "status"].tolist() == ["failed"]
    spec = next(s for s in figures.FIGURES if s.name == "capacity")
    written, missed = figures.render([spec], root, tmp_path / "figs")
    assert list(written) == ["capacity"] and missed == []
    notes = [line for line in capsys.readouterr().err.splitlines() if str(bad) in line]
    assert len(notes) == 1 and what in notes[0], notes


# ----- checksums that cannot switch themselves off ----------------------------------------------


def test_no_checksum_recorded_is_one_warning(elu, tmp_path, capsys):
    run = copy_of(elu, tmp_path)
    edit_results(run, lambda r: r.pop("files"))
    harness.load_run(run)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("harness: warning: ") and "loaded unverified" in err[0]
    assert str(run / "model.pt") in err[0]


@pytest.mark.parametrize("record", [{"model.pt": {"sha256": 12345}}, {"model.pt": {"sha256": "abc"}},
                                    {"model.pt": "0" * 64}, {}, [1]],
                         ids=["number", "short", "not-an-entry", "no-entry", "list"])
def test_a_malformed_checksum_record_is_refused(elu, tmp_path, record):
    run = copy_of(elu, tmp_path)
    edit_results(run, lambda r: r.update(files=record))
    with pytest.raises(DamagedFile) as err:
        harness.load_run(run)
    line = one_line(err)
    assert str(run / RESULTS_FILE) in line and "cannot be verified" in line


def test_the_model_of_another_run_is_refused_naming_what_differs(elu, tmp_path):
    """An elu run's results beside a softmax run's model.pt, the checksum taken out."""
    run = copy_of(elu, tmp_path)
    softmax = finished_run(tmp_path / "softmax", ["model=softmax"])
    (run / "model.pt").write_bytes((softmax / "model.pt").read_bytes())
    edit_results(run, lambda r: r.pop("files"))
    with pytest.raises(DamagedFile) as err:
        harness.load_run(run)
    line = one_line(err)
    assert "saved under another config" in line and "model.name: 'softmax' -> 'elu'" in line


def test_weights_that_do_not_fit_their_config_are_refused_naming_the_shapes(tmp_path):
    run = finished_run(tmp_path / "run", ["model=elu"], weights_of=["model=elu", "model.d_model=32"])
    with pytest.raises(DamagedFile) as err:
        harness.load_run(run)
    line = one_line(err)
    assert "does not fit the model its config builds (model.name=elu)" in line
    assert "embed.weight: (256, 32) saved, (256, 16) built;" in line and line.endswith(" more")


def test_weights_with_missing_and_extra_entries_are_refused_by_key(tmp_path):
    run = finished_run(tmp_path / "run", ["model=elu"], weights_of=["model=elu", "model.n_layers=3"])
    with pytest.raises(DamagedFile) as err:
        harness.load_run(run)
    reason = one_line(err).split("(model.name=elu): ", 1)[1]  # the path holds the test's name
    assert reason.startswith("unexpected layers.2.") and "missing" not in reason


# ----- outside code only when trusted ------------------------------------------------------------

# test_extending's mixers, with a marker any imported code could write
MIXER = """
from pathlib import Path
Path(__file__).with_name("imported").write_text("yes")  # what any code could do on import
""" + EXTENDING_MIXERS


@pytest.fixture
def outside_run(tmp_path, monkeypatch):
    """A finished run of an outside mixer, its module then forgotten (not imported any more)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "theirmixers.py").write_text(textwrap.dedent(MIXER))
    monkeypatch.syspath_prepend(str(code))
    run = finished_run(tmp_path / "run", ["model.name=theirmixers.RunningMean"])
    monkeypatch.delitem(sys.modules, "theirmixers")
    (code / "imported").unlink()
    return run, code / "imported"


def test_outside_code_is_refused_unless_trusted(outside_run):
    run, imported = outside_run
    with pytest.raises(ValueError) as err:
        harness.load_run(run)
    line = one_line(err)
    assert "model.name=theirmixers.RunningMean" in line and "pass trust_code=True" in line  # Python's spelling
    assert not imported.exists()  # nothing of it ran
    loaded = harness.load_run(run, trust_code=True)
    assert imported.exists() and type(loaded.model.mixers()[0]).__name__ == "RunningMean"


def test_an_outside_task_module_is_refused_unless_trusted(elu, tmp_path):
    run = copy_of(elu, tmp_path)
    payload = torch.load(run / "model.pt", weights_only=True)
    payload["config"]["task"]["name"] = "os"  # any module at all
    checkpoint.save_model(run, payload)
    edit_results(run, lambda r: r.pop("files"))
    with pytest.raises(ValueError, match=r"task.name=os\).*trust_code=True"):
        harness.load_run(run)


def test_the_figure_command_passes_trust_on_to_figures_that_reopen_runs(tmp_path):
    root = make_results.write_results_tree(tmp_path / "results", experiments=("sharpness",))
    seen = []

    def draw(data, trust_code=False):
        seen.append(trust_code)

    specs = [figures.FigureSpec("reopens", "sharpness", draw, reopens_runs=True),
             figures.FigureSpec("reads", "sharpness", lambda data: seen.append("none"))]
    for trust in (False, True):
        figures.render(specs, root, tmp_path / "figs", trust_code=trust)
    assert seen == [False, "none", True, "none"]
    assert figures._parser().parse_args(["--trust-code"]).trust_code is True
