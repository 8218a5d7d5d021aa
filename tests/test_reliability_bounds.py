"""Bounds where a value becomes a size, each checked in one line before any work: a stack label
and the run directory it names (130 alternating layers, no out_dir), a directory name past the
file system's limit, the counts a figure parses from a `name*count` label (huge, malformed),
`model.options.window` past torch's 64-bit integers (plain or in a slot), the depth of a stack; and the
small refusals of a hybrid's config (options no slot takes, an empty stack, a length error that
names the stack)."""
from __future__ import annotations

import json

import pytest
from conftest import make_results

from analysis import figures
from harness.config.compose import compose_config
from harness.config.plan import prepare
from harness import model
from harness.model import ModelConfig, stack_label
from harness.run import cli

QUICK = ["trainer=debug", "logger=none", "trainer.measure=false", "trainer.threads=1"]
HUGE = 10**20  # past int64


def refused(overrides) -> str:
    with pytest.raises(ValueError) as err:
        prepare(compose_config([*QUICK, *overrides], validate=False))
    assert "\n" not in str(err.value)
    return str(err.value)


# ----- stack labels and the directories they name -------------------------------------------------


def test_a_130_layer_stack_without_out_dir_trains_in_a_directory_it_can_make(run_harness, tmp_path):
    layers = ",".join(["elu", "softmax"] * 65)
    proc = run_harness(*QUICK, f"model.layers=[{layers}]", "model.d_model=16", "model.pos_emb=none",
                       "trainer.max_steps=1", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = list((tmp_path / "outputs").rglob("results.json"))
    assert len(results) == 1
    name = results[0].parent.parent.name  # outputs/<task>-<label>/<time>/results.json
    assert len(name.encode()) <= 255 and name.startswith("recall-elu+softmax+")
    assert json.loads(results[0].read_text())["model"] == stack_label(["elu", "softmax"] * 65)  # whole


def test_a_long_label_names_its_directory_by_its_start_and_a_digest():
    one, two = (ModelConfig(layers=["elu", "softmax"] * 65), ModelConfig(layers=["softmax", "elu"] * 65))
    assert len(model.dir_label(one)) <= model.DIR_LABEL_CHARS and model.dir_label(one) != model.dir_label(two)
    assert model.dir_label(ModelConfig(layers=["gated_deltanet"] * 3 + ["softmax"])) == "gated_deltanet*3+softmax"


def test_an_out_dir_name_past_the_file_system_limit_is_one_line(tmp_path, capsys):
    out = tmp_path / ("x" * 300)
    with pytest.raises(SystemExit) as stop:
        cli.main([*QUICK, f"out_dir={out}"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert stop.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("harness: error: out_dir") and "300 bytes" in lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing was made


# ----- name*count labels, as the figures read them ------------------------------------------------


def test_a_label_reads_back_as_its_stack():
    from analysis.plots.hybrid import slots

    names = ["gated_deltanet"] * 3 + ["softmax", "pkg.mod.Mixer"]
    assert model.stack_slots(stack_label(names)) == names and slots("elu") == ["elu"]


@pytest.mark.parametrize("label, says", [
    (f"softmax*{10**12}", "1,000,000,000,000 layers"),      # refused before a list is made of it
    ("softmax*10000+elu", "10,001 layers"),                  # past model.n_layers' bound
    ("*abc", "is no stack"), ("elu*abc", "is no stack"), ("elu*0", "is no stack"), ("elu*-1", "is no stack"),
    ("elu+", "is no stack"), ("elu*٣", "is no stack"),
])
def test_a_huge_or_malformed_count_is_one_line(label, says):
    with pytest.raises(ValueError, match=says):
        model.stack_slots(label)


def test_the_hybrid_figure_leaves_out_the_runs_whose_label_cannot_be_read(tmp_path, capsys):
    root = make_results.write_results_tree(tmp_path / "results", experiments=("hybrid",))
    bad = {root / "hybrid" / "3": f"gated_deltanet*{10**12}", root / "hybrid" / "8": "*abc"}
    for run, label in bad.items():
        data = json.loads((run / "results.json").read_text())
        data["model"] = label
        (run / "results.json").write_text(json.dumps(data))
    spec = next(s for s in figures.FIGURES if s.name == "hybrid")
    written, missed = figures.render([spec], root, tmp_path / "figs")
    err = capsys.readouterr().err
    assert list(written) == ["hybrid"] and missed == [], err
    for run in bad:
        assert str(run / "results.json") in err, err  # the note names each file left out


# ----- integers that become sizes -----------------------------------------------------------------


@pytest.mark.parametrize("overrides, key", [
    (["model=swa", f"model.options.window={HUGE}"], "model.options.window"),
    ([f"model.layers=[{{name: swa, window: {HUGE}}},elu]", "model.pos_emb=none"], "model.layers[0] (swa): model.options.window"),
    ([f"model.n_layers={HUGE}"], "model.n_layers"),
    (["model.attn_every=2", f"model.n_layers={HUGE}"], "model.n_layers"),
    ([f"probe.d=[{HUGE}]", "mode=probe"], "probe.d"),
], ids=["window", "window in a slot", "n_layers", "n_layers with attn_every", "probe.d"])
def test_an_integer_past_what_torch_holds_is_refused_at_validation(overrides, key):
    line = refused(overrides)
    assert line.startswith(f"{key} must be") and str(HUGE) in line, line


# ----- a hybrid's small refusals ------------------------------------------------------------------


def test_options_no_slot_of_a_stack_takes_are_refused_not_dropped():
    line = refused(["model.layers=[elu,softmax]", "model.pos_emb=none", "+model.options.width=8"])
    assert line.startswith("model.options.width: no layer of this stack takes it"), line
    line = refused(["model.layers=[elu,softmax]", "model.pos_emb=none", "+model.options.window=8"])
    assert line.startswith("model.layers[0] (elu): model.options.window must be null for model.name=elu"), line


def test_an_empty_stack_says_so():
    assert refused(["model.layers=[]"]).startswith("model.layers must be a non-empty list"), "not n_layers"


def test_a_length_error_of_a_stack_names_the_stack():
    line = refused(["model.layers=[softmax,softmax]", "task.test_seq_len=[128]"])
    assert "softmax*2" in line and "model=elu" not in line, line


def test_the_figure_command_refuses_a_file_as_results(tmp_path, capsys):
    (tmp_path / "results.json").write_text("{}")
    assert figures.main(["--results", str(tmp_path / "results.json"), "--out", str(tmp_path / "figs")]) == 2
    assert "is a file" in capsys.readouterr().err

