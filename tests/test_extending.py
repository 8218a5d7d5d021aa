"""Outside mixers and tasks through the real CLI: the worked example of docs/extending.md, a
mixer and a task written in a temporary directory, an fla-style layer, and the one-line errors."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.config.compose import compose_config
from harness.layers import builtin_names, register, registry

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "extending.md"

# A mixer with nothing but a forward pass (a causal running mean of a projection), and an
# fla-style layer: hidden_size / num_heads, a tuple output, and a declared state size.
MIXERS = '''
import torch
from torch import nn


class RunningMean(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):  # (B, T, C)
        steps = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[:, None]
        return self.proj(x).cumsum(1) / steps


class FlaStyle(nn.Module):
    def __init__(self, hidden_size, num_heads=1, layer_idx=None, expand=2, **kwargs):
        super().__init__()
        self.num_heads, self.expand = num_heads, expand
        self.up, self.down = nn.Linear(hidden_size, expand * hidden_size), nn.Linear(expand * hidden_size, hidden_size)

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, **kwargs):
        h = self.up(hidden_states).cumsum(1)
        return self.down(torch.tanh(h)), None, past_key_values

    def state_size(self, sequence_length=2048):
        return self.down.in_features  # the running sum h, expand * hidden_size


class Broken(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        raise RuntimeError("no weights for this width")


class Narrow(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model // 2)

    def forward(self, x):
        return self.proj(x)
'''

TASK = '''
"""A user task: recall with a fixed vocabulary of 64, its own Config."""
from dataclasses import dataclass

from harness.tasks import recall


@dataclass
class Config:
    seq_len: int = 32
    num_pairs: int = 3
    vocab_size: int = 64


def _recall(cfg):
    return recall.Config(seq_len=cfg.seq_len, vocab_size=cfg.vocab_size, num_pairs=cfg.num_pairs)


def validate(cfg):
    recall.validate(_recall(cfg))


def eval_settings(cfg):
    return [cfg]


def max_seq_len(cfg):
    return cfg.seq_len


def make_batch(cfg, batch_size, *, seed, device="cpu", split="train"):
    return recall.make_batch(_recall(cfg), batch_size, seed=seed, device=device, split=split)
'''


def cli(args, cwd, pythonpath=None, timeout=300):
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture()
def user_dir(tmp_path):
    (tmp_path / "mymixers.py").write_text(MIXERS)
    (tmp_path / "mytask.py").write_text(TASK)
    return tmp_path


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def doc_command() -> list[str]:
    """The worked example's command in docs/extending.md (the block after 'Run it')."""
    text = DOC.read_text()
    block = re.search(r"<!-- example-command -->\s*```bash\n(.*?)\n```", text, re.S).group(1)
    command = " ".join(line.rstrip("\\").strip() for line in block.splitlines())
    words = command.split()
    assert words[:3] == ["python", "-m", "harness"], command
    return words[3:]


def test_the_documented_example_runs_through_the_cli(tmp_path):
    out = tmp_path / "run"
    # one thread: under pytest -n 2 another worker holds the second core (two threads here would
    # oversubscribe both and double this test's time)
    proc = cli([*doc_command(), "logger=none", "trainer.threads=1", f"out_dir={out}"], cwd=ROOT,
               timeout=3600)  # a hang guard
    assert proc.returncode == 0, proc.stderr
    res = results(out)
    assert res["status"] == "ok" and res["model"] == "examples.dpfp.DPFPAttention"
    s = res["summary"]
    assert s["accuracy"] >= 0.9, s  # DPFP learns the default recall task in the documented budget
    assert s["d_key"] == 2 * 64 * 2 and s["state_elements_per_head"] == 256 * 64 + 256
    assert res["measure"] == {"sharpness": "ok", "snr": "ok", "snr_predicted": "ok", "trained_theory": "ok"}
    assert {r["slice"] for r in res["slices"]} == {"num_pairs"} and res["heads"]
    # the lines the document shows are the lines a run prints
    assert re.search(r"\[harness\] recall/examples\.dpfp\.DPFPAttention: accuracy \d\.\d{3}", proc.stdout)
    assert re.search(r"\[harness\] memory at T = \d+: recurrent state [\d,]+ elements \(layer 0: 16,640/head", proc.stdout)


def test_a_mixer_with_only_a_forward_pass_trains_is_measured_by_its_jacobian_and_says_what_it_skipped(user_dir):
    out = user_dir / "run"
    proc = cli(["model.name=mymixers.RunningMean", "trainer=debug", "logger=none", f"out_dir={out}"],
               cwd=user_dir, pythonpath=user_dir)
    assert proc.returncode == 0, proc.stderr
    res = results(out)
    assert res["status"] == "ok" and [r["slice"] for r in res["slices"]] == ["num_pairs"]
    assert res["measure"] == {"sharpness": "jacobian estimate", "snr": "skipped: no effective_weights",
                              "snr_predicted": "skipped: no d_key", "trained_theory": "skipped: no effective_weights"}
    assert "state_bytes" not in res["summary"] and res["summary"]["weights"] == "jacobian estimate"
    assert res["heads"] and all("snr_measured" not in r for r in res["heads"])  # sharpness only
    assert "[harness] state" not in proc.stdout
    assert "[harness] retrieval layer (jacobian estimate): weight on the correct key" in proc.stdout


def test_an_fla_style_layer_plugs_in_without_a_wrapper(user_dir):
    out = user_dir / "run"
    proc = cli(["model.name=mymixers.FlaStyle", "model.options.expand=3", "model.n_heads=2", "trainer=debug",
                "logger=none", f"out_dir={out}"], cwd=user_dir, pythonpath=user_dir)
    assert proc.returncode == 0, proc.stderr
    s = results(out)["summary"]
    assert s["state_elements_per_layer"] == 3 * 64 and s["state_bytes"] == 2 * 3 * 64 * 4  # 2 layers, float32


def test_a_user_task_module_trains_and_reports(user_dir):
    for spelling in ("task=mytask", "task.name=mytask"):
        out = user_dir / spelling.replace("=", "-")
        proc = cli([spelling, "task.num_pairs=4", "trainer=debug", "logger=none", f"out_dir={out}"],
                   cwd=user_dir, pythonpath=user_dir)
        assert proc.returncode == 0, proc.stderr
        res = results(out)
        assert res["task"] == "mytask" and res["config"]["task.num_pairs"] == 4
        assert res["slices"][0]["value"] == 4 and res["summary"]["accuracy"] is not None


@pytest.mark.parametrize("args,message", [
    (["model.name=nosuch.Mixer"], "model.name=nosuch.Mixer: cannot import module 'nosuch'"),
    (["model.name=mymixers.Missing"], "model.name=mymixers.Missing: module 'mymixers' has no attribute 'Missing'"),
    (["model.name=mymixers.Broken"], "model.name=mymixers.Broken: construction failed (RuntimeError: no weights"),
    (["model.name=mymixers.Narrow"], "model.name=mymixers.Narrow: forward returned (1, 64, 32), expected (B, T, C) = (1, 64, 64)"),
    (["model.name=mymixers.RunningMean", "model.options.window=8"],
     "model.options.window: model.name=mymixers.RunningMean takes no argument 'window'"),
    (["model=elu", "model.options.window=8"], "model.options.window must be null for model.name=elu (it is an option of swa)"),
    (["task=mytsk"], "unknown task 'mytsk'"),
    (["mode=probe", "model.name=mymixers.RunningMean"], "declares no probe_memory"),
    (["mode=cost", "model.name=mymixers.RunningMean"], "mode=cost: model.name=mymixers.RunningMean declares no core"),
])
def test_a_bad_outside_mixer_or_task_stops_in_one_line(user_dir, args, message):
    proc = cli([*args, "trainer=debug", "logger=none"], cwd=user_dir, pythonpath=user_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (user_dir / "outputs").exists()  # refused: nothing written


def test_a_mixer_registered_at_run_time_is_a_valid_name():
    name = "test_registered_mixer"
    assert name not in builtin_names()

    @register(name)
    class Registered:  # noqa: F841 - registration is the point
        pass

    try:
        assert name in builtin_names()
        with pytest.raises(ValueError, match=f"unknown model.name 'nope'; valid: .*{name}"):
            compose_config(["model.name=nope", "logger=none"])
    finally:
        registry.unregister(name)
    assert name not in builtin_names()


def test_user_config_groups_through_the_search_path(tmp_path):
    """A user's own YAML (their mixer's group file) found through hydra.searchpath, by the
    pre-check and by the run."""
    conf = tmp_path / "my_conf" / "model"
    conf.mkdir(parents=True)
    (conf / "my_dpfp.yaml").write_text(textwrap.dedent("""\
        defaults:
          - model_schema

        name: examples.dpfp.DPFPAttention
        options:
          nu: 1
        """))
    out = tmp_path / "run"
    proc = cli([f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "model=my_dpfp", "trainer=debug", "logger=none",
                f"out_dir={out}"], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    res = results(out)
    assert res["model"] == "examples.dpfp.DPFPAttention" and res["summary"]["d_key"] == 2 * 64
