"""The measurement modes (probe, cost, ablate) stopped by Ctrl-C or SIGTERM: one line, exit 130 or
143, nothing written; Hydra's `hydra.job.chdir=true` with a relative out_dir: the run lands where
the user is and a finished run there is not replaced by another config's; a bad `ablate.run`:
refused before any run directory is made.

In this process the signal is sent from inside the mode (its measuring function replaced by one
that signals its own process), so it arrives at a known point; through the command line it comes
from outside, once an outside mixer's probe has started (it says so in a file, then waits).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT
from test_extending import MIXERS as EXTENDING_MIXERS
from test_untrusted_runs import finished_run

from harness.config.compose import compose_config
from harness.outputs.results import RESULTS_FILE
from harness.run import cli
from harness.run.job import run_job

QUICK = ["trainer=debug", "logger=none", "trainer.measure=false", "trainer.threads=1"]
MODES = {
    "probe": (["model=elu", "probe.d=[8]", "probe.n=[16]", "probe.candidates=16", "probe.max_queries=16"],
              "harness.measure.probe", "run_probe"),
    "cost": (["model=elu", "cost.seq_lens=[16]", "cost.repeats=1", "cost.batch_size=1", "cost.n_heads=1",
              "cost.head_dim=8", "cost.forms=[chunk]"], "harness.bench.run", "measure_forms"),
    "ablate": (["ablate.examples=8", "ablate.patch=false"], "harness.measure.ablate", "ablate_run"),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A finished run for mode=ablate to read."""
    return finished_run(tmp_path_factory.mktemp("source") / "run", ["model=elu"])


def left_behind(out: Path) -> list[str]:
    return sorted(p.name for p in out.rglob("*") if p.name == RESULTS_FILE or p.name.endswith(".tmp"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_stop_signal_in_a_mode_is_one_line_and_writes_nothing(mode, sig, source, tmp_path, monkeypatch, capsys):
    overrides, module, function = MODES[mode]
    before = signal.getsignal(sig)

    def signalled(*args, **kwargs):
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler, before):
            pytest.fail(f"mode={mode} runs with no handler of {sig.name} of its own")  # it would die, or trace back
        os.kill(os.getpid(), sig)  # handled here, before the next line
        raise AssertionError(f"mode={mode} went on after {sig.name}")

    monkeypatch.setattr(f"{module}.{function}", signalled)
    out = tmp_path / "out"
    cfg = compose_config([*QUICK, f"mode={mode}", *overrides, f"ablate.run={source}", f"out_dir={out}"])
    with pytest.raises(SystemExit) as stop:
        run_job(cfg)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert stop.value.code == 128 + sig, lines
    assert len(lines) == 1 and lines[0].startswith(f"harness: error: stopped by {sig.name} during mode={mode}"), lines
    assert left_behind(out) == []
    assert signal.getsignal(sig) == before  # the process's own handler is back


WAITS = EXTENDING_MIXERS + '''
import os
import time
from pathlib import Path


class Waits(RunningMean):
    """Probes forever, once it has said it started."""

    @classmethod
    def probe_memory(cls, d, seed):
        Path(os.environ["PROBE_STARTED"]).write_text("probing")
        while True:
            time.sleep(0.05)
'''


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_probe_command_exits_as_the_signal_and_leaves_no_directory(tmp_path, sig):
    (tmp_path / "waiting.py").write_text(textwrap.dedent(WAITS))
    started, out = tmp_path / "started", tmp_path / "probe"
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", PROBE_STARTED=str(started),
               PYTHONPATH=os.pathsep.join((str(ROOT), str(tmp_path))))
    proc = subprocess.Popen([sys.executable, "-m", "harness", *QUICK, "mode=probe", "model.name=waiting.Waits",
                             "probe.d=[8]", "probe.n=[16]", "probe.candidates=16", f"out_dir={out}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _started(proc, started), proc.communicate()[1][-3000:]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("harness: error")]
    assert "Traceback" not in err and len(errors) == 1, err[-3000:]
    assert errors[0].startswith(f"harness: error: stopped by {sig.name} during mode=probe"), errors
    assert not out.exists()  # made by this command, and nothing of it kept


def _started(proc, started: Path) -> bool:
    """Wait until the probe has started or the command has ended (the command's own work bounds
    the wait); whether it started."""
    import time

    while not started.exists() and proc.poll() is None:
        time.sleep(0.1)
    return started.exists()


# ----- one out_dir, with Hydra's chdir or without ------------------------------------------------


def test_chdir_with_a_relative_out_dir_writes_where_the_user_is_and_keeps_a_finished_run(run_harness, tmp_path):
    first = run_harness(*QUICK, "hydra.job.chdir=true", "out_dir=rel", "seed=1", cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "rel"
    assert (run / RESULTS_FILE).is_file() and not (run / "rel").exists()
    printed = [line.split("results: ", 1)[1] for line in first.stdout.splitlines() if "] results: " in line]
    assert printed and (tmp_path / printed[-1]).is_file()  # the path it prints, read from where it started
    kept = (run / RESULTS_FILE).read_bytes(), (run / "model.pt").read_bytes()
    second = run_harness(*QUICK, "hydra.job.chdir=true", "out_dir=rel", "seed=2", cwd=tmp_path, timeout=600)
    assert second.returncode == 2, second.stderr[-3000:]
    assert "holds a finished run of another config" in second.stderr and "seed (1 there, 2 now)" in second.stderr
    assert ((run / RESULTS_FILE).read_bytes(), (run / "model.pt").read_bytes()) == kept


# ----- a bad ablate.run, refused before anything is made -------------------------------------------


@pytest.mark.parametrize("what", ["missing", "no run", "failed run", "a probe"])
def test_a_bad_ablate_run_is_refused_before_any_run_directory(tmp_path, capsys, what):
    run = tmp_path / "source"
    if what != "missing":
        run.mkdir()
    if what == "no run":
        (run / "notes.txt").write_text("x")
    if what in ("failed run", "a probe"):
        import json

        status, mode = ("failed", "train") if what == "failed run" else ("ok", "probe")
        (run / RESULTS_FILE).write_text(json.dumps({"schema": 1, "mode": mode, "status": status, "error": "x"}))
    out = tmp_path / "ablation"
    with pytest.raises(SystemExit) as stop:
        cli.main([*QUICK, "mode=ablate", f"ablate.run={run}", f"out_dir={out}"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert not out.exists()  # refused before Hydra made it, not recorded in it as a failed run
    assert stop.value.code == 2 and len(lines) == 1 and f"ablate.run={run}" in lines[0], lines


def test_an_earlier_stop_in_the_process_is_not_the_next_runs():
    """A sweep's worker exits after a job whose run was stopped (harness.run.sweep reads
    StopRequest.received()); a later run in the same process (a notebook, a test) starts clear,
    or its first finished job would end the process."""
    from harness.train.faults import StopRequest

    first = StopRequest()
    try:
        first._request(signal.SIGTERM, None)
        assert StopRequest.received() == signal.SIGTERM
    finally:
        first.restore()
    second = StopRequest()
    try:
        assert StopRequest.received() is None and not second.requested
    finally:
        second.restore()


def test_every_mode_in_the_table_names_functions_that_import():
    """MODES is the one list of modes: each names its run (and its ready, where it has one) by a
    path that imports, and validation offers exactly its modes."""
    from harness.config.schema import MODES
    from harness.layers.registry import import_object

    for name, mode in MODES.items():
        assert callable(import_object(mode.run, f"mode={name}"))
        assert mode.ready is None or callable(import_object(mode.ready, f"mode={name}"))
    with pytest.raises(ValueError, match="unknown mode 'nope'; valid: " + ", ".join(MODES)):
        compose_config([*QUICK, "mode=nope"])
