"""Mixers written to other conventions than the harness's, in a temporary directory as a user's
code would be, through the real CLI: each trains, or is refused in one line before any work."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_extending import cli as extending_cli

MIXERS = '''
import torch
from torch import nn


class _Mean(nn.Module):
    """A causal running mean of a projection: (B, T, C) -> (B, T, C)."""

    def __init__(self, d_model):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def mix(self, x):
        steps = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[None, :, None]
        return self.proj(x).cumsum(1) / steps


class BatchFirst(_Mean):
    """fla's convention: state_size(batch_size, sequence_length), a batch of 1 meant."""

    def forward(self, x):
        return self.mix(x)

    def state_size(self, batch_size=1, sequence_length=2048):
        return batch_size * sequence_length * 4


class NoArgument(_Mean):
    def forward(self, x):
        return self.mix(x)

    def state_size(self):
        return 7


class WrongType(_Mean):
    def forward(self, x):
        return self.mix(x)

    def state_size(self, sequence_length=2048):
        return "big"


class Kwargs(nn.Module):
    def __init__(self, hidden_size, feature_dim=4, **kwargs):
        super().__init__()
        self.feature_dim = feature_dim
        self.proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states, **kwargs):
        return self.proj(hidden_states).cumsum(1) / hidden_states.shape[1]


class ShortOnly(_Mean):
    """A table sized at construction: fails beyond 64 tokens."""

    def __init__(self, d_model, l_max=64):
        super().__init__(d_model)
        self.l_max = l_max
        self.pos = nn.Parameter(torch.zeros(l_max, d_model))

    def forward(self, x):
        return self.mix(x) + self.pos[: x.shape[1]].expand_as(x)  # a shape error past l_max


class Triple(_Mean):
    def forward(self, x):
        return self.mix(x), None, None


class Heads(_Mean):
    """Defaults that do not fit the harness's width: the reshape names no option."""

    def __init__(self, d_model, num_key_value_heads=12, head_dim=7):
        super().__init__(d_model)
        self.kv, self.hd = num_key_value_heads, head_dim

    def forward(self, x):
        B, T, C = x.shape
        return self.mix(x).reshape(B, T, self.kv, self.hd).reshape(B, T, C)
'''

PYDANTIC = '''
import pydantic
from torch import nn


class Settings(pydantic.BaseModel):
    d_model: int
    l_max: int = pydantic.Field(gt=0)


class Validated(nn.Module):
    def __init__(self, d_model, l_max=-1):
        super().__init__()
        Settings(d_model=d_model, l_max=l_max)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        return self.proj(x)
'''

FAST = ["task.seq_len=32", "task.num_pairs=2", "model.d_model=16", "model.n_layers=1", "trainer=debug",
        "trainer.max_steps=3", "logger=none"]


def cli(args, cwd, timeout=300):
    """The real CLI, with the user's folder importable (test_extending's runner)."""
    return extending_cli(args, cwd, pythonpath=cwd, timeout=timeout)


@pytest.fixture()
def user_dir(tmp_path):
    (tmp_path / "othermixers.py").write_text(MIXERS)
    (tmp_path / "validated.py").write_text(PYDANTIC)
    return tmp_path


def trained(user_dir, *args):
    # a directory per run: a finished run of another config is not overwritten (the CLI refuses)
    out = user_dir / f"run{len(list(user_dir.glob('run*')))}"
    proc = cli([*FAST, *args, f"out_dir={out}"], cwd=user_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "ok" and (out / "model.pt").exists()
    return proc, res


def refused(user_dir, *args):
    proc = cli([*FAST, *args], cwd=user_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness: error: "), proc.stderr
    assert not (user_dir / "outputs").exists()  # refused before any work
    return lines[0]


def test_state_size_with_a_batch_argument_is_called_for_one_sequence(user_dir):
    _, res = trained(user_dir, "model.name=othermixers.BatchFirst")
    assert res["summary"]["state_elements_per_layer"] == 1 * 32 * 4  # batch_size=1, sequence_length=T
    assert "state_size" not in res["measure"]


@pytest.mark.parametrize("name,reason", [
    ("NoArgument", "skipped: TypeError: NoArgument.state_size() takes no argument 'sequence_length'"),
    ("WrongType", "skipped: TypeError: returned 'big' (str), expected an int"),
])
def test_a_state_size_that_fails_is_skipped_with_its_reason_and_one_warning(user_dir, name, reason):
    proc, res = trained(user_dir, f"model.name=othermixers.{name}")
    assert res["measure"]["state_size"].startswith(reason), res["measure"]
    assert "state_bytes" not in res["summary"]
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line and "state_size" in line]
    assert len(warnings) == 1 and reason in warnings[0], proc.stderr
    # the warning comes from the pre-flight, before the first step is logged
    assert proc.stderr.index(warnings[0]) < max(proc.stderr.find("step"), 0) or "step" not in proc.stderr


def test_an_fla_tuple_output_trains(user_dir):
    trained(user_dir, "model.name=othermixers.Triple")


def test_a_typo_in_an_option_taken_by_kwargs_is_warned_with_the_closest_name(user_dir):
    proc, res = trained(user_dir, "model.name=othermixers.Kwargs", "model.options.feature_dm=8")
    warnings = [line for line in proc.stderr.splitlines() if "model.options.feature_dm" in line]
    assert len(warnings) == 1 and "did you mean 'feature_dim'?" in warnings[0], proc.stderr
    proc, _ = trained(user_dir, "model.name=othermixers.Kwargs", "model.options.feature_dim=8")
    assert "model.options" not in proc.stderr


def test_a_length_limit_is_refused_at_the_test_length_before_training(user_dir):
    name = "model.name=othermixers.ShortOnly"
    trained(user_dir, name, "task.seq_len=64")
    line = refused(user_dir, name, "task.seq_len=64", "task.test_seq_len=[64,128]")
    assert "model.name=othermixers.ShortOnly: forward fails at T = 128 (a test length)" in line
    assert line.endswith("likely model.options to set: l_max=64")
    line = refused(user_dir, name, "task.seq_len=96")
    assert "forward fails at T = 96 (the training length)" in line
    trained(user_dir, name, "task.seq_len=64", "task.test_seq_len=[64,128]", "model.options.l_max=128")


def test_a_shape_error_lists_the_options_likely_to_set(user_dir):
    line = refused(user_dir, "model.name=othermixers.Heads")
    assert "forward fails at T = 32 (the training length) (RuntimeError: shape" in line
    assert "likely model.options to set: num_key_value_heads=12, head_dim=7" in line
    trained(user_dir, "model.name=othermixers.Heads", "model.options.num_key_value_heads=2",
            "model.options.head_dim=8")


def test_a_pydantic_validation_error_keeps_its_field_list(user_dir):
    pytest.importorskip("pydantic")
    line = refused(user_dir, "model.name=validated.Validated")
    assert "construction failed (ValidationError: 1 validation error for Settings; l_max;" in line
    assert "greater than 0" in line and "likely model.options to set: l_max=-1" in line
    trained(user_dir, "model.name=validated.Validated", "model.options.l_max=8")
