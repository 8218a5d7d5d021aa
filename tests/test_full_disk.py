"""A disk that fills up, and directories where the harness writes its files: one line, never a
traceback; results.json says why (status failed) wherever a run had started; no temporary file
is left to keep the disk full; a directory in the way is never removed.

The full disk is a real one where the test may mount a small tmpfs (root, a machine that allows
mounts), otherwise that variant is skipped; torch.save failing as torch reports it (a
RuntimeError, not an OSError) needs no mount.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import cut_at_first_evaluation, tmpfs

from harness.config.compose import compose_config
from harness.outputs import checkpoint
from harness.outputs.checkpoint import checkpoint_files
from harness.run.job import run_job

RUN = ["task=recall", "model=elu", "trainer=debug", "logger=none", "trainer.measure=false",
       "trainer.threads=1"]  # the model: 134k parameters, model.pt 0.5 MB, a checkpoint 1.6 MB


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs at tmp_path/disk; skipped where mounting is not allowed."""
    with tmpfs(tmp_path / "disk", "size=3m") as where:
        yield where


def fill(disk, leave: int) -> None:
    """Fill the disk until at most `leave` bytes are free."""
    free = shutil.disk_usage(disk).free
    with open(disk / "filler", "ab") as f:
        try:
            f.write(b"\0" * max(free - leave, 0))
            f.flush()
        except OSError:
            pass


def fails(overrides, capsys) -> tuple[str, dict | None]:
    """Run in process; (the one stderr line, results.json or None)."""
    cfg = compose_config([*RUN, *overrides])
    with pytest.raises(SystemExit) as stop:
        run_job(cfg)
    assert stop.value.code == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("harness: error: "), err
    results = cfg.out_dir + "/results.json"
    try:
        return err[0], json.loads(open(results).read())
    except FileNotFoundError:
        return err[0], None


def temporaries(run_dir) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("where", ["checkpoint", "model.pt"])
def test_a_full_disk_ends_the_run_in_one_line_with_results(small_disk, capsys, where):
    out = small_disk / "run"
    fill(small_disk, leave=300_000)  # room for config.yaml, metrics and results.json, not for weights
    overrides = [f"out_dir={out}"] + (["trainer.ckpt_every=2"] if where == "checkpoint" else [])
    line, res = fails(overrides, capsys)
    assert "No space left on device" in line, line
    assert ("cannot write a checkpoint in" if where == "checkpoint" else f"cannot write {out / 'model.pt'}") in line
    assert res["status"] == "failed" and "No space left on device" in res["error"]
    assert temporaries(out) == [] and not (out / "model.pt").exists() and not checkpoint_files(out)


def test_when_not_even_results_json_fits_the_one_line_still_says_why(small_disk, capsys, monkeypatch):
    out = small_disk / "run"
    save_model = checkpoint.save_model

    def disk_fills_up(*args, **kwargs):  # the disk is full from the end of training on
        fill(small_disk, leave=0)
        return save_model(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_model", disk_fills_up)
    line, res = fails([f"out_dir={out}"], capsys)
    assert res is None and f"cannot write {out / 'model.pt'}: No space left on device" in line
    assert f"results.json was not written either (cannot write {out / 'results.json'}" in line
    assert temporaries(out) == []


def test_torch_save_failing_as_torch_reports_it_is_one_line(tmp_path, capsys, monkeypatch):
    """Given a path, torch.save reports a failed write as a RuntimeError from its zip writer."""
    def torch_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 part of a zip file")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(torch, "save", torch_save)
    out = tmp_path / "run"
    line, res = fails([f"out_dir={out}", "trainer.ckpt_every=2"], capsys)
    assert "cannot write a checkpoint in" in line and "torch.save failed (" in line and "unexpected pos" in line
    assert res["status"] == "failed" and "unexpected pos" in res["error"]
    assert temporaries(out) == [] and not checkpoint_files(out)


@pytest.mark.parametrize("name", ["checkpoint.tmp", "model.pt.tmp", "results.json.tmp"])
def test_a_directory_at_a_temporary_name_is_written_around_and_kept(tmp_path, name):
    out = tmp_path / "run"
    (out / name).mkdir(parents=True)
    (out / name / "a user's file").write_text("kept")
    cfg = compose_config([*RUN, f"out_dir={out}", "trainer.ckpt_every=2"])
    run_job(cfg)
    assert json.loads((out / "results.json").read_text())["status"] == "ok"
    checkpoint.load_model(out)  # whole, with its checksum
    assert (out / name / "a user's file").read_text() == "kept"
    assert temporaries(out) == [name]  # nothing of the harness's own is left


# ----- checkpoint slots that are directories -------------------------------------------------------


@pytest.fixture
def cut_run(tmp_path, monkeypatch):
    """A run stopped at its first evaluation (step 10), with the checkpoints of steps 8 and 4."""
    out = tmp_path / "run"
    cfg = cut_at_first_evaluation(monkeypatch, [*RUN, f"out_dir={out}", "trainer.max_steps=12",
                                                "trainer.ckpt_every=4", "trainer.eval_every=10"])
    assert [step for step, _, _ in checkpoint_files(out)] == [8, 4]
    return out, cfg


def test_a_directory_in_a_checkpoint_slot_is_ignored_and_the_run_finishes(cut_run, capsys):
    out, cfg = cut_run
    newest = checkpoint_files(out)[0][1]
    newest.unlink()
    newest.mkdir()  # a copy gone wrong: the checkpoint's name, a directory's body
    (newest / "data.pkl").write_text("?")
    capsys.readouterr()
    run_job(cfg)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [f"harness: warning: {newest} is a directory, not a checkpoint: ignored"]
    assert json.loads((out / "results.json").read_text())["status"] == "ok"
    assert (newest / "data.pkl").read_text() == "?"  # never removed
    assert not checkpoint_files(out)  # the run's own checkpoints are


def test_a_checkpoint_whose_name_a_directory_holds_is_skipped_with_one_warning(tmp_path, capsys):
    payload = {"format": checkpoint.FORMAT, "step": 4, "weights": torch.arange(8.0)}
    path = checkpoint.save_checkpoint(tmp_path, 4, payload)
    path.unlink()
    path.mkdir()
    assert checkpoint.save_checkpoint(tmp_path, 4, payload) is None  # same bytes, same name
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path} is a directory, not a checkpoint" in err[0] and "not kept" in err[0]
    assert path.is_dir() and temporaries(tmp_path) == []
    later = checkpoint.save_checkpoint(tmp_path, 8, dict(payload, step=8))
    assert [p for _, p, _ in checkpoint_files(tmp_path)] == [later]
