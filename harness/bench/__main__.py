"""`python -m harness.bench [--quick] [--device cpu|cuda] [--json PATH] [...]`: run the benchmark.

The process runs as every process that imports harness does (harness.allocator: glibc keeps
freed memory for reuse, set at import; HARNESS_MALLOC=system keeps glibc's defaults), and
the JSON records that configuration (env.allocator), so what is measured is what a user runs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _strs(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit code 2), without the usage block."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m harness.bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a check that finishes in about a minute")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--json", type=Path, default=None, help="write the full result here")
    p.add_argument("--seq-lens", type=_ints, help="comma-separated lengths (default: 256..16384 on CPU, "
                                                   "256..65536 on CUDA)")
    p.add_argument("--families", type=_strs, help="softmax,linear,decay_scalar,decay_per_dim,delta,delta_gated")
    p.add_argument("--forms", type=_strs, help="parallel,chunk,recurrent")
    p.add_argument("--passes", type=_strs, help="fwd,fwdbwd")
    p.add_argument("--chunk-sizes", type=_ints, help="chunk lengths to measure (default: each family's)")
    p.add_argument("--batch", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--repeats", type=int, help="timed rounds per call (medians are reported)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--recurrent-max-len", type=int)
    p.add_argument("--max-call-s", type=float, help="skip calls predicted to take longer")
    p.add_argument("--limit-seq-len", type=int, help="length at which limit ratios are summarised")
    p.add_argument("--time-budget-s", type=float, help="skip the lengths and phases not started within this many "
                                                       "seconds (the JSON is still written)")
    p.add_argument("--decode-contexts", type=_ints)
    p.add_argument("--decode-repeats", type=int)
    p.add_argument("--loop-steps", type=int)
    p.add_argument("--loop-rounds", type=int)
    p.add_argument("--loop-override", action="append", dest="loop_overrides", default=None,
                   help="Hydra override for the training loop measured (repeatable), e.g. model=mamba")
    p.add_argument("--run-override", action="append", dest="run_overrides", default=None,
                   help="Hydra override for the default run measured (repeatable; none: the default run)")
    p.add_argument("--run-rounds", type=int)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast around every call")
    p.add_argument("--compile", action="store_true", help="torch.compile every form")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--no-decode", action="store_true")
    p.add_argument("--no-loop", action="store_true")
    p.add_argument("--no-default-run", action="store_true")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace):
    from harness.bench.run import GPU_SEQ_LENS, BenchConfig, quick_config

    cfg = quick_config(args.device) if args.quick else BenchConfig(device=args.device)
    if not args.quick and args.device.startswith("cuda"):
        cfg.seq_lens = list(GPU_SEQ_LENS)
        cfg.decode_contexts = [256, 16384, 65536]
        cfg.recurrent_max_len = 4096
        cfg.batch = 8
    names = {f.name for f in fields(cfg)}
    for name, value in vars(args).items():
        if name in names and value is not None and value is not False:
            setattr(cfg, name, value)
    cfg.bf16, cfg.compile = args.bf16, args.compile
    cfg.memory, cfg.decode, cfg.loop = not args.no_memory, not args.no_decode, not args.no_loop
    cfg.default_run = cfg.default_run and not args.no_default_run
    return cfg


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from harness.bench.report import format_summary, format_tables
    from harness.bench.run import run_benchmark, validate_bench
    from harness.errors import in_one_line
    from harness.outputs.results import write_json

    cfg = config_from_args(args)
    try:
        validate_bench(cfg)  # every argument, and what the device can hold, before any work
    except ValueError as exc:
        if not in_one_line(exc):
            raise
        print(f"python -m harness.bench: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.json is not None:
        _check_writable(args.json)
    result = run_benchmark(cfg, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(format_tables(result["rows"], result["summary"]["gemm_flops_per_s"]))
    print()
    print(format_summary(result["summary"]))
    if args.json is not None:
        write_json(args.json, result)
        print(f"\n[bench] wrote {args.json}")
    return result


def _check_writable(path: Path) -> None:
    """--json must be writable before an hour of measurement, not after: its folder checked as
    every writer of the harness checks one (harness.outputs.paths.check_destination)."""
    from harness.outputs.paths import check_destination

    try:
        check_destination("its folder", path.parent)
        why = ("it is a directory" if path.is_dir() else
               None if path.parent.is_dir() else f"its folder {path.parent} is missing")
    except ValueError as exc:
        why = str(exc)
    if why:
        print(f"python -m harness.bench: error: --json {path}: cannot write it ({why})", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
