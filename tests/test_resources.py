"""Resource checks before work: a request the device cannot hold is refused in one line with the
estimate and the limit, before any allocation and within seconds; evaluation streams in smaller
pieces when a whole chunk would not fit; an out-of-memory that still happens mid-run is a
one-line run error recorded in results.json. The estimates are held against measured peaks.
"""
import dataclasses
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from harness.peak_memory import LiveMemory
from harness.config.build import task_config
from harness.config.plan import prepare
from harness.config.compose import compose_config
from harness.devices import LIMIT_ENV, format_bytes, memory_limit, parse_bytes
from harness.measure import probe
from harness.run import cli
from harness.run.job import run_job
from harness.train import memory
from harness.train.optim import build_optimizer, lm_loss

LIMIT = "24GiB"  # the machine, whatever this one has


# `python -m harness` that writes its own peak resident memory (KiB) to the file named first.
# The process's own peak (VmHWM, KiB): its address space's high-water mark, made anew at exec.
# getrusage's ru_maxrss would not do: a forked child keeps its parent's (a pytest worker grown
# past 1 GiB would fail the bound for a process that never held anything).
PEAK = ("import runpy, sys\nout, sys.argv = sys.argv[1], ['harness', *sys.argv[2:]]\ntry:\n"
        "    runpy.run_module('harness', run_name='__main__')\nfinally:\n"
        "    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "    open(out, 'w').write(hwm.split()[1])\n")


def harness(*overrides, limit=LIMIT, timeout=120, peak=None):
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", **{LIMIT_ENV: limit})
    cmd = [sys.executable, "-c", PEAK, str(peak)] if peak else [sys.executable, "-m", "harness"]
    return subprocess.run([*cmd, *overrides], env=env, capture_output=True, text=True, timeout=timeout)


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_memory_limit_reads_the_device_and_the_override(monkeypatch):
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    total, what = memory_limit("cpu")
    assert total > 2**30 and what in ("this machine", "this job's memory limit (cgroup)")
    monkeypatch.setenv(LIMIT_ENV, "3GiB")
    assert memory_limit("cpu") == (3 * 2**30, f"the limit {LIMIT_ENV}")
    assert parse_bytes("512MiB") == 2**29 and format_bytes(56 * 2**30) == "56 GiB"
    with pytest.raises(ValueError, match=LIMIT_ENV):
        parse_bytes("lots")


@pytest.mark.parametrize("text", ["infGiB", "inf", "nanMiB", "1e300TiB", "-1GiB", "0", "GiB"])
def test_a_size_no_machine_has_is_one_line(text, monkeypatch, capsys, tmp_path):
    """inf, nan and sizes past what a float holds in bytes are bad values, not an OverflowError."""
    with pytest.raises(ValueError, match=f"{LIMIT_ENV}='{text}': expected a size such as 8GiB"):
        parse_bytes(text)
    monkeypatch.setenv(LIMIT_ENV, text)
    monkeypatch.setattr(sys, "argv", ["harness"])
    with pytest.raises(SystemExit) as stop:
        cli.main(["trainer=debug", "logger=none", f"out_dir={tmp_path / 'run'}"])
    assert stop.value.code == 2
    assert one_line(capsys.readouterr().err).startswith(f"harness: error: {LIMIT_ENV}='{text}'")
    assert not (tmp_path / "run").exists()


# ----- refused before any allocation -------------------------------------------------------------

@pytest.mark.parametrize("overrides, starts", [
    (["mode=probe", "model=elu", "probe.d=[100000]", "probe.n=[70000]"],
     "harness: error: probe: model=elu, d=100000, N=70000 needs about "),
    (["model=elu", "task.test_seq_len=[2000000]", "trainer.eval_examples=512", "task.vocab_size=8192"],
     "harness: error: evaluation: 512 examples at length 2000000 needs about "),
    # one example at a time, evaluation fits (about 16 GiB) but the hooks of the measurement do not
    (["model=taylor", "model.d_model=256", "model.n_heads=16", "task.test_seq_len=[100000]",
      "trainer.measure_examples=512", "trainer.eval_examples=512"],
     "harness: error: measurement: 512 examples at length 100000 needs about "),
    (["model=elu", "task.seq_len=100000", "trainer.batch_size=256"],
     "harness: error: training: batch 256 x length 100000 x width 64 "),
], ids=["probe", "evaluation", "measurement", "training"])
def test_infeasible_request_is_refused_in_one_line(tmp_path, overrides, starts):
    peak = tmp_path / "peak_kib"
    proc = harness(*overrides, "logger=none", f"out_dir={tmp_path / 'run'}", peak=peak)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = one_line(proc.stderr)
    assert line.startswith(starts), line
    assert re.search(r"needs about [\d.]+ [KMGT]iB[^;]*; (this machine|the limit \w+|.*cgroup.*) has [\d.]+ GiB$", line), line
    assert not (tmp_path / "run").exists()  # refused before the run directory was made
    assert int(peak.read_text()) < 1024 * 1024  # the process never held anything near the estimate (KiB)


def _address_space(limit_bytes: int):
    def set_limit():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return set_limit


@pytest.mark.parametrize("override, starts", [
    ("task.vocab_size=1000000000", "harness: error: training: batch 64 x length 64 x width 64 "),
    ("task.test_seq_len=[100000000]", "harness: error: evaluation: 256 examples at length 100000000 needs about "),
], ids=["vocabulary", "length"])
def test_the_estimate_comes_from_the_config_alone(tmp_path, override, starts):
    """Under a 4 GiB address space a generated batch (a 10^9-token vocabulary, a length of 10^8)
    could not be allocated: the refusal must come from the config's numbers alone."""
    env = dict(os.environ, WANDB_MODE="disabled", **{LIMIT_ENV: LIMIT})
    proc = subprocess.run([sys.executable, "-m", "harness", override, "logger=none", f"out_dir={tmp_path / 'run'}"],
                          env=env, capture_output=True, text=True, timeout=600, preexec_fn=_address_space(4 * 2**30))
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = one_line(proc.stderr)
    assert line.startswith(starts) and "needs about" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("task, overrides", [
    ("recall", {}), ("recall", {"mixture": [[32, 2], [96, 8, 2.0]]}), ("induction", {}), ("forgetting", {}),
    ("needle", {}), ("interference", {}), ("interference", {"seq_len": 80}),
])
def test_a_tasks_config_length_is_its_examples_length(task, overrides):
    from harness.tasks import TASKS, train_length

    module = TASKS[task]
    cfg = dataclasses.replace(module.Config(), **overrides)
    for setting in [cfg, *module.eval_settings(cfg)]:
        assert train_length(module, setting) == module.make_batch(setting, 2, seed=0).inputs.shape[1]


@pytest.mark.parametrize("overrides", [
    ["mode=probe", "model=elu", "probe.d=[100000]", "probe.n=[70000]"],
    ["mode=probe", "model=favor", "probe.d=[100000]", "probe.n=[64]"],  # the feature draw alone
    ["model=elu", "task.test_seq_len=[2000000]", "trainer.eval_examples=512", "task.vocab_size=8192"],
])
def test_refusal_allocates_nothing_and_takes_seconds(overrides, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(LIMIT_ENV, LIMIT)
    monkeypatch.setattr(sys, "argv", ["harness"])
    started = time.perf_counter()
    with LiveMemory() as mem, pytest.raises(SystemExit) as stop:
        cli.main([*overrides, "logger=none", f"out_dir={tmp_path / 'run'}"])
    elapsed = time.perf_counter() - started
    assert stop.value.code == 2
    assert "needs about" in one_line(capsys.readouterr().err)
    assert mem.largest < 16 * 2**20  # no tensor of any size was made
    assert elapsed < 5.0


def test_evaluation_streams_in_smaller_pieces_when_a_whole_chunk_does_not_fit(tmp_path, monkeypatch, capsys):
    over = ["task=recall", "model=elu", "trainer=debug", "logger=none", "trainer.measure=false",
            "trainer.eval_examples=64", "task.test_seq_len=[2048]", "task.vocab_size=4096", f"out_dir={tmp_path}"]
    cfg = compose_config(over)
    shape = memory.run_shape(cfg)
    T = max(shape.eval_lens)
    whole = memory.eval_bytes(shape.facts, shape.eval_lens, 64 * T, 64)  # all 64 examples in one pass
    pieces = memory.eval_bytes(shape.facts, shape.eval_lens, 8 * T, 64)
    assert memory.train_bytes(shape.facts, shape.batch, shape.train_len, shape.data_chunk) < pieces < whole
    monkeypatch.setenv(LIMIT_ENV, str(int((pieces + whole) / 2)) + "B")
    cfg = compose_config([*over, f"trainer.eval_tokens={64 * T}"])
    assert memory.check_training(cfg) // T in (8, 16, 32)
    run_job(cfg)
    out = capsys.readouterr().out
    assert "[harness] evaluation in pieces of" in out
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "ok"


# ----- an out-of-memory mid-run ------------------------------------------------------------------

def test_out_of_memory_mid_run_is_recorded_and_one_line(tmp_path, monkeypatch, capsys):
    from harness.train import loop as train_module

    calls = {"n": 0}

    def allocator_gives_up(logits, targets):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                               "allocate memory: you tried to allocate 40000000000000 bytes. Error code 12")
        return lm_loss(logits, targets)

    monkeypatch.setattr(train_module, "lm_loss", allocator_gives_up)
    with pytest.raises(SystemExit) as stop:
        run_job(compose_config(["task=recall", "model=elu", "trainer=debug", "logger=none",
                                "trainer.measure=false", f"out_dir={tmp_path}"]))
    assert stop.value.code == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("harness: error: out of memory at step 2 of training (")  # 2 steps done
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["status"] == "failed" and res["oom"]["step"] == 2 and "can't allocate" in res["oom"]["error"]


def test_out_of_memory_outside_training_is_one_line_too(tmp_path, monkeypatch, capsys):
    from harness.run import probe_mode

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr("harness.measure.probe.run_probe", no_memory)
    with pytest.raises(SystemExit) as stop:
        run_job(compose_config(["mode=probe", "model=linear", "probe.d=[8]", "probe.n=[8]", "logger=none",
                                f"out_dir={tmp_path}"]))
    assert stop.value.code == 1
    assert one_line(capsys.readouterr().err).startswith("harness: error: out of memory in mode=probe")
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "failed"
    assert probe_mode  # imported: the patched function is the one probe_run calls


# ----- the estimates against measured peaks ------------------------------------------------------

MIXERS = ["softmax", "linear", "elu", "favor", "taylor", "retnet", "mamba"]


@pytest.mark.parametrize("overrides", [[f"model={m}"] for m in MIXERS]
                         + [["model=elu", "model.form=parallel"], ["model=mamba", "model.options.gate=per_dim"],
                            ["model=softmax", "model.d_model=128", "model.n_heads=4", "task.vocab_size=2048"]],
                         ids=lambda o: " ".join(o))
def test_training_and_evaluation_estimates_bound_the_measured_peak(overrides):
    torch.manual_seed(0)
    cfg = compose_config([*overrides, "task.seq_len=256", "trainer.batch_size=4", "logger=none"])
    module, tcfg = task_config(cfg.task)
    shape = memory.run_shape(cfg)
    f = shape.facts
    model = prepare(cfg).build_model()
    assert f.params == pytest.approx(sum(p.numel() for p in model.parameters()), rel=0.1)
    opt = build_optimizer(model, cfg.trainer)
    b = module.make_batch(tcfg, 4, seed=0)
    with LiveMemory(list(model.parameters()) + [b.inputs, b.targets]) as step:
        lm_loss(model(b.inputs), b.targets).backward()
        opt.step()
    estimate = 3 * memory.FLOAT * f.params + memory.activation_bytes(f, 4, shape.train_len, training=True)
    assert step.peak <= estimate <= 3 * step.peak
    e = module.make_batch(tcfg, 16, seed=1)
    model.eval()
    with torch.no_grad(), LiveMemory(list(model.parameters()) + [e.inputs]) as ev:
        logits = model(e.inputs)
        mask = e.targets != -100
        torch.nn.functional.cross_entropy(logits[mask].float(), e.targets[mask])
        logits.argmax(-1)
        del logits
    estimate = memory.activation_bytes(f, 16, shape.train_len, training=False)
    assert ev.peak <= estimate <= 4 * ev.peak


@pytest.mark.parametrize("model", MIXERS)
@pytest.mark.parametrize("d, n", [(16, 4096), (64, 2048), (24, 8192)])
def test_probe_estimate_bounds_the_measured_peak(model, d, n):
    probe._memory.cache_clear()
    probe.codebook.cache_clear()
    with LiveMemory(exact=True) as mem:
        probe.probe_row(model, d, n, candidates=256)
    estimate = probe.probe_row_bytes(model, d, n, candidates=256)
    assert mem.peak <= estimate <= 3 * mem.peak + 32 * 2**20


def test_probe_writes_its_states_in_groups_that_fit_and_measures_the_same(monkeypatch):
    """64 Taylor states of m x d_v at d = 256 would need 26 GiB at once; in groups, the row is the same."""
    whole = probe.probe_row("taylor", 8, 16, candidates=64)
    assert whole["states"] == 64
    monkeypatch.setattr(probe, "STATE_BUDGET", 73 * 9 * 3)  # m = 1 + 8 + 64 = 73, d_v + 1 = 9
    assert probe.state_group(64, 73, 8) == 3
    grouped = probe.probe_row("taylor", 8, 16, candidates=64)
    for key in ("snr_measured", "acc_measured", "snr_predicted", "acc_predicted"):
        assert grouped[key] == pytest.approx(whole[key], rel=1e-12), key
    monkeypatch.undo()
    assert probe.probe_row_bytes("taylor", 256, 16) < 2 * 2**30


def test_every_paper_configuration_fits_the_reference_machine(monkeypatch):
    """At the paper's full sizes (batch, evaluation examples and all), every mixer at the largest
    point of each grid passes the check on a 24 GiB machine; evaluation may stream in pieces."""
    from analysis import smoke

    monkeypatch.setenv(LIMIT_ENV, LIMIT)
    from harness.run.job import plan_for

    checked = 0
    for name in smoke.experiments("paper"):
        params = smoke.sweep_params("paper", name)
        models = params.get("model", ["elu"])
        for model in models:
            cfg = compose_config([f"+experiment=paper/{name}", *smoke.grid_overrides(params, "last"),
                                  f"model={model}", "trainer.device=cpu"])
            plan = plan_for(cfg)  # ResourceError if it does not fit
            if cfg.mode == "train":
                assert plan.eval_tokens > 0  # the tokens per evaluation pass that fit
            checked += 1
    assert checked >= 7 * len(smoke.experiments("paper")) - 7  # every mixer of every grid
