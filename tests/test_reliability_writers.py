"""Every writer checks where it writes and writes whole: `python -m harness.run.wandb_sweeps --out`
into the package's config folder (where it would replace an experiment file), onto a file, onto a
read-only mount, onto a full disk; a run's out_dir and the figures' --out inside the package's
config. Each is one line (exit 2 for a place refused before any work, 1 for a write that failed),
and nothing is left half-written: the old file stays, no temporary file keeps a disk full.

The read-only and full places are real mounts where the test may mount a small tmpfs (root, a
machine that allows mounts), otherwise those variants are skipped."""
from __future__ import annotations

import shutil

import pytest
from conftest import tmpfs

from analysis import figures
from harness.conf import CONF_DIR
from harness.run import cli, wandb_sweeps

PROG = "python -m harness.run.wandb_sweeps"


def sweeps(out, capsys) -> tuple[int, list[str]]:
    code = wandb_sweeps.main(["mqar", "--out", str(out)])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_sweep_files_into_the_package_config_are_refused_and_the_experiment_kept(capsys):
    paper = CONF_DIR / "experiment" / "paper"
    before = {p.name: p.read_bytes() for p in paper.iterdir()}
    code, err = sweeps(paper, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"{PROG}: error: --out"), err
    assert "config folder" in err[0]
    assert {p.name: p.read_bytes() for p in paper.iterdir()} == before


def test_sweep_files_onto_a_file_are_one_line(tmp_path, capsys):
    (tmp_path / "sweeps").write_text("mine")
    code, err = sweeps(tmp_path / "sweeps", capsys)
    assert code == 2 and len(err) == 1 and "is a file" in err[0], err
    assert (tmp_path / "sweeps").read_text() == "mine"


def test_sweep_files_onto_a_read_only_mount_are_one_line(read_only, capsys):
    code, err = sweeps(read_only / "sweeps", capsys)
    assert code == 2 and len(err) == 1 and "read-only" in err[0], err


def test_sweep_files_onto_a_full_disk_are_one_line_and_leave_nothing_half_written(tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        out = disk / "sweeps"
        out.mkdir()
        (out / "mqar.yaml").write_text("an older sweep file\n")
        with open(disk / "filler", "wb") as f:  # the disk full but for a few hundred bytes
            try:
                f.write(b"\0" * max(shutil.disk_usage(disk).free - 256, 0))
                f.flush()
            except OSError:
                pass
        code, err = sweeps(out, capsys)
        assert code == 1 and len(err) == 1 and "No space left on device" in err[0], err
        assert sorted(p.name for p in out.iterdir()) == ["mqar.yaml"]  # no temporary file
        assert (out / "mqar.yaml").read_text() == "an older sweep file\n"  # the old one whole


def test_a_run_into_the_package_config_is_refused_before_it_writes(capsys):
    before = sorted(p.name for p in CONF_DIR.iterdir())
    with pytest.raises(SystemExit) as stop:
        cli.main(["trainer=debug", "logger=none", f"out_dir={CONF_DIR / 'experiment'}"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("harness: error: out_dir"), err
    assert sorted(p.name for p in CONF_DIR.iterdir()) == before
    assert not (CONF_DIR / "experiment" / "config.yaml").exists()


def test_figures_into_the_package_config_are_refused(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "results.json").write_text("{}")
    assert figures.main(["--results", str(tmp_path / "results"), "--out", str(CONF_DIR / "figs")]) == 2
    assert "config folder" in capsys.readouterr().err and not (CONF_DIR / "figs").exists()
