"""Every task x model pair trains end to end through the composed Hydra config."""
import json

import pytest
import torch

from harness.config.compose import compose_config
from harness.layers.registry import builtin_names
from harness.run.job import run_job

TASKS = ["recall", "induction", "interference"]
MODELS = builtin_names()  # every registered built-in: a new mixer is trained here without an edit


def run(tmp_path, *overrides):
    cfg = compose_config(["trainer=debug", "logger=none", f"out_dir={tmp_path}", *overrides])
    run_job(cfg)
    return json.loads((tmp_path / "results.json").read_text())


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("model", MODELS)
def test_task_model_pair_runs(tmp_path, task, model):
    res = run(tmp_path, f"task={task}", f"model={model}")
    assert res["status"] == "ok" and res["task"] == task and res["model"] == model
    s = res["summary"]
    assert s["steps"] == 6 and s["state_elements_per_head"] > 0 and s["params"] > 0
    # accuracy is a count of hits: each slice's is k / count, and the summary their weighted mean
    slices = res["slices"]
    assert slices and all(abs(r["accuracy"] * r["count"] - round(r["accuracy"] * r["count"])) < 1e-4  # float32 means
                          and 0 <= round(r["accuracy"] * r["count"]) <= r["count"] for r in slices)
    hits = sum(r["accuracy"] * r["count"] for r in slices)
    assert s["accuracy"] == pytest.approx(hits / sum(r["count"] for r in slices), abs=1e-6)
    assert s["measure_examples"] == 8  # trainer=debug measures 8 examples, the setting's count
    assert res["heads"], "measurements are on by default"
    assert res["config"]["model.name"] == model  # flat config
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "model.pt").exists()


def test_recall_accuracy_is_sliced_per_num_pairs(tmp_path):
    res = run(tmp_path, "task=recall", "model=softmax", "task.test_num_pairs=[2,4,8]",
              "task.test_seq_len=[64]")
    values = sorted({r["value"] for r in res["slices"] if r["slice"] == "num_pairs"})
    assert values == [2, 4, 8]


def test_training_is_deterministic_on_cpu(tmp_path):
    a = run(tmp_path / "a", "model=elu", "seed=3")
    b = run(tmp_path / "b", "model=elu", "seed=3")
    c = run(tmp_path / "c", "model=elu", "seed=4")
    assert a["summary"]["loss"] == b["summary"]["loss"]
    assert a["summary"]["loss"] != c["summary"]["loss"]


def test_init_jitter_perturbs_every_weight_by_its_size_and_nothing_else(tmp_path):
    """trainer.init_jitter moves each initial weight by about that fraction of itself, the same way
    every time; a run and its jittered twin differ, at 0 nothing is drawn."""
    from harness.model import LanguageModel, ModelConfig
    from harness.train.optim import jitter_weights

    def model():
        torch.manual_seed(0)
        return LanguageModel(ModelConfig(name="elu", d_model=16), vocab_size=32, max_seq_len=16)

    plain, a, b = model(), model(), model()
    jitter_weights(a, 1e-6, seed=3)
    jitter_weights(b, 1e-6, seed=3)
    pairs = list(zip(plain.parameters(), a.parameters(), b.parameters()))
    assert all(torch.equal(x, y) for _, x, y in pairs)
    moved = torch.cat([((x - p) / p).detach().flatten()[p.flatten() != 0] for p, x, _ in pairs])
    assert 3e-7 < float(moved.abs().mean()) < 3e-6 and float(moved.abs().max()) < 1e-5
    # the runs at 1e-4: six debug steps from a 1e-6 jitter end about one float32 ulp apart in
    # loss, which another summation order (threads, kernels) can round away
    twin = run(tmp_path / "twin", "model=elu", "seed=3", "trainer.init_jitter=1e-4")
    same = run(tmp_path / "same", "model=elu", "seed=3")
    assert twin["summary"]["loss"] != same["summary"]["loss"]
    assert twin["summary"]["loss"] == pytest.approx(same["summary"]["loss"], abs=1e-3)


def test_softmax_learns_default_recall_well_above_chance(tmp_path):
    res = run(tmp_path, "task=recall", "model=softmax", "task.num_queries=56", "trainer.max_steps=500",
              "trainer.batch_size=32", "trainer.eval_every=100", "trainer.eval_examples=128",
              "trainer.warmup_steps=20")
    vocab_values = res["config"]["task.vocab_size"] // 2
    assert res["summary"]["accuracy"] > 20 / vocab_values, res["summary"]


def test_checkpoint_reloads_into_the_same_model(tmp_path):
    """model.pt reopened by harness.load_run evaluates to the accuracy and loss the run reported."""
    import harness
    from harness.train.evaluate import evaluate, make_eval_sets

    res = run(tmp_path, "model=retnet", "trainer.max_steps=30", "trainer.eval_every=30")
    loaded = harness.load_run(tmp_path)
    tr = loaded.config.trainer
    sets = make_eval_sets(loaded.task_module, loaded.task_config, tr, loaded.config.seed, torch.device("cpu"))
    again = evaluate(loaded.model, sets, lambda: torch.autocast("cpu", enabled=False))
    assert again["accuracy"] == res["summary"]["accuracy"] and again["loss"] == pytest.approx(res["summary"]["loss"], rel=1e-6)
    assert loaded.results["config_hash"] == res["config_hash"]


@pytest.mark.parametrize("examples,measured", [(40, 40), (100, 64)])
def test_measure_examples_is_the_count_measured(tmp_path, examples, measured):
    """trainer.measure_examples sets how many examples the end-of-run measurements use (at most
    the evaluation set's trainer.eval_examples)."""
    res = run(tmp_path, "model=elu", "trainer.eval_examples=64", f"trainer.measure_examples={examples}")
    assert res["summary"]["measure_examples"] == measured

def test_on_step_is_called_once_per_step_in_order(tmp_path):
    from harness.run.job import plan_for
    from harness.train.loop import train

    cfg = compose_config(["trainer=debug", "logger=none", "trainer.measure=false", f"out_dir={tmp_path}"])
    steps = []
    train(plan_for(cfg), tmp_path, on_step=steps.append)
    assert steps == list(range(1, cfg.trainer.max_steps + 1))


def test_threads_option_sets_torch_threads_and_rejects_zero(tmp_path):
    before = torch.get_num_threads()
    try:
        run(tmp_path / "a", "trainer.threads=1")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="trainer.threads must be a positive integer or null, got 0"):
        run(tmp_path / "b", "trainer.threads=0")


@pytest.mark.parametrize("task", ["forgetting", "needle"])
@pytest.mark.parametrize("model", ["softmax", "mamba"])
def test_new_tasks_train_end_to_end(tmp_path, task, model):
    res = run(tmp_path, f"task={task}", f"model={model}")
    assert res["status"] == "ok" and res["heads"]
    slices = {r["slice"] for r in res["slices"]}
    assert slices == ({"overwritten", "age"} if task == "forgetting" else {"depth"})


def test_accuracy_and_memory_per_length_the_long_sets_at_the_end(tmp_path):
    """Lengths past the training length: evaluated once, at the end, each with its peak memory;
    the periodic evaluations (metrics.jsonl) watch the training length only, and the O(T^2)
    measurement of effective weights is made at the training length only."""
    res = run(tmp_path, "task=recall", "model=elu", "task.test_seq_len=[64,256,1024]",
              "task.test_num_pairs=[2,4]", "trainer.eval_every=3")
    settings = {(s["seq_len"], s["name"]) for s in res["settings"]}
    assert settings == {(t, f"seq_len={t},num_pairs={n}") for t in (64, 256, 1024) for n in (2, 4)}
    for s in res["settings"]:
        assert s["peak_mem_bytes"] > 0 and s["form"] == "chunk"
        assert s["examples_per_pass"] == min(16, 16384 // s["seq_len"])  # trainer=debug: 16 examples
    assert {(r["value"], r["seq_len"]) for r in res["slices"]} == {(n, t) for n in (2, 4) for t in (64, 256, 1024)}
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(set(k for k in r if k.startswith("accuracy/")) ==
                        {"accuracy/seq_len=64,num_pairs=2", "accuracy/seq_len=64,num_pairs=4"} for r in rows)
    assert {h["seq_len"] for h in res["heads"]} == {64}
    assert {h["value"] for h in res["heads"] if h["slice"] == "num_pairs"} == {2, 4}
    assert res["summary"]["eval_peak_mem_bytes"] == max(s["peak_mem_bytes"] for s in res["settings"])


def test_evaluation_streamed_in_passes_is_one_pass_and_runs_the_chunk_form():
    from harness.config.plan import prepare
    from harness.train.evaluate import evaluate, make_eval_sets
    from harness.train.optim import autocast_factory

    cfg = compose_config(["trainer=debug", "logger=none", "model=retnet", "model.form=parallel",
                          "task.test_seq_len=[64,128]"])
    plan = prepare(cfg)
    sets = make_eval_sets(plan.module, plan.tcfg, cfg.trainer, 0, torch.device("cpu"))
    model = plan.build_model()
    forms = []
    mixer = model.mixers()[0]
    inner = mixer.forward
    mixer.forward = lambda x: (forms.append(mixer.form), inner(x))[1]
    autocast = autocast_factory(torch.device("cpu"), "fp32")
    whole = evaluate(model, sets, autocast, tokens=1 << 20)
    streamed = evaluate(model, sets, autocast, tokens=1)  # one example per pass
    assert set(forms) == {"chunk"} and model.cfg.form == "parallel" and mixer.form == "parallel"
    for a, b in zip(whole["settings"], streamed["settings"]):
        assert a["accuracy"] == b["accuracy"] and a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert whole["slices"] == streamed["slices"]


# A learning rate too small to move the loss by 0.01 nats: every evaluation after the first is a
# plateau. Evaluations at steps 2, 4, 6, ...
PLATEAU = ["trainer.lr=1e-9", "trainer.max_steps=30", "trainer.eval_every=2", "trainer.ckpt_every=4",
           "trainer.target_accuracy=null", "trainer.measure=false", "trainer.min_delta=1.0"]


def test_plateau_stops_early_with_its_reason(tmp_path):
    s = run(tmp_path, *PLATEAU, "trainer.patience=3")["summary"]
    # step 2 improves (the first evaluation), 4, 6 and 8 do not: the third of them stops the run
    assert s["stop_reason"] == "plateau" and s["stopped_early"] is True
    assert s["steps"] == s["steps_run"] == 8
    assert s["best_val_step"] is not None and 0 <= s["best_val_accuracy"] <= 1
    s = run(tmp_path / "late", *PLATEAU, "trainer.patience=3", "trainer.min_steps=13")["summary"]
    assert s["stop_reason"] == "plateau" and s["steps"] == 14  # the first evaluation from step 13 on


def plateau_step(history, patience=2, min_steps=600, min_delta=0.01):
    """The step the plateau rule stops a run at, given its (step, val accuracy, val loss)."""
    from harness.train.state import LoopState, stop_reason

    loop = LoopState()
    for step, accuracy, loss in history:
        loop.record_eval(step, accuracy, loss, min_delta)
        if stop_reason(loop, {"min_accuracy": accuracy}, step, None, patience, min_steps):
            return step
    return None


def test_plateau_stops_a_converged_run_and_keeps_one_leaving_chance():
    """Two quick capacity runs' validation histories (softmax at N = 8: converged by step 300,
    its loss still halving near zero; linear attention at N = 24: at chance, its loss falling
    about 0.08 nats an evaluation): the first stops two evaluations past min_steps, the second
    is never stopped while its loss falls."""
    converged = [(100, 0.005, 5.589), (200, 0.031, 5.074), (300, 1.0, 0.192), (400, 1.0, 0.019),
                 (500, 1.0, 0.007), (600, 1.0, 0.002), (700, 1.0, 0.002), (800, 1.0, 0.001),
                 (900, 1.0, 0.001), (1000, 1.0, 0.003)]
    leaving = [(100, 0.005, 5.581), (200, 0.004, 5.563), (300, 0.006, 5.563), (400, 0.01, 5.486),
               (500, 0.02, 5.362), (600, 0.037, 5.269), (700, 0.051, 5.183), (800, 0.054, 5.135),
               (900, 0.053, 5.125), (1000, 0.06, 5.092)]
    assert plateau_step(converged) == 700  # 600 and 700 improve by under 0.01 nats: two in a row
    assert plateau_step(leaving) is None
    assert plateau_step(converged, min_steps=800) == 800


def test_patience_null_never_stops_early(tmp_path):
    s = run(tmp_path, *PLATEAU)["summary"]
    assert s["stop_reason"] == "max_steps" and s["stopped_early"] is False and s["steps"] == 30


def test_resumed_run_keeps_the_plateau_counter(tmp_path):
    """Killed after step 5 (checkpoint at 4: one evaluation without improvement so far), the rerun
    stops at step 8 as the whole run does; a counter started afresh would stop at 12."""
    from harness.run.job import plan_for
    from harness.train.loop import train

    def crash(step):
        if step == 5:
            raise KeyboardInterrupt

    cfg = compose_config(["trainer=debug", "logger=none", f"out_dir={tmp_path}", *PLATEAU, "trainer.patience=3"])
    with pytest.raises(KeyboardInterrupt):
        train(plan_for(cfg), tmp_path, on_step=crash)
    res = run(tmp_path, *PLATEAU, "trainer.patience=3")
    whole = run(tmp_path / "whole", *PLATEAU, "trainer.patience=3")
    assert res["summary"]["steps"] == whole["summary"]["steps"] == 8
    assert res["summary"]["best_val_step"] == whole["summary"]["best_val_step"]
    assert res["summary"]["loss"] == whole["summary"]["loss"]


def test_progress_in_a_log_file_is_one_line_per_evaluation(tmp_path, capsys):
    """Output captured (not a terminal): no progress bar, a line per evaluation (steps 3 and 6)."""
    from harness.run.job import plan_for
    from harness.train.loop import train

    cfg = compose_config(["trainer=debug", "logger=none", "trainer.measure=false", "trainer.progress=true",
                          f"out_dir={tmp_path}"])
    train(plan_for(cfg), tmp_path)
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.startswith("[harness] step ")]
    assert [line.split(":")[0] for line in lines] == ["[harness] step 3/6", "[harness] step 6/6"]
    assert "\r" not in err and "it/s" not in err


def test_the_plan_reads_the_trainer_section_as_typed_plain_values():
    """RunPlan.trainer holds the resolved trainer settings; a saved config that lacks the section,
    or a key, or holds one a later harness dropped, still gives one (its defaults fill in)."""
    from omegaconf import OmegaConf

    from harness.config.plan import prepare, trainer_settings
    from harness.config.schema import TrainerConfig

    plan = prepare(compose_config(["trainer=debug", "logger=none", "trainer.lr=0.02", "trainer.patience=3"]))
    assert isinstance(plan.trainer, TrainerConfig)
    assert plan.trainer.lr == 0.02 and plan.trainer.patience == 3
    assert plan.trainer.max_steps == plan.cfg.trainer.max_steps
    assert trainer_settings(None) == TrainerConfig()
    old = trainer_settings(OmegaConf.create({"lr": 0.5, "a_key_since_dropped": 1}))
    assert old.lr == 0.5 and old.batch_size == TrainerConfig().batch_size
