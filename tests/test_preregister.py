"""Pre-registration (analysis.preregister): predictions from stage-1 statistics, written into an
experiment file between its markers before the runs they predict."""
from __future__ import annotations

import math

import pytest
import yaml

from analysis import preregister
from harness.measure.out_of_sample import TrainStats

CONFIG = {"task.name": "interference", "task.num_pairs": 16, "task.vocab_size": 260, "task.seq_len": None,
          "task.num_queries": None, "task.key_len": 1, "task.key_overlap": 0.0, "task.test_num_pairs": [],
          "task.test_seq_len": [], "task.key_regime": "schlag", "task.num_keys": None, "seed": 0,
          "trainer.eval_examples": 32, "model.qk_dim": 8, "model.d_model": 64, "model.name": "elu"}


def _stats(**change) -> TrainStats:
    base = dict(law="additive", span=1, kernel_target=(4.0,), kernel_other=(1.0,), log_decay=((0.0,),),
                target_write_gain=(1.0,), value_dim=32.0, candidates=130, d_kernel=4.0, n_eff=30.0, pairs=30.0,
                # as measured: the read-out's SNR^2 at the training setting is d_kernel over its flat count
                snr_readout=math.sqrt(4.0 / 30.0), acc_readout=0.9, seq_len=48, num_pairs=16, d_key=8.0,
                n_eff_flat=30.0)
    return TrainStats(**{**base, **change})


def test_key_width_rows_carry_the_statistics_to_other_widths():
    runs = [{"config": CONFIG, "stats": _stats()}]
    rows = {(r["qk_dim"], r["num_pairs"]): r for r in preregister.key_width_rows(runs, [4, 16], [2.0, 4.0], 0.25)}
    assert set(rows) == {(4, 8), (4, 16), (16, 32), (16, 64)}
    # the same N = 16 from the key-width-8 run trained there: the law at half the width predicts less,
    # the anchored baseline (no width in it) what the run's own read-out gives at its own setting
    at16 = rows[(4, 16)]
    assert at16["source_num_pairs"] == 16 and at16["law"] < preregister.predict(_stats(), preregister.reads_at(CONFIG))["law"]
    assert at16["anchored"] == pytest.approx(preregister.predict(_stats(), preregister.reads_at(CONFIG))["anchored"], abs=1e-4)
    for row in rows.values():
        assert row["part"] == "key_width" and row["seeds"] == 1 and not row["law_anchored_by_algebra"]
        apart = all(abs(preregister._logit(row["law"]) - preregister._logit(row[s])) > 0.25 for s in ("nominal", "anchored"))
        assert row["discriminating"] == apart


def test_length_rows_say_where_the_law_is_the_anchored_baseline():
    runs = [{"config": CONFIG, "stats": _stats()}]
    rows = preregister.length_rows(runs, "elu", 16, [48, 192], 0.25)
    assert [r["seq_len"] for r in rows] == [48, 192]
    assert all(r["law_anchored_by_algebra"] and not r["discriminating"] for r in rows)  # one head, no decay
    assert rows[0]["law"] == pytest.approx(rows[0]["anchored"], abs=1e-4)
    decayed = [{"config": {**CONFIG, "model.name": "retnet"}, "stats": _stats(log_decay=((-0.02,),))}]
    far = preregister.length_rows(decayed, "retnet", 16, [768], 0.25)[0]
    assert not far["law_anchored_by_algebra"] and far["law"] < far["anchored"]  # the target has faded


def test_the_block_is_written_between_the_markers_and_reads_back(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("analysis:\n  law_margin_logodds: 0.25\n  # >>> law_predictions (old)\n  law_predictions: []\n"
                    "  # <<< law_predictions\nhydra:\n  x: 1\n")
    rows = [{"part": "length", "model": "retnet", "qk_dim": 8, "num_pairs": 16, "seq_len": 96, "law": 0.5,
             "nominal": 0.9, "anchored": 0.8, "seeds": 5, "law_anchored_by_algebra": False, "discriminating": True}]
    preregister.write_block(path, rows)
    data = yaml.safe_load(path.read_text())
    assert data["analysis"]["law_predictions"] == rows and data["hydra"] == {"x": 1}
    assert data["analysis"]["law_margin_logodds"] == 0.25
    preregister.write_block(path, [])  # written again: replaced, not appended
    assert yaml.safe_load(path.read_text())["analysis"]["law_predictions"] == []
    (tmp_path / "bare.yaml").write_text("analysis: {}\n")
    with pytest.raises(ValueError, match="no '# >>> law_predictions'"):
        preregister.write_block(tmp_path / "bare.yaml", rows)


def test_the_findings_files_fix_the_rule_and_hold_the_block():
    """The margin and tolerance are in the files before any run; the rows' block is there to write."""
    from harness.config.compose import CONF_DIR, compose_experiment

    for name in (preregister.EXPERIMENT, preregister.LENGTH_EXPERIMENT):
        cfg = compose_experiment(name)
        assert cfg.analysis.law_margin_logodds == 0.25 and cfg.analysis.law_tolerance_logodds == 1.0
        assert isinstance(list(cfg.analysis.law_predictions), list)
        text = (CONF_DIR / "experiment" / f"{name}.yaml").read_text()
        assert preregister.BEGIN in text and preregister.END in text
