"""The benchmark runs end to end at tiny sizes, writes every field, and its figures are computed right.

Nothing here is timed against a threshold: timings on a shared machine are noise at these
sizes. What is checked is structure (rows, summary, targets, JSON), the arithmetic of the
derived figures (limit, crossover, exponent) on rows made up for the purpose, and that the
memory tracker and the loop clock see what they should.
"""

import json
import math
import statistics
import subprocess
import sys

import pytest
import torch

from harness.bench import cases, report
from harness.bench.__main__ import main as bench_main
from harness.bench.loop import _window
from harness.peak_memory import peak_memory
from harness.config.compose import compose_config
from harness.run.job import run_job

TINY = ["--seq-lens", "16,32", "--batch", "1", "--heads", "2", "--head-dim", "8", "--repeats", "1",
        "--decode-contexts", "8,32", "--decode-repeats", "2", "--limit-seq-len", "32", "--threads", "1"]
LOOP = ["--loop-steps", "48", "--loop-rounds", "1", "--loop-override", "trainer.batch_size=4",
        "--loop-override", "task.seq_len=24", "--loop-override", "trainer.eval_examples=8"]
RUN = ["--run-override", "trainer.max_steps=16", "--run-override", "trainer.batch_size=4",
       "--run-override", "task.seq_len=24", "--run-override", "trainer.eval_examples=8",
       "--run-override", "trainer.measure_examples=8", "--run-override", "trainer.data_chunk=4"]
ROW_KEYS = {"family", "form", "chunk_size", "seq_len", "pass", "time_s", "peak_mem_bytes", "limit_ratio", "status",
            "batch", "heads", "d_key", "d_value"}
COST_KEYS = {"family", "form", "seq_len", "pass", "time_s", "peak_mem_bytes", "model", "limit_ratio"}


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    threads = torch.get_num_threads()
    try:
        bench_main([*TINY, *LOOP, *RUN, "--json", str(path)])
    finally:
        torch.set_num_threads(threads)
    return json.loads(path.read_text())


def test_every_family_form_length_and_pass_has_a_row(tiny_result):
    rows = tiny_result["rows"]
    assert all(ROW_KEYS <= set(r) for r in rows)
    seen = {(r["family"], r["form"], r["seq_len"], r["pass"]) for r in rows}
    for family in cases.FAMILIES:
        for form in cases.FORMS[family]:
            for t in (16, 32):
                for pass_ in cases.PASSES:
                    if cases.supports(family, form, pass_):
                        assert (family, form, t, pass_) in seen
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == len(rows), [r["status"] for r in rows if r["status"] != "ok"]
    for r in ok:
        assert r["time_s"] > 0 and r["limit_ratio"] > 0 and r["peak_mem_bytes"] > 0


def test_summary_holds_every_figure(tiny_result):
    s = tiny_result["summary"]
    assert s["gemm_flops_per_s"] > 0 and s["limit_seq_len"] == 32
    assert set(s["limit_ratio"]) == set(cases.FAMILIES)
    assert s["limit_ratio"]["linear"]["chunk"]["fwdbwd"] > 0
    assert set(s["crossover"]) == set(cases.LINEAR_FAMILIES)
    assert set(s["memory_exponent"]) == set(cases.LINEAR_FAMILIES)
    decode = s["decode"]
    assert decode["contexts"] == [8, 32] and decode["reference_context"] == 32
    assert set(decode["families"]) == {"linear", "decay_scalar", "decay_per_dim", "delta", "delta_gated", "softmax"}
    assert set(s["delta_over_linear"]) == {"delta", "delta_gated"}
    assert all(d["growth"] > 0 for d in decode["families"].values())
    loop = s["loop"]
    assert loop["efficiency"] > 0 and loop["loop_steps_per_s"] > 0 and loop["bare_steps_per_s"] > 0
    assert loop["task"] == "recall" and loop["batch_size"] == 4
    extras = s["extras"]  # the plain loop is the same loop without short convolution, fault watch, clipping
    assert extras["ratio"] == pytest.approx(extras["plain_steps_per_s"] / extras["loop_steps_per_s"])
    assert extras["plain_samples"] and all(r > 0 for r in extras["plain_samples"])
    run = s["default_run"]  # `python -m harness` in its own process, against the bare loop for as many steps
    assert run["steps"] == 16 and 0 <= run["accuracy"] <= 1 and run["loss"] > 0
    assert run["ratio"] == pytest.approx(run["run_s"] / run["bare_s"]) and run["bare_s"] > 0
    parts = run["parts"]
    assert all(parts[k] > 0 for k in ("start_and_save", "setup", "steps", "measurements"))
    assert parts["process"] > parts["setup"] + parts["steps"] + parts["measurements"]
    assert "trainer.max_steps=16" in run["overrides"]
    table = report.format_summary(s).splitlines()
    first = next(i for i, line in enumerate(table) if line.startswith("default run ("))
    assert "16 steps" in table[first] and "bare loop" in table[first]
    assert [line.split()[0] for line in table[first + 1:first + 1 + len(report.RUN_PARTS)]] == \
        ["process", "set-up", "training", "evaluations", "end-of-run"]
    names = {t["name"] for t in s["targets"]}
    assert any(n.startswith("limit ratio, decay_per_dim") for n in names)
    assert any(n.startswith("decode growth, softmax") for n in names)
    assert any(n.startswith("decode flatness, decay_per_dim") for n in names)
    assert any(n.startswith("decode flatness, delta_gated") for n in names)
    assert any(n.startswith("delta chunk fwd+bwd over linear chunk") for n in names)
    assert "loop efficiency" in names and "extras ratio (plain loop / default train() step)" in names
    assert all(t["met"] in (True, False, None) for t in s["targets"])
    assert {"device", "threads", "torch"} <= set(tiny_result["env"])
    assert tiny_result["env"]["threads"] == 1


def test_limit_ratio_is_time_over_the_state_arithmetic(tiny_result):
    rate = tiny_result["summary"]["gemm_flops_per_s"]  # the run's median GEMM rate, for every row
    assert rate == pytest.approx(statistics.median(tiny_result["gemm_samples"]))
    for r in tiny_result["rows"]:
        if r["status"] != "ok":
            continue
        assert r["gemm_flops_per_s"] == rate and r["gemm_flops_per_s_here"] > 0
        shape = cases.Shape(r["batch"], r["heads"], r["seq_len"], r["d_key"], r["d_value"])
        flops = 4 * shape.d_key * shape.d_value * shape.heads * shape.tokens * (3 if r["pass"] == "fwdbwd" else 1)
        assert r["limit_ratio"] == pytest.approx(r["time_s"] / (flops / rate), rel=1e-9)


def test_command_line_writes_json_and_a_table(tmp_path):
    out = tmp_path / "cli.json"
    args = [*TINY, "--families", "linear,decay_scalar", "--forms", "chunk,parallel", "--passes", "fwdbwd",
            "--no-loop", "--no-decode", "--no-memory", "--no-default-run", "--json", str(out)]
    proc = subprocess.run([sys.executable, "-m", "harness.bench", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "forward + backward" in proc.stdout and "targets:" in proc.stdout
    result = json.loads(out.read_text())
    assert {r["family"] for r in result["rows"]} == {"linear", "decay_scalar"}
    assert result["summary"]["decode"] is None and result["summary"]["loop"] is None
    assert result["summary"]["default_run"] is None
    assert result["env"]["allocator"]["configured"]  # set by importing harness, as in any user's process


@pytest.mark.parametrize("model,family,d_key", [("elu", "linear", 8), ("mamba", "decay_per_dim", 8),
                                                 ("retnet", "decay_scalar", 8), ("softmax", "softmax", 8),
                                                 ("taylor", "linear", 1 + 16 + 256)])  # its q/k width model.qk_dim=16
def test_cost_mode_writes_a_cost_table(tmp_path, model, family, d_key):
    extra = ["model.options.gate=per_dim"] if model == "mamba" else []
    cfg = compose_config([f"model={model}", *extra, "mode=cost", "logger=none", "trainer.progress=false",
                          "trainer.device=cpu", "cost.seq_lens=[16,32]", "cost.batch_size=1", "cost.n_heads=2",
                          "cost.head_dim=8", "cost.repeats=1", "cost.recurrent_max_len=16", f"out_dir={tmp_path}"])
    run_job(cfg)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["mode"] == "cost" and res["status"] == "ok" and res["model"] == model
    rows = res["cost"]
    assert rows and all(COST_KEYS <= set(r) for r in rows)
    assert {r["family"] for r in rows} == {family} and {r["model"] for r in rows} == {model}
    assert {r["d_key"] for r in rows} == {d_key}
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["seq_len"] for r in ok} == {16, 32}
    assert all(r["time_s"] > 0 and r["peak_mem_bytes"] > 0 and r["limit_ratio"] > 0 for r in ok)
    skipped = [r for r in rows if r["status"] != "ok"]
    assert all(r["form"] == "recurrent" and r["seq_len"] == 32 and r["time_s"] is None for r in skipped)
    assert res["summary"]["family"] == family and res["summary"]["gemm_flops_per_s"] > 0


# ---- derived figures on made-up rows ---------------------------------------------------------------

def _row(family, form, t, pass_, time_s, status="ok", mem=None, c=None):
    return {"family": family, "form": form, "seq_len": t, "pass": pass_, "time_s": time_s, "status": status,
            "peak_mem_bytes": mem, "limit_ratio": 1.0, "chunk_size": c}


def test_crossover_is_where_chunk_stays_faster():
    rows = []
    for t, par, chunk in ((256, 1.0, 2.0), (512, 2.0, 1.5), (1024, 4.0, 3.0)):
        rows += [_row("linear", "parallel", t, "fwd", par), _row("linear", "chunk", t, "fwd", chunk, c=64)]
    rows.append(_row("linear", "chunk", 2048, "fwd", 6.0, c=64))
    rows.append(_row("linear", "parallel", 2048, "fwd", None, status="skipped: needs about 9 GiB"))
    assert report.crossovers(rows) == {"linear": {"fwd": 512}}
    # A slower chunk at the longest length means no crossover at all.
    rows.append(_row("linear", "chunk", 4096, "fwd", 20.0, c=64))
    rows.append(_row("linear", "parallel", 4096, "fwd", 10.0))
    assert report.crossovers(rows) == {"linear": {"fwd": None}}


def test_best_chunk_length_is_used_and_memory_exponent_fitted():
    rows = [_row("decay_scalar", "chunk", t, "fwdbwd", 1e-3 * t / 256 * f, mem=1000 * t, c=c)
            for t in (256, 512, 1024) for c, f in ((32, 1.2), (64, 1.0))]
    best = report.best_chunk_rows(rows)
    assert {r["chunk_size"] for r in best} == {64}
    assert report.memory_exponents(rows)["decay_scalar"]["fwdbwd"] == pytest.approx(1.0)
    assert report.fit_exponent([1, 2, 4], [3, 12, 48]) == pytest.approx(2.0)


def test_targets_are_marked_met_or_missed():
    summary = {"limit_seq_len": 4096, "limit_ratio": {"linear": {"chunk": {"fwdbwd": 3.5}},
                                                      "decay_scalar": {"chunk": {"fwdbwd": 7.0}}},
               "crossover": {"linear": {"fwdbwd": 256}, "decay_scalar": {"fwdbwd": None}},
               "decode": {"contexts": [256, 16384], "reference_context": 16384,
                          "families": {"linear": {"growth": 1.05}, "softmax": {"growth": 3.0}}},
               "memory_exponent": {"linear": {"fwdbwd": 1.01}}, "loop": {"efficiency": 0.95},
               "extras": {"ratio": 1.2}}
    met = {t["name"]: t["met"] for t in report.targets(summary)}
    assert met["limit ratio, linear chunk fwd+bwd at T=4096"] is True
    assert met["limit ratio, decay_scalar chunk fwd+bwd at T=4096"] is False
    assert met["limit ratio, decay_per_dim chunk fwd+bwd at T=4096"] is None  # not measured
    assert met["crossover chunk < parallel, linear fwdbwd"] is True
    assert met["crossover chunk < parallel, decay_scalar fwdbwd"] is False
    assert met["decode flatness, linear, 16384 vs 256"] is True
    assert met["decode growth, softmax with a KV cache, 16384 vs 256"] is False
    assert met["peak memory exponent, linear chunk fwd+bwd"] is True and met["loop efficiency"] is True
    assert met["extras ratio (plain loop / default train() step)"] is False


def test_memory_tracker_counts_what_a_call_holds_at_once():
    x = torch.ones(1000)

    def call():
        a = torch.empty(250_000)  # 1 MB, alive with b
        b = a + 1
        del a, b
        c = x * 2  # small, after the peak
        return c

    peak = peak_memory(call, torch.device("cpu"), [x])
    assert 2_000_000 <= peak < 2_100_000


def test_loop_window_counts_whole_data_chunks():
    stamps = [float(i) for i in range(1, 65)]  # step i ends at time i
    steps, seconds = _window(stamps, log_every=25, data_chunk=16, device=torch.device("cpu"), skip=16)
    assert steps == 48 and seconds == pytest.approx(48.0)
    steps, seconds = _window(stamps, log_every=25, data_chunk=16, device=torch.device("cuda"), skip=16)
    assert (steps, seconds) == (25, pytest.approx(25.0))  # from step 25 to step 50, both after a host sync
    with pytest.raises(ValueError, match="too short"):
        _window(stamps[:20], log_every=25, data_chunk=16, device=torch.device("cpu"), skip=16)


def test_limit_flops_definition():
    shape = cases.Shape(batch=8, heads=4, seq_len=4096, d_key=64, d_value=64)
    assert cases.limit_flops(shape, "fwd") == 4 * 64 * 64 * 4 * 8 * 4096
    assert cases.limit_flops(shape, "fwdbwd") == 3 * cases.limit_flops(shape, "fwd")
    assert math.isclose(report.fit_exponent([1, 10], [5, 50]), 1.0)


@pytest.mark.parametrize("family", cases.LINEAR_FAMILIES)
def test_chunk_forms_agree_block_by_block_and_in_one_block(monkeypatch, family):
    # The chunk Functions run their in-chunk products a block of chunks at a time on CPU (for the
    # cache); block boundaries must not change a single number, forward or backward.
    import harness.ops.common.chunking as chunking
    import harness.ops.fused_cpu as fused

    monkeypatch.setattr(fused, "_enabled", False)  # the batched form is the one that has blocks
    shape = cases.Shape(batch=2, heads=2, seq_len=100, d_key=8, d_value=4)
    inputs = cases.make_inputs(family, shape, torch.device("cpu"), torch.float64, seed=3)
    fn = cases.forward_fn(family, "chunk", 16)
    results = []
    for block in (3, 10**9):
        monkeypatch.setattr(chunking, "CPU_BLOCK", block)
        leaves = [x.detach().clone().requires_grad_() for name, x in inputs.items() if name != "grad_out"]
        o = fn(*leaves)
        results.append([o.detach(), *torch.autograd.grad(o, leaves, inputs["grad_out"])])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a_spent_time_budget_skips_the_rest_and_still_reports():
    from harness.bench.run import BenchConfig, run_benchmark

    cfg = BenchConfig(batch=1, heads=1, head_dim=4, seq_lens=[8, 16], families=["linear"], forms=["chunk"],
                      repeats=1, time_budget_s=0.0, loop=False, limit_seq_len=16)
    result = run_benchmark(cfg, log=lambda s: None)
    assert {r["status"] for r in result["rows"]} == {"skipped: time budget spent"}
    assert result["summary"]["decode"] is None and result["summary"]["targets"]


BAD_BENCH = [
    (["--seq-lens", "0"], "--seq-lens must be a non-empty list of integers >= 1, got [0]"),
    (["--seq-lens", ""], "--seq-lens must be a non-empty list of integers >= 1, got []"),
    (["--seq-lens", "abc"], "argument --seq-lens: expected comma-separated integers, got 'abc'"),
    (["--families", "foo"], "--families must be a non-empty list drawn from softmax, linear"),
    (["--forms", "blocked"], "--forms must be a non-empty list drawn from chunk, parallel, recurrent"),
    (["--families", "softmax", "--forms", "chunk"], "--forms chunk has no form of family softmax"),
    (["--passes", "bwd"], "--passes must be a non-empty list drawn from fwd, fwdbwd"),
    (["--chunk-sizes", "0,64"], "--chunk-sizes must be a non-empty list of integers >= 1"),
    (["--device", "tpu"], "--device must be cpu, cuda or cuda:N, got 'tpu'"),
    (["--batch", "0"], "--batch must be a positive integer, got 0"),
    (["--heads", "-2"], "--heads must be a positive integer, got -2"),
    (["--repeats", "0"], "--repeats must be a positive integer"),
    (["--threads", "0"], "--threads must be a positive integer or null, got 0"),
    (["--max-call-s", "0"], "--max-call-s must be a positive number"),
    (["--time-budget-s", "-5"], "--time-budget-s must be a positive number or null"),
    (["--decode-contexts", "0"], "--decode-contexts must be a non-empty list of integers >= 1"),
    (["--decode-contexts", "100000000"], "bench decoding: contexts 100000000 x batch 8 x 4 heads x 64 needs about"),
    (["--loop-override", "model=nope"], "unknown model 'nope'; valid:"),
    (["--run-override", "model=nope"], "unknown model 'nope'; valid:"),
    (["--run-rounds", "0"], "--run-rounds must be a positive integer"),
    (["--loop-override", "trainer.batch_size=100000", "--loop-override", "task.seq_len=100000"],
     "training: batch 100000 x length 100000 x width 64"),
    (["--json", "/nonexistent/bench.json"], "--json /nonexistent/bench.json: cannot write it"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    *([] if torch.cuda.is_available() else [(["--device", "cuda"], "--device cuda but no CUDA device is available")]),
]


@pytest.mark.parametrize("argv, fragment", BAD_BENCH, ids=[" ".join(a) for a, _ in BAD_BENCH])
def test_bad_bench_argument_is_one_line_before_any_work(argv, fragment, monkeypatch, capsys):
    def no_work(*args, **kwargs):
        raise AssertionError("the benchmark started")

    monkeypatch.setattr("harness.bench.run.run_benchmark", no_work)
    with pytest.raises(SystemExit) as stop:
        bench_main(argv)
    assert stop.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("python -m harness.bench: error: "), err
    assert fragment in err[0], err[0]


def test_bad_bench_argument_in_a_real_process():
    """`--seq-lens 0` once ran a minute of decoding and loop benchmarks and exited 0."""
    done = subprocess.run([sys.executable, "-m", "harness.bench", "--seq-lens", "0"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("python -m harness.bench: error: --seq-lens must be a non-empty list of "
                                   "integers >= 1, got [0]")
