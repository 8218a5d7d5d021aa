"""Numerical faults stop a run with the step, layer and mixer named; output faults are clean."""
import json
import os

import pytest
import torch

from harness.outputs.checkpoint import checkpoint_files, latest_checkpoint
from harness.config.compose import compose_config
from harness.layers.kernel import KernelAttention
from harness.outputs.results import write_json
from harness.run.job import run_job
from harness.train.faults import NumericalFault

RUN = ["task=recall", "model=elu", "model.d_model=32", "logger=none", "trainer.max_steps=60",
       "trainer.batch_size=8", "trainer.eval_every=30", "trainer.eval_examples=16",
       "trainer.ckpt_every=20", "trainer.log_every=25", "trainer.warmup_steps=5",
       "trainer.target_accuracy=null", "trainer.progress=false", "trainer.measure=false"]


def fail(tmp_path, capsys, *overrides, code=1) -> tuple[str, dict]:
    """Run, expect a one-line error and exit code; return the line and results.json."""
    with pytest.raises(SystemExit) as stop:
        run_job(compose_config([*RUN, f"out_dir={tmp_path}", *overrides]))
    assert stop.value.code == code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("harness: error: "), err
    return err[0], json.loads((tmp_path / "results.json").read_text())


def test_nan_in_a_mixer_output_names_step_layer_and_mixer(tmp_path, capsys, monkeypatch):
    forward, calls = KernelAttention.forward, {"n": 0}

    def poisoned(self, x):  # layer 1's output turns NaN at training step 47
        out = forward(self, x)
        if self.training and self.layer_idx == 1:
            calls["n"] += 1
            if calls["n"] == 47:
                return out * float("nan")
        return out

    monkeypatch.setattr(KernelAttention, "forward", poisoned)
    line, res = fail(tmp_path, capsys)
    assert "numerical fault at step 47 in layer 1 (mixer elu): non-finite mixer output" in line
    assert res["status"] == "failed" and "step 47" in res["error"]
    assert res["fault"] == {"step": 47, "layer": 1, "mixer": "elu", "check": "output"}
    # The last good checkpoint (step 40, before the fault) is kept and loads safely.
    assert res["checkpoint"] == {"path": str(latest_checkpoint(tmp_path)), "step": 40}
    assert [step for step, _, _ in checkpoint_files(tmp_path)] == [40, 20]  # the last two are kept
    saved = torch.load(latest_checkpoint(tmp_path), weights_only=True)
    assert saved["step"] == 40
    assert all(torch.isfinite(t).all() for t in saved["model"].values() if t.is_floating_point())
    assert not (tmp_path / "model.pt").exists()


def test_non_positive_kernel_denominator_is_caught_not_floored(tmp_path, capsys, monkeypatch):
    """elu+1 is positive, so phi(q).z <= 0 means something broke; the floor would hide it."""
    forward = KernelAttention.forward

    def negative_queries(self, x):
        phi = self.phi
        self.phi = lambda t, is_query: -phi(t, is_query=True) if is_query else phi(t, is_query=False)
        try:
            return forward(self, x)
        finally:
            self.phi = phi

    monkeypatch.setattr(KernelAttention, "forward", negative_queries)
    line, res = fail(tmp_path, capsys)
    assert "numerical fault at step 1 in layer 0 (mixer elu): kernel denominator" in line
    assert res["fault"]["check"] == "denominator" and res["checkpoint"] is None


def test_a_sweep_goes_on_after_a_numerical_fault(tmp_path, monkeypatch):
    """In a sweep the failed run is recorded and the call returns, so the next run starts."""
    from harness.outputs.rundir import Where
    from harness.run import job as run_module

    monkeypatch.setattr(run_module, "_hydra_context", lambda fresh: Where(None, True, tmp_path, fresh))
    monkeypatch.setattr(torch.nn.functional, "cross_entropy",
                        lambda *a, **k: torch.tensor(float("inf"), requires_grad=True))
    out = run_job(compose_config([*RUN, f"out_dir={tmp_path / 'a'}"]))
    assert out["status"] == "failed" and "step 1 in the embedding/output head" in out["error"]
    assert "non-finite loss" in out["error"]


def test_unwritable_output_directory_is_one_line_and_writes_nothing(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SystemExit) as stop:
        run_job(compose_config([*RUN, f"out_dir={blocker / 'run'}"]))
    assert stop.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot create the output directory {blocker / 'run'}" in err[0]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_never_leaves_a_half_written_results_file(tmp_path):
    """/dev/full answers every write with ENOSPC, as a full disk does."""
    from harness.errors import OutputError

    target = tmp_path / "results.json"
    write_json(target, {"status": "ok", "summary": {"accuracy": 0.5}})
    (tmp_path / "results.json.tmp").symlink_to("/dev/full")
    with pytest.raises(OutputError, match="No space left on device"):
        write_json(target, {"status": "ok", "summary": {"accuracy": 0.9}})
    assert json.loads(target.read_text())["summary"]["accuracy"] == 0.5  # the old file, whole
    assert not (tmp_path / "results.json.tmp").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_at_the_end_of_a_run_is_reported(tmp_path, capsys):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "results.json.tmp").symlink_to("/dev/full")
    line, res = fail(tmp_path, capsys)
    assert "cannot write" in line and "No space left on device" in line
    assert res["status"] == "failed" and "No space left on device" in res["error"]


def test_same_seed_same_metrics_other_seed_differs(tmp_path):
    def metrics(seed, where):
        run_job(compose_config([*RUN, "trainer.max_steps=30", f"seed={seed}", f"out_dir={tmp_path / where}"]))
        rows = (tmp_path / where / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(r).items() if k != "time_s"} for r in rows]

    assert metrics(1, "a") == metrics(1, "b")
    assert metrics(1, "a") != metrics(2, "c")


def _watched_step(model_name="elu", poison=None, scale=1.0, max_norm=1.0):
    """One watched forward/backward on a small model; poison(model) edits the gradients."""
    from harness.config.plan import prepare
    from harness.train.faults import FaultWatch

    cfg = compose_config([*RUN, f"model={model_name}"])
    torch.manual_seed(0)
    model = prepare(cfg).build_model()
    watch = FaultWatch(model, model_name)
    inputs = torch.randint(0, cfg.task.vocab_size, (2, 16))
    with watch.forward_pass():
        loss = model(inputs).float().logsumexp(-1).mean() * scale
    loss.backward()
    if poison is not None:
        poison(model)
    reference = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    watch.clip_and_record(3, loss, max_norm)
    return watch, model, reference


def test_a_non_finite_gradient_is_named_by_its_layer():
    def poison(model):
        next(model.layers[0].parameters()).grad[0] = float("inf")

    watch, _, _ = _watched_step(poison=poison)
    with pytest.raises(NumericalFault) as fault:
        watch.check()
    assert fault.value.record["fault"] == {"step": 3, "layer": 0, "mixer": "elu", "check": "gradient"}


def test_a_non_finite_loss_comes_before_the_gradients_it_makes():
    watch, _, _ = _watched_step(scale=float("nan"))
    with pytest.raises(NumericalFault) as fault:
        watch.check()
    assert fault.value.record["fault"]["check"] == "loss" and fault.value.record["fault"]["step"] == 3


def test_per_layer_clipping_is_clip_grad_norm_and_large_finite_gradients_are_no_fault():
    """The norm formed from the per-layer sums clips exactly as torch's global clip does, at
    ordinary and at very large (finite) gradients."""
    for scale in (1.0, 1e12):
        watch, model, reference = _watched_step(scale=scale, max_norm=0.1)
        watch.check()  # no fault
        # clip_grad_norm_ scales the .grad of the tensors it is given: leaves holding the reference
        expected = [torch.zeros_like(g, requires_grad=True) for g in reference]
        for leaf, g in zip(expected, reference):
            leaf.grad = g.clone()
        before = torch.nn.utils.clip_grad_norm_(expected, 0.1)
        assert before > 0.1  # the step needed clipping
        got = [p.grad for p in model.parameters() if p.grad is not None]
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e.grad, rtol=1e-5, atol=1e-12)
        clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in got]))
        assert clipped.item() == pytest.approx(0.1, rel=1e-4)
