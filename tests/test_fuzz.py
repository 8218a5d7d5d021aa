"""Any override set at all either runs or is refused in one line: never a traceback.

Hypothesis draws override sets from the structured config schema (harness.config.schema, the
ModelConfig, every built-in task's Config): keys as the schema names them and misspelled,
values of the right type in and out of range, of the wrong type, lists, interpolations and
grammar the Hydra parser must reject, `+key=value` and `~key`, group choices that exist and
ones that do not. Each draw goes through the real entry, `harness.run.cli.main`, in this
process, on top of a one-step debug trainer writing under pytest's tmp folder. A draw may
run (exit 0, or 1 with one line for a run error such as a numerical fault), or be refused
(exit 2, exactly one line on stderr); anything else, a traceback above all, fails.

HARNESS_FUZZ_DRAWS sets the number of draws (default 50: about a minute on one core under load); HARNESS_FUZZ_RANDOM=1 draws a new
sequence instead of the fixed one CI repeats.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import itertools
import os
import sys
import typing

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from harness.config import schema  # noqa: E402
from harness.model import ModelConfig  # noqa: E402
from harness.run import cli  # noqa: E402
from harness.tasks import TASKS  # noqa: E402

DRAWS = int(os.environ.get("HARNESS_FUZZ_DRAWS", "50"))  # more: HARNESS_FUZZ_DRAWS=1000
# Every draw starts from a one-step debug run and tiny probe and cost grids, so a valid draw
# costs a fraction of a second; a draw may override any of these.
BASE = ["trainer=debug", "trainer.max_steps=1", "logger=none", "trainer.eval_examples=8",
        "trainer.measure_examples=4", "probe.d=[8]", "probe.n=[16]", "probe.candidates=16",
        "probe.max_queries=16", "cost.seq_lens=[16]", "cost.repeats=1", "cost.batch_size=1",
        "cost.n_heads=1", "cost.head_dim=8", "trainer.threads=1"]
# Keys left alone: they would only make valid draws slow (a compile, thousands of steps) or
# write outside the draw's folder. Their validation has its own cases in test_validation.
FIXED = {"out_dir", "trainer.max_steps", "trainer.compile", "trainer.threads", "trainer.progress"}
SMALL = {"seq_len": 128, "test_seq_len": 256, "vocab_size": 512, "d_model": 64, "n_layers": 3,
         "n_heads": 4, "num_pairs": 24, "num_queries": 32, "batch_size": 16, "eval_examples": 16,
         "measure_examples": 8, "data_chunk": 4, "chunk_size": 64, "qk_dim": 32, "favor_features": 64,
         "conv_size": 5, "mlp_ratio": 4, "key_len": 3, "max_distance": 100, "min_distance": 40,
         "num_triggers": 8, "eval_every": 4, "log_every": 4, "ckpt_every": 4, "warmup_steps": 4,
         "d": 32, "n": 64, "candidates": 64, "max_queries": 64, "seq_lens": 64, "repeats": 2,
         "head_dim": 16, "recurrent_max_len": 64, "test_num_pairs": 24}
JUNK = ["abc", "1.5", "-1", "0", "1e309", "nan", "-inf", "[]", "[1,2]", "[a,b]", "{a: 1}", "''", "null",
        "true", "${oc.env:HOME}", "${nope}", "${task.seq_len}", "a=b", "'quoted'", '"', "[1,", "x y", "%",
        ",", "1_000", "9" * 30, "-0.0", "[[1]]", "\\\\", "😀", "cuda:99", "elu", "task"]
GROUPS = {"task": [*TASKS, "nope", "os.path", "harness.tasks.base", "json"],
          "model": ["softmax", "linear", "elu", "favor", "taylor", "dpfp", "retnet", "mamba", "deltanet", "nope",
                    "torch.nn.Linear", "collections.OrderedDict"],
          "trainer": ["debug", "default", "nope"], "logger": ["none", "nope"],
          "+experiment": ["capacity", "snr", "mqar", "nope"]}


def _leaves() -> list[tuple[str, object]]:
    """(dotted key, type) for every field a user can set."""
    sections = {"": schema.Config, "trainer.": schema.TrainerConfig, "logger.": schema.LoggerConfig,
                "probe.": schema.ProbeConfig, "cost.": schema.CostConfig, "sweep.": schema.SweepConfig,
                "model.": ModelConfig}
    out = []
    for prefix, cls in sections.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if prefix == "" and f.name in ("task", "model", "trainer", "logger", "probe", "cost", "sweep"):
                continue
            out.append((prefix + f.name, hints[f.name]))
    for module in TASKS.values():
        hints = typing.get_type_hints(module.Config)
        out += [(f"task.{f.name}", hints[f.name]) for f in dataclasses.fields(module.Config)]
    return sorted({k: t for k, t in out if k not in FIXED}.items())


LEAVES = _leaves()


def _render(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_render(v) for v in value) + "]"
    return str(value)


def _typed(key: str, kind) -> st.SearchStrategy:
    """Values of the field's own type, mostly in a range where a run stays small."""
    name = key.rsplit(".", 1)[-1]
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Union:  # Optional[X]
        inner = [a for a in args if a is not type(None)][0]
        return st.one_of(st.none(), _typed(key, inner))
    if origin is list:
        return st.lists(_typed(key, args[0]), max_size=3)
    if kind is bool:
        return st.booleans()
    if kind is int:
        top = SMALL.get(name, 8)
        return st.one_of(st.integers(1, top), st.integers(-3, 0), st.integers(top + 1, 4 * top))
    if kind is float:
        return st.one_of(st.floats(0, 1, allow_nan=False), st.floats(-1e3, 1e3, allow_nan=False),
                         st.sampled_from([1e-12, 0.5, 2.0, float("inf"), float("nan")]))
    if kind is str:
        choices = {"device": ["cpu", "auto", "cuda", "tpu", "cuda:0"], "precision": ["fp32", "bf16", "fp8"],
                   "form": ["chunk", "parallel", "recurrent", "blocked"], "gate": ["scalar", "per_dim", "x"],
                   "norm": ["layernorm", "rmsnorm", "batchnorm"], "pos_emb": ["none", "learned", "rotary"],
                   "favor_redraw": ["never", "step", "always"], "rule": ["delta", "additive", "hebbian"], "mode": ["train", "probe", "cost", "eval"],
                   "name": ["elu", "none", "wandb", "nope", "a.b.C"], "mode_logger": ["offline", "disabled"],
                   "forms": ["parallel", "chunk", "recurrent", "bogus"], "resume": ["/nonexistent", "."]}
        return st.sampled_from(choices.get(name, ["x", "abc", "a/b", "tag", "a" * 200]))
    return st.sampled_from(JUNK)  # Any (model.options, task)


@st.composite
def override(draw) -> str:
    """One override: a schema key set to a typed or junk value, a misspelled or new key, a
    deletion, or a group choice."""
    form = draw(st.sampled_from(["typed", "typed", "typed", "junk", "plus", "tilde", "misspelt", "group"]))
    if form == "group":
        group = draw(st.sampled_from(sorted(GROUPS)))
        return f"{group}={draw(st.sampled_from(GROUPS[group]))}"
    key, kind = draw(st.sampled_from(LEAVES))
    if form == "tilde":
        return f"~{key}"
    if form == "misspelt":
        key = key + draw(st.sampled_from(["x", "_", "s"]))
    if form == "plus":
        key = "+" + draw(st.sampled_from([key, f"{key.rsplit('.', 1)[0]}.extra", "extra", "model.options.window"]))
    if form in ("junk", "misspelt") or (form == "plus" and draw(st.booleans())):
        return f"{key}={draw(st.sampled_from(JUNK))}"
    return f"{key}={_render(draw(_typed(key, kind)))}"


counter = itertools.count()
OUTCOMES: collections.Counter = collections.Counter()  # exit code -> draws, reported at the end


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    yield tmp_path_factory.mktemp("fuzz")
    print(f"\nfuzz: {sum(OUTCOMES.values())} draws, exit codes {dict(sorted(OUTCOMES.items()))}")


@pytest.fixture(autouse=True)
def quiet_process(monkeypatch, workdir):
    threads = torch.get_num_threads()
    monkeypatch.setattr(sys, "argv", ["harness"])
    monkeypatch.chdir(workdir)  # a relative path a draw names (trainer.resume=.) stays in tmp
    yield
    torch.set_num_threads(threads)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """cli.main in this process: (exit code, stdout, stderr); an exception escaping it is the
    traceback a user would see, and fails the draw."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=DRAWS, deadline=None, database=None, derandomize=not os.environ.get("HARNESS_FUZZ_RANDOM"),
          suppress_health_check=list(HealthCheck))
@given(st.lists(override(), min_size=1, max_size=4))
def test_any_override_set_runs_or_is_refused_in_one_line(workdir, draws):
    """Every draw: exit 0 with results, or one line (1: a recorded run error; 2: refused)."""
    out_dir = workdir / f"run{next(counter)}"
    argv = [*BASE, *draws, f"out_dir={out_dir}"]
    code, stdout, stderr = run_cli(argv)
    lines = [line for line in stderr.splitlines() if line.strip()]
    OUTCOMES[code] += 1
    where = f"\n  overrides: {' '.join(draws)}\n  exit {code}, stderr:\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, where
    assert code in (0, 1, 2), where
    if code == 0:
        assert (out_dir / "results.json").exists(), where
    else:
        errors = [line for line in lines if line.startswith("harness: error: ")]
        assert len(lines) == 1 and len(errors) == 1, where
        if code == 1:  # a run error (numerical fault, out of memory): recorded as a failed run
            assert (out_dir / "results.json").exists(), where
        else:  # refused: nothing ran
            assert not (out_dir / "results.json").exists(), where
