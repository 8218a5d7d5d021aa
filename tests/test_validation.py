"""Every bad config value stops before any work: exit code 2 and one line naming the key.

The table runs in-process through `harness.run.cli.main` (Hydra is initialised once per process,
so a case costs one compose); tests/test_cli.py keeps a few real-process checks.
"""
import sys

import pytest
import torch

from harness.config.compose import compose_config
from harness.run import cli

# (overrides, key the line must name, fragment saying what is wrong or allowed)
CASES = [
    # types, caught by Hydra's schema
    (["trainer.max_steps=abc"], "trainer.max_steps", "must be an integer, got 'abc'"),
    (["trainer.lr=fast"], "trainer.lr", "must be a number, got 'fast'"),
    (["trainer.compile=maybe"], "trainer.compile", "must be true or false"),
    (["seed=1.5"], "seed", "must be an integer"),
    # unknown keys and choices
    (["trainer.lrr=0.1"], "trainer.lrr", "unknown key 'trainer.lrr'; valid keys here: ablate, batch_size"),
    (["+trainer.extra=1"], "trainer.extra", "unknown key"),
    (["task=induction", "task.num_pairs=3"], "task.num_pairs", "unknown key"),
    (["~probe"], "probe", "missing key 'probe'"),
    (["model=transformerxl"], "model", "unknown model 'transformerxl'; valid: deltanet, deltanet_additive, dpfp, dpfp_nu2"),
    (["task=nope"], "task", "unknown task 'nope'; valid: forgetting, induction, interference, needle, recall"),
    (["mode=eval"], "mode", "valid: train, probe, cost"),
    (["trainer.precision=fp8"], "trainer.precision", "'fp8'; valid: fp32, bf16"),
    (["logger.mode=loud"], "logger.mode", "'loud'; valid: offline, online, disabled"),
    (["model.form=blocked"], "model.form", "'blocked'; valid: chunk, parallel, recurrent"),
    (["model=mamba", "model.gate=vector"], "model.options.gate", "'vector'; valid: scalar, per_dim"),
    (["model=mamba", "model.options.gate=vector"], "model.options.gate", "'vector'; valid: scalar, per_dim"),
    (["model.norm=batchnorm"], "model.norm", "valid: layernorm"),
    (["cost.forms=[bogus]"], "cost.forms", "drawn from chunk, parallel, recurrent, got ['bogus']"),
    # ranges: top level, trainer, logger
    (["seed=-1"], "seed", "must be an integer in [0, "),
    (["trainer.max_steps=0"], "trainer.max_steps", "must be a positive integer, got 0"),
    (["trainer.batch_size=-4"], "trainer.batch_size", "must be a positive integer, got -4"),
    (["trainer.lr=0"], "trainer.lr", "must be a positive number, got 0.0"),
    (["trainer.lr=nan"], "trainer.lr", "must be a positive number, got nan"),
    (["trainer.warmup_steps=-1"], "trainer.warmup_steps", "must be a non-negative integer"),
    (["trainer.grad_clip=-1"], "trainer.grad_clip", "must be a non-negative number, got -1.0"),
    (["trainer.weight_decay=-0.1"], "trainer.weight_decay", "must be a non-negative number"),
    (["trainer.min_lr_ratio=1.5"], "trainer.min_lr_ratio", "must be a number in [0, 1], got 1.5"),
    (["trainer.target_accuracy=0"], "trainer.target_accuracy", "in (0, 1] or null"),
    (["trainer.ckpt_every=0"], "trainer.ckpt_every", "must be a positive integer or null, got 0"),
    (["trainer.threads=0"], "trainer.threads", "must be a positive integer or null"),
    (["trainer.eval_every=0"], "trainer.eval_every", "must be a positive integer"),
    (["trainer.device=tpu"], "trainer.device", "must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    (["trainer.device=cuda:x"], "trainer.device", "got 'cuda:x'"),
    *([] if torch.cuda.is_available() else [
        (["trainer.device=cuda:1"], "trainer.device", "trainer.device=cuda:1 but no CUDA device is available")]),
    (["logger.project=a/b"], "logger.project", "without any of /"),
    # probe and cost
    (["probe.d=[]"], "probe.d", "must be a non-empty list of integers >= 2, got []"),
    (["probe.candidates=1"], "probe.candidates", "must be an integer >= 2"),
    (["probe.seed=-3"], "probe.seed", "got -3"),
    (["cost.seq_lens=[]"], "cost.seq_lens", "non-empty list"),
    (["cost.repeats=0"], "cost.repeats", "must be a positive integer"),
    (["mode=cost", "model=softmax", "cost.forms=[chunk]"], "cost.forms",
     "softmax family has parallel, recurrent"),
    # model: ranges and relations
    (["model.d_model=0"], "model.d_model", "must be a positive integer, got 0"),
    (["model.d_model=64", "model.n_heads=3"], "model.n_heads", "a divisor of model.d_model=64, got 3"),
    (["model.chunk_size=0"], "model.chunk_size", "must be a positive integer, got 0"),
    (["model=favor", "model.favor_features=0"], "model.options.favor_features", "integer or null, got 0"),
    (["model=retnet", "model.options.decay=1.5"], "model.options.decay", "must be a number in (0, 1) or null, got 1.5"),
    (["model=retnet", "model.decay=0"], "model.options.decay", "in (0, 1) or null, got 0"),
    (["model=swa", "model.window=0"], "model.options.window", "must be a positive integer or null, got 0"),
    (["model=softmax", "model.window=8"], "model.options.window", "null for model.name=softmax (it is an option of swa)"),
    (["model=elu", "model.options.rule=additive"], "model.options.rule",
     "delta for model.name=elu (it is an option of deltanet and gated_deltanet)"),
    (["model=elu", "model.options.retnet_head=2"], "model.options.retnet_head",
     "not an option of any built-in mixer (model.name=elu takes: eps, normalize)"),
    (["model.eps=0"], "model.options.eps", "must be a positive number, got 0"),
    (["model.dropout=1"], "model.dropout", "must be a number in [0, 1), got 1.0"),
    (["model.qk_dim=0"], "model.qk_dim", "positive integer or null"),
    (["model=softmax", "model.d_model=6", "model.n_heads=2", "model.rotary=true"], "model.rotary",
     "even q/k width"),
    # recall: pairs and queries fit the sequence, the key half of the vocabulary holds the keys
    (["task.seq_len=8", "task.num_pairs=8"], "num_pairs", "exceeds seq_len=8"),
    (["task.num_pairs=4", "task.num_queries=60"], "num_queries", "= 68 exceeds seq_len=64"),
    (["task.num_pairs=200"], "num_pairs", "do not fit in the key half [1, 128)"),
    (["task.test_seq_len=[16]", "task.test_num_pairs=[8]"], "num_pairs", "exceeds test seq_len=16"),
    (["task.power_a=0"], "power_a", "must be in (0, 8.0]"),
    (["task.test_seq_len=128"], "task.test_seq_len", "must be a list in brackets, e.g. task.test_seq_len=[128]"),
    (["task.filler=noise"], "filler", "unknown filler 'noise'; valid: zero, random"),
    (["task.filler=random", "task.filler_rate=2"], "filler_rate", "must be in [0, 1]"),
    # positions: learned absolute positions do not extrapolate past the training length
    (["model=softmax", "task.test_seq_len=[64,1024]"], "model.pos_emb=none",
     "learned absolute positions, trained at length 64: they cannot be evaluated at length 1024"),
    (["model=elu", "model.pos_emb=learned", "task.test_seq_len=[256]"], "model.rotary=true", "cannot be evaluated"),
    # forgetting and needle
    (["task=forgetting", "task.num_overwrites=9"], "num_overwrites", "exceeds num_pairs=4"),
    (["task=needle", "task.depth=1.2"], "depth", "must be in [0, 1]"),
    (["task=needle", "task.test_seq_len=[128,2]"], "seq_len", "test seq_len=2"),
    # found by tests/test_fuzz.py: each ended in a traceback, or was refused only after work began
    (["task.power_a=inf"], "power_a", "must be a finite number, got inf"),
    (["task.power_a=1000"], "power_a", "must be in (0, 8.0] (1: uniform gaps), got 1000.0"),
    (["cost.batch_size=${oc.env:HOME}"], "cost.batch_size", "could not be converted to Integer"),
    (["trainer.lr=${nope}"], "trainer.lr", "bad value for 'trainer.lr'"),
    (["+model.options.window=[]"], "model.options.window", "positive integer or null, got []"),
    # induction
    (["task=induction", "task.max_distance=64"], "max_distance", "must be < seq_len=64"),
    (["task=induction", "task.num_triggers=40"], "num_triggers", "do not fit in the trigger range"),
    (["task=induction", "task.min_distance=1"], "min_distance", "must be >= 2"),
    # interference
    (["task=interference", "task.key_overlap=0.5"], "key_overlap", "needs key_len >= 2"),
    (["task=interference", "task.key_len=2", "task.key_overlap=1"], "key_overlap", "must be in [0, 1)"),
    (["task=interference", "task.num_pairs=300"], "num_pairs", "distinct key tokens"),
    (["task=interference", "task.seq_len=10"], "seq_len", "need 48 positions, seq_len=10"),
    (["task=interference", "task.key_regime=schlag", "task.test_num_pairs=[16,32]"], "num_pairs",
     "test num_pairs=32 distinct keys cannot be drawn from key_regime=schlag's 16 keys"),
]


@pytest.fixture
def precheck(monkeypatch, tmp_path, capsys):
    """Run `harness.run.cli.main` on overrides; return (exit code, non-empty stderr lines, out dir).

    A config the pre-check wrongly lets through must not train: the job is replaced by one
    that fails at once, which Hydra reports with exit code 1, not 2.
    """
    def refuse(cfg, *handed):
        raise AssertionError("the pre-check let a bad config through")

    monkeypatch.setattr("harness.run.job.run_job", refuse)
    monkeypatch.setattr(sys, "argv", ["harness"])  # main rewrites it for hydra.main

    def run(overrides: list[str]):
        out = tmp_path / "run"
        argv = [*overrides, "logger=none", f"out_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}"]
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        return stop.value.code, lines, out

    return run


@pytest.mark.parametrize("overrides, key, fragment",
                         [pytest.param(*case, id=" ".join(case[0])) for case in CASES])
def test_bad_value_is_one_line_before_any_work(precheck, overrides, key, fragment):
    code, lines, out = precheck(overrides)
    assert code == 2, lines
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("harness: error: ")
    assert key in line and fragment in line, line
    assert not (out / "results.json").exists()  # nothing ran


def test_unknown_choice_names_every_valid_option(precheck):
    _, lines, _ = precheck(["model=nope"])
    from harness.layers.registry import builtin_names

    for name in builtin_names():
        assert name in lines[0]


@pytest.mark.parametrize("overrides", [
    ["trainer.device=" + ("cuda:0" if torch.cuda.is_available() else "cpu"), "trainer.ckpt_every=null",
     "trainer.grad_clip=0"],
    ["model=retnet", "model.decay=0.9"],
    ["model=swa", "model.window=1"],
    ["mode=cost", "model=softmax", "cost.forms=[chunk,parallel]"],
])
def test_edge_values_pass_the_precheck(overrides):
    """Values at the edge of what is allowed compose and validate without error."""
    compose_config([*overrides, "logger=none"])


def test_window_leaves_the_hashes_of_existing_runs_unchanged():
    """model.window (added after results were first written) stays out of the hash while null;
    swa's window, an option now, is recorded and hashed under its old key."""
    from harness.config.digest import flat_config, hashed_items

    cfg = compose_config(["logger=none"])
    assert flat_config(cfg)["model.window"] is None and "model.window" not in hashed_items(flat_config(cfg))
    swa = compose_config(["model=swa", "logger=none"])
    assert hashed_items(flat_config(swa))["model.window"] == 32
    assert not any(key.startswith("model.options") for key in flat_config(swa))


def test_key_regime_leaves_the_hashes_of_existing_interference_runs_unchanged():
    """task.key_regime and task.num_keys (added after the capacity results were first written)
    stay out of the hash at their defaults, and enter it once set."""
    from omegaconf import OmegaConf

    from harness.config.digest import config_hash, flat_config, hashed_items

    cfg = compose_config(["task=interference", "logger=none"])
    tree = OmegaConf.to_container(cfg, resolve=True)
    del tree["task"]["key_regime"], tree["task"]["num_keys"]  # the config before the fields existed
    assert config_hash(tree) == config_hash(cfg)
    schlag = compose_config(["task=interference", "task.key_regime=schlag", "logger=none"])
    assert hashed_items(flat_config(schlag))["task.key_regime"] == "schlag"
    assert config_hash(schlag) != config_hash(cfg)


def test_a_run_validates_its_config_and_model_once(tmp_path, monkeypatch):
    """The CLI prepares the run's plan before Hydra starts (harness.config.plan.prepare) and hands it
    to the job: the config is validated once per run, the model's checks run once, and the
    training run reads the plan (no validation inside the job or the model's constructor)."""
    import json

    from harness import model as model_module
    from harness.config import validate

    calls = {"config": 0, "model": 0}

    def counted(fn, key):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(validate, "validate_config", counted(validate.validate_config, "config"))
    monkeypatch.setattr(validate, "validate_model", counted(validate.validate_model, "model"))
    monkeypatch.setattr(model_module, "validate", counted(model_module.validate, "model"))
    monkeypatch.setattr(sys, "argv", ["harness"])
    out = tmp_path / "run"
    cli.main(["trainer=debug", "trainer.max_steps=2", "trainer.measure=false", "model.d_model=16",
              "logger=none", f"out_dir={out}"])
    assert json.loads((out / "results.json").read_text())["status"] == "ok"
    assert calls == {"config": 1, "model": 1}
