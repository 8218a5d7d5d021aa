"""A run turns off deterministic mode's NaN fill of fresh tensors (harness.devices.set_run_determinism)
because no operator it runs reads memory it did not write: with the fill on, such a read would
carry a NaN into the loss or a gradient; with it off, whatever the memory held. Every built-in
mixer, solo and in a group, trains to the same losses and weights either way."""
from __future__ import annotations

import contextlib
import io

import pytest
import torch
import torch.utils.deterministic

import harness.train.group.loop as group_loop
import harness.train.loop as solo_loop
from harness.config.compose import compose_config
from harness.config.plan import prepare
from harness.devices import kept_determinism, set_run_determinism
from harness.layers import registry
from harness.train.group import train_group
from harness.train.memory import fitted

SMALL = ["model.d_model=8", "model.n_layers=1", "trainer=debug", "logger=none", "task.seq_len=32",
         "trainer.warmup_steps=3", "trainer.ckpt_every=null", "trainer.measure=false", "trainer.target_accuracy=null",
         "trainer.max_steps=3", "trainer.eval_every=3", "trainer.log_every=1", "trainer.progress=false"]
HYBRID = ("gated_deltanet", "model.layers=[gated_deltanet,softmax]", "model.n_layers=2")
CASES = [*[(name, ()) for name in registry.builtin_names()], ("swa", ("model.options.window=8",)),
         (HYBRID[0], HYBRID[1:])]
IDS = [*registry.builtin_names(), "swa_banded", "hybrid"]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with kept_determinism():
        yield
    torch.set_num_threads(threads)


def plan(model, seed, extra, out_dir):
    return fitted(prepare(compose_config([f"model={model}", *SMALL, f"seed={seed}", f"task.num_pairs={2 + seed}",
                                          *extra, f"out_dir={out_dir}"])))


def with_fill(device: torch.device) -> None:
    """set_run_determinism, but keeping the fill (torch's default under deterministic mode)."""
    set_run_determinism(device)
    torch.utils.deterministic.fill_uninitialized_memory = True


def fill_on_then_off(monkeypatch, loop_module):
    """True, then False: while True, ``loop_module`` (the solo or the group loop) keeps the fill;
    while False, it sets a run's determinism as it does."""
    for fill in (True, False):
        if fill:
            monkeypatch.setattr(loop_module, "set_run_determinism", with_fill)
        else:
            monkeypatch.undo()
        yield fill


def test_a_run_sets_deterministic_algorithms_without_the_fill():
    torch.use_deterministic_algorithms(False)
    torch.utils.deterministic.fill_uninitialized_memory = True  # torch's default
    with kept_determinism():
        set_run_determinism(torch.device("cpu"))
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is False
    assert not torch.are_deterministic_algorithms_enabled()  # restored on leaving
    assert torch.utils.deterministic.fill_uninitialized_memory is True


def test_the_fill_would_show_a_read_of_memory_no_operator_wrote():
    """What the equality tests below rest on: under the fill a fresh tensor is NaN, so any of its
    elements that reaches a loss makes the two runs differ."""
    set_run_determinism(torch.device("cpu"))
    torch.utils.deterministic.fill_uninitialized_memory = True
    assert torch.isnan(torch.empty(4)).all() and torch.isnan(torch.empty(4) * 0).all()


@pytest.mark.parametrize("model, extra", CASES, ids=IDS)
def test_solo_training_is_the_same_to_the_bit_with_the_fill_on(model, extra, tmp_path, monkeypatch):
    runs = {}
    for fill in fill_on_then_off(monkeypatch, solo_loop):
        p = plan(model, 0, extra, tmp_path / str(fill))
        r = solo_loop.start(p, tmp_path / str(fill))
        losses = []
        r.clock.then = lambda step: losses.append(r.loop.last_loss)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                solo_loop.steps(r)
        finally:
            r.metrics.close()
            r.terminate.restore()
        assert torch.utils.deterministic.fill_uninitialized_memory is fill
        runs[fill] = losses, r.model.state_dict()
    (losses_on, weights_on), (losses_off, weights_off) = runs[True], runs[False]
    assert len(losses_on) == 3 and losses_on == losses_off
    assert all(torch.equal(v, weights_off[k]) for k, v in weights_on.items())


@pytest.mark.parametrize("model, extra", CASES, ids=IDS)
def test_grouped_training_is_the_same_to_the_bit_with_the_fill_on(model, extra, tmp_path, monkeypatch):
    groups = {}
    for fill in fill_on_then_off(monkeypatch, group_loop):
        group = train_group([plan(model, s, extra, tmp_path / f"{fill}-{s}") for s in range(2)])
        assert torch.utils.deterministic.fill_uninitialized_memory is fill
        groups[fill] = group
    for on, off in zip(groups[True], groups[False]):
        assert [r["train/loss"] for r in on.train_rows] == [r["train/loss"] for r in off.train_rows]
        assert all(torch.equal(v, off.state_dict()[k]) for k, v in on.state_dict().items())
