"""The benchmark run: every family, form and length, then decoding and the training loop.

Cells are grouped by sequence length. For each length every cell is built, its peak memory
measured once (untimed), then all its cells are timed in interleaved rounds together with
samples of the 1024^3 GEMM rate, and the length's tensors are freed before the next one.
Calls that cannot fit (the quadratic forms at long T) or would take too long (predicted
from the same cell at the previous length) are skipped and recorded as such.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from pathlib import Path

import torch

from harness.allocator import allocator_state
from harness.bench import cases as C
from harness.bench import report
from harness.bench.decode import DECODE_FAMILIES, decode_times
from harness.peak_memory import peak_memory
from harness.bench.timing import gemm_sampler, interleaved, median

CPU_SEQ_LENS = [256, 512, 1024, 2048, 4096, 8192, 16384]
GPU_SEQ_LENS = [256, 1024, 4096, 16384, 65536]
QUICK_SEQ_LENS = [256, 512, 1024]


@dataclass
class BenchConfig:
    device: str = "cpu"
    dtype: str = "float32"
    bf16: bool = False  # bf16 autocast around every call
    compile: bool = False  # torch.compile every form
    threads: int | None = None
    batch: int = 8
    heads: int = 4
    head_dim: int = 64
    seq_lens: list[int] = field(default_factory=lambda: list(CPU_SEQ_LENS))
    families: list[str] = field(default_factory=lambda: list(C.FAMILIES))
    forms: list[str] | None = None  # None: every form of each family
    passes: list[str] = field(default_factory=lambda: list(C.PASSES))
    chunk_sizes: list[int] | None = None  # None: each family's default
    repeats: int = 5
    recurrent_max_len: int = 2048
    max_call_s: float = 5.0  # skip a call predicted to take longer
    max_call_bytes: float | None = None  # None: a quarter of the machine's memory (CPU), 60% of a GPU's
    limit_seq_len: int = 4096
    time_budget_s: float | None = None  # past it, the remaining lengths and phases are skipped
    memory: bool = True
    decode: bool = True
    decode_contexts: list[int] = field(default_factory=lambda: [256, 16384])
    decode_repeats: int = 30
    loop: bool = True
    loop_overrides: list[str] = field(default_factory=list)
    loop_steps: int = 208
    # single rounds of the loop timings spread by +-3% on a 2-core machine; medians of five
    # alternating rounds of the extras ratio, measured three times: 1.081-1.086
    loop_rounds: int = 5
    default_run: bool = True  # `python -m harness` as a user runs it, against the bare loop (harness.bench.default_run)
    run_overrides: list[str] = field(default_factory=list)  # Hydra overrides of that run (none: the default run)
    run_rounds: int = 1
    seed: int = 0


def quick_config(device: str = "cpu") -> BenchConfig:
    return BenchConfig(device=device, batch=2, seq_lens=list(QUICK_SEQ_LENS), repeats=2, limit_seq_len=1024,
                       recurrent_max_len=512, max_call_s=1.0, decode_repeats=10, loop_steps=48, loop_rounds=2,
                       default_run=False)


def _memory_budget(device: torch.device) -> float:
    if device.type == "cuda":
        return 0.6 * torch.cuda.get_device_properties(device).total_memory
    try:
        return 0.25 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def _growth_power(family: str, form: str) -> float:
    quadratic = form == "parallel" or (family == "softmax" and form == "recurrent")
    return 2.0 if quadratic else 1.0


def _cell_keys(cfg: BenchConfig):
    for family in cfg.families:
        for form in C.FORMS[family]:
            if cfg.forms is not None and form not in cfg.forms:
                continue
            sizes = cfg.chunk_sizes if (form == "chunk" and cfg.chunk_sizes) else [None]
            for c in sizes:
                for pass_ in cfg.passes:
                    if C.supports(family, form, pass_):
                        yield family, form, c, pass_


def _row(family, form, c, pass_, shape, status, **extra) -> dict[str, Any]:
    return {"family": family, "form": form, "chunk_size": c if form == "chunk" else None, "seq_len": shape.seq_len,
            "pass": pass_, "batch": shape.batch, "heads": shape.heads, "d_key": shape.d_key,
            "d_value": shape.d_value, "time_s": None, "peak_mem_bytes": None, "limit_ratio": None,
            "status": status, **extra}


def measure_forms(cfg: BenchConfig, device: torch.device, dtype: torch.dtype, *, d_key: int | None = None,
                  log: Callable[[str], None] = print, retnet: bool = False,
                  deadline: float | None = None) -> tuple[list[dict], list[float]]:
    """Rows for every (family, form, chunk size, length, pass) of cfg, and all GEMM rate samples
    (limit ratios against their median). Lengths not started by `deadline` (time.time()) are skipped."""
    d_key = d_key or cfg.head_dim
    budget = cfg.max_call_bytes or _memory_budget(device)
    item = torch.empty((), dtype=dtype).element_size()
    gemm = gemm_sampler(device)
    rows: list[dict] = []
    rates: list[float] = []
    last: dict[tuple, tuple[int, float]] = {}  # cell -> (seq_len, seconds) of its last run
    for t in sorted(cfg.seq_lens):
        shape = C.Shape(cfg.batch, cfg.heads, t, d_key, cfg.head_dim)
        group: dict[tuple, C.Case] = {}
        shared: dict[str, dict[str, torch.Tensor]] = {}  # one set of inputs per family at this length
        out_of_time = deadline is not None and time.time() > deadline
        for key in _cell_keys(cfg):
            family, form, c, pass_ = key
            fam_shape = shape if family != "softmax" else C.Shape(cfg.batch, cfg.heads, t, cfg.head_dim, cfg.head_dim)
            if out_of_time:
                rows.append(_row(*key, fam_shape, "skipped: time budget spent"))
                continue
            if form == "recurrent" and t > cfg.recurrent_max_len:
                rows.append(_row(*key, fam_shape, f"skipped: recurrent beyond {cfg.recurrent_max_len}"))
                continue
            need = C.transient_bytes(family, form, fam_shape, item) * (2.0 if pass_ == "fwdbwd" else 1.0)
            if need > budget:
                rows.append(_row(*key, fam_shape, f"skipped: needs about {need / 2**30:.1f} GiB"))
                continue
            if key in last:
                t0, s0 = last[key]
                predicted = s0 * (t / t0) ** _growth_power(family, form)
                if predicted > cfg.max_call_s:
                    rows.append(_row(*key, fam_shape, f"skipped: predicted {predicted:.0f} s per call"))
                    continue
            try:
                if family not in shared:
                    shared[family] = C.make_inputs(family, fam_shape, device, dtype, retnet=retnet)
                group[key] = C.make_case(family, form, pass_, fam_shape, device, dtype, chunk_size=c, retnet=retnet,
                                         compile=cfg.compile, autocast=cfg.bf16, inputs=shared[family])
            except (RuntimeError, ValueError) as err:
                rows.append(_row(*key, fam_shape, f"error: {type(err).__name__}: {err}"))
        if not group:
            continue
        setup = time.perf_counter()
        mems: dict[tuple, int | None] = {}
        runnable: dict[tuple, Callable[[], None]] = {}
        for key, case in group.items():
            try:
                case.run()  # first call: compiles, warms caches, faults pages in
                mems[key] = peak_memory(case.run, device, case.leaves() + [case.inputs["grad_out"]]) if cfg.memory else None
                runnable[key] = case.run
            except (RuntimeError, ValueError, MemoryError) as err:
                rows.append(_row(*key, case.shape, f"error: {type(err).__name__}: {str(err).splitlines()[0]}"))
        start = time.perf_counter()
        samples, group_rates = interleaved(runnable, cfg.repeats, device, gemm=lambda: median([gemm() for _ in range(3)]),
                                           warmup=0)
        rates += group_rates
        rate = median(group_rates)
        for key, ts in samples.items():
            family, form, c, pass_ = key
            case = group[key]
            sec = median(ts)
            last[key] = (t, sec)
            rows.append(_row(family, form, case.chunk_size, pass_, case.shape, "ok", time_s=sec,
                             peak_mem_bytes=mems.get(key), samples=ts, gemm_flops_per_s_here=rate))
        log(f"[bench] T={t}: {len(runnable)} calls, warm-up and memory {start - setup:.1f} s, "
            f"{cfg.repeats} timed rounds {time.perf_counter() - start:.1f} s (GEMM {rate / 1e9:.1f} GFLOP/s)")
        del group, runnable, shared
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    set_limit_ratios(rows, median(rates))
    return rows, rates


def set_limit_ratios(rows: list[dict], rate: float) -> None:
    """limit_ratio = time / (the essential flops at `rate`), the run's median GEMM rate: steadier
    than the few samples taken beside one length, and the same yardstick for every row."""
    for r in rows:
        if r["status"] == "ok":
            shape = C.Shape(r["batch"], r["heads"], r["seq_len"], r["d_key"], r["d_value"])
            r["limit_ratio"] = r["time_s"] / (C.limit_flops(shape, r["pass"]) / rate)
            r["gemm_flops_per_s"] = rate


def env_summary(device: torch.device) -> dict[str, Any]:
    from harness.outputs.results import env_info

    info = env_info(str(device))
    info["threads"] = torch.get_num_threads()
    info["allocator"] = allocator_state()  # what importing harness set (harness.allocator)
    info["allocator_env"] = {k: os.environ[k] for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                                       "THP_MEM_ALLOC_ENABLE", "HARNESS_MALLOC") if k in os.environ}
    info["argv"] = sys.argv
    if device.type == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
            info["cpu"] = names[0] if names else None
            info["cpu_count"] = os.cpu_count()
            info["load_average"] = os.getloadavg()
        except OSError:
            pass
    return info


def decode_bytes(cfg: BenchConfig) -> float:
    """Peak bytes of the decoding phase: every (family, context) cell keeps its context's inputs
    and its state at once while the steps are interleaved (harness.bench.decode)."""
    item = torch.empty((), dtype=getattr(torch, cfg.dtype)).element_size()
    families = [f for f in DECODE_FAMILIES if f in cfg.families]
    per = sum(C.transient_bytes(f, "recurrent", C.Shape(cfg.batch, cfg.heads, t, cfg.head_dim, cfg.head_dim), item)
              for f in families for t in cfg.decode_contexts)
    return per + len(families) * len(cfg.decode_contexts) * cfg.batch * cfg.heads * cfg.head_dim ** 2 * 4 * 2


def validate_bench(cfg: BenchConfig) -> None:
    """Every setting of a benchmark run, and what its device can hold: ValueError (one line)
    before any work. Forms that cannot fit at a length are skipped as the run goes; the decoding
    phase holds all its contexts at once, so it is checked here, as is the training loop's config."""
    from harness import checks
    from harness.devices import check_fits, select_device

    if not (isinstance(cfg.device, str) and (cfg.device in ("cpu", "cuda") or cfg.device.startswith("cuda:")
                                             and cfg.device[5:].isdigit())):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {cfg.device!r}")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {cfg.device} but no CUDA device is available")
    if cfg.device.startswith("cuda:") and int(cfg.device[5:]) >= torch.cuda.device_count():
        raise ValueError(f"--device {cfg.device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    checks.int_list("--seq-lens", cfg.seq_lens)
    checks.choice_list("--families", cfg.families, C.FAMILIES)
    forms = sorted({f for fam in C.FAMILIES for f in C.FORMS[fam]})
    if cfg.forms is not None:
        checks.choice_list("--forms", cfg.forms, forms)
        for family in cfg.families:
            checks.require(any(f in C.FORMS[family] for f in cfg.forms),
                           f"--forms {','.join(cfg.forms)} has no form of family {family} "
                           f"(it has {', '.join(C.FORMS[family])})")
    checks.choice_list("--passes", cfg.passes, C.PASSES)
    if cfg.chunk_sizes is not None:
        checks.int_list("--chunk-sizes", cfg.chunk_sizes)
    for name in ("batch", "heads", "head_dim", "repeats", "recurrent_max_len", "limit_seq_len",
                 "decode_repeats", "loop_steps", "loop_rounds", "run_rounds"):
        checks.integer(f"--{name.replace('_', '-')}", getattr(cfg, name))
    checks.integer("--threads", cfg.threads, nullable=True)
    checks.number("--max-call-s", cfg.max_call_s, "(0, inf)")
    checks.number("--time-budget-s", cfg.time_budget_s, "(0, inf)", nullable=True)
    checks.choice("dtype", cfg.dtype, ("float32", "float64", "bfloat16"))
    device = select_device(cfg.device)
    if cfg.decode:
        checks.int_list("--decode-contexts", cfg.decode_contexts)
        check_fits(f"bench decoding: contexts {','.join(map(str, cfg.decode_contexts))} x batch {cfg.batch} x "
                   f"{cfg.heads} heads x {cfg.head_dim}", decode_bytes(cfg), device)
    # the training loops measured (the loop benchmarks', the default run's): their configs checked
    for overrides in [cfg.loop_overrides] * cfg.loop + [cfg.run_overrides] * cfg.default_run:
        from harness.bench.loop import loop_config
        from harness.train.memory import check_training

        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            loop_cfg = loop_config(overrides, cfg.loop_steps, cfg.device, Path(tmp))
        check_training(loop_cfg)


def run_benchmark(cfg: BenchConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the benchmark described by cfg; returns the JSON-ready result (see docs/benchmarks.md)."""
    started = time.time()
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {cfg.device} but no CUDA device is available")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dtype = getattr(torch, cfg.dtype)
    for family in cfg.families:
        if family not in C.FAMILIES:
            raise ValueError(f"unknown family {family!r}; valid: {', '.join(C.FAMILIES)}")
    # A time budget keeps a quarter for decoding and the training loop, which run after the forms.
    deadline = None if cfg.time_budget_s is None else started + cfg.time_budget_s
    in_time = lambda: deadline is None or time.time() < deadline  # noqa: E731
    forms_deadline = None if deadline is None else started + 0.75 * cfg.time_budget_s
    rows, rates = measure_forms(cfg, device, dtype, log=log, deadline=forms_deadline)
    gemm_rate = median(rates)
    limit_len = cfg.limit_seq_len if cfg.limit_seq_len in cfg.seq_lens else max(cfg.seq_lens)
    summary: dict[str, Any] = {
        "gemm_flops_per_s": gemm_rate,
        "limit_seq_len": limit_len,
        "limit_ratio": report.limit_ratios(rows, limit_len),
        "delta_over_linear": report.delta_over_linear(rows, limit_len),
        "crossover": report.crossovers(rows),
        "memory_exponent": report.memory_exponents(rows),
        "decode": None,
        "loop": None,
        "extras": None,
        "default_run": None,
    }
    if cfg.decode and in_time():
        fams = tuple(f for f in DECODE_FAMILIES if f in cfg.families)
        start = time.perf_counter()
        summary["decode"] = decode_times(cfg.decode_contexts, batch=cfg.batch, heads=cfg.heads, d_key=cfg.head_dim,
                                         d_value=cfg.head_dim, device=device, dtype=dtype, repeats=cfg.decode_repeats,
                                         families=fams)
        log(f"[bench] decode: {time.perf_counter() - start:.1f} s")
    if cfg.loop and in_time():
        from harness.bench.loop import loop_efficiency

        start = time.perf_counter()
        summary["loop"] = loop_efficiency(cfg.loop_overrides, steps=cfg.loop_steps, rounds=cfg.loop_rounds,
                                          device=cfg.device)
        log(f"[bench] training loop: {time.perf_counter() - start:.1f} s")
    if cfg.loop and in_time():
        from harness.bench.loop import extras_ratio

        start = time.perf_counter()
        summary["extras"] = extras_ratio(cfg.loop_overrides, steps=cfg.loop_steps, rounds=cfg.loop_rounds,
                                         device=cfg.device)
        log(f"[bench] extras ratio: {time.perf_counter() - start:.1f} s")
    if cfg.default_run and in_time():
        from harness.bench.default_run import default_run_cost

        start = time.perf_counter()
        summary["default_run"] = default_run_cost(cfg.run_overrides, rounds=cfg.run_rounds, device=cfg.device)
        log(f"[bench] default run: {time.perf_counter() - start:.1f} s")
    summary["targets"] = report.targets(summary)
    summary["wall_time_s"] = time.time() - started
    return {"schema": 1, "kind": "bench", "config": asdict(cfg), "env": env_summary(device),
            "rows": rows, "summary": summary, "gemm_samples": rates,
            "definitions": {
                "limit_ratio": "time / (4 Dk Dv flop per token and head, x3 for fwdbwd, at the median rate of a "
                               "1024^3 float32 GEMM measured in the same run)",
                "crossover": "shortest measured T from which the chunk form is faster than the parallel form",
                "decode growth": "one step at the longest context / one step at the shortest",
                "loop efficiency": "steps/s of harness.train.loop.train / steps/s of bare forward+backward+optimizer",
                "extras ratio": "steps/s of the plain loop (model.short_conv=false, no fault watch, no clipping) / "
                                "steps/s of harness.train.loop.train, same data, optimizer and schedule",
                "default run": "seconds of `WANDB_MODE=disabled python -m harness` (a fresh process, progress lines off) / "
                               "seconds of the bare loop for as many steps on the same model and batch"}}
