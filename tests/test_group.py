"""Grouped training (harness.train.group): each member of a batched group is its solo run."""
from __future__ import annotations

import math

import pytest
import torch

from harness.config.compose import compose_config
from harness.config.plan import prepare
from harness.layers import registry
from harness.train.group import group_plans, shape_signature, train_group, ungroupable, why_apart
from harness.train.group.optim import GroupAdamW, clip_per_member
from harness.train.group.stack import build_member
from harness.train.memory import fitted

SMALL = ["model.d_model=8", "model.n_layers=1", "trainer=debug", "logger=none", "task.seq_len=32",
         "trainer.warmup_steps=3", "trainer.ckpt_every=null", "trainer.measure=false", "trainer.target_accuracy=null"]


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as a sweep's runs train (trainer.threads=1): the tiny steps here spend
    more on waking a second thread than on arithmetic, and far more on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def plan(model="elu", seed=0, lr=3e-3, num_pairs=4, steps=6, *extra):
    """A small recall run's plan, fitted as run_job fits it (its evaluation tokens)."""
    return fitted(prepare(compose_config([f"model={model}", *SMALL, f"seed={seed}", f"trainer.lr={lr}",
                                          f"task.num_pairs={num_pairs}", f"trainer.max_steps={steps}", *extra])))


def solo_losses(p, out_dir) -> tuple[list[float], dict]:
    """The run's per-step training losses and final weights from the solo loop itself
    (harness.train.loop.start and steps), its model in float64 (log_every=1)."""
    from harness.train import loop

    r = loop.start(p, out_dir)
    r.model.double()  # the optimizer and the fault watch hold the same parameter objects
    losses = []
    r.clock.then = lambda step: losses.append(r.loop.last_loss)
    try:
        loop.steps(r)
    finally:
        r.metrics.close()
        r.terminate.restore()
    return losses, r.model.state_dict()


def _members(model, steps=50, *extra):
    """Three members apart in seed, rate, number of pairs and clipping."""
    common = [*extra, "trainer.log_every=1", f"trainer.eval_every={steps}"]
    return [plan(model, 0, 1e-2, 4, steps, *common), plan(model, 1, 3e-3, 6, steps, *common, "trainer.grad_clip=0.5"),
            plan(model, 2, 5e-3, 2, steps, *common)]


HYBRID = ("gated_deltanet", "model.layers=[gated_deltanet,softmax]", "model.n_layers=2")


@pytest.mark.parametrize("model, extra", [("elu", ()), ("favor", ("model.options.favor_redraw=step",)), ("deltanet", ()),
                                          ("gated_deltanet", ()), (HYBRID[0], HYBRID[1:])],
                         ids=["elu", "favor_redraw", "deltanet", "gated_deltanet", "hybrid"])
def test_each_member_follows_its_solo_run_in_float64(tmp_path, model, extra):
    plans = _members(model, 50, *extra)
    group = train_group(plans, dtype=torch.float64)
    for i, (p, m) in enumerate(zip(plans, group)):
        losses, weights = solo_losses(p, tmp_path / str(i))
        grouped = [row["train/loss"] for row in m.train_rows]
        assert len(grouped) == len(losses) == 50 and m.stop_reason == "max_steps"
        # the loss is taken in float32 (harness.train.optim.lm_loss) from float64 logits
        worst = max(abs(a - b) / abs(a) for a, b in zip(losses, grouped))
        assert worst < 1e-6, (i, worst)
        for name, value in m.state_dict().items():
            torch.testing.assert_close(value, weights[name], rtol=1e-9, atol=1e-12)
    assert group[0].train_rows[-1]["train/loss"] != group[2].train_rows[-1]["train/loss"]


def test_a_rounding_twin_starts_in_a_group_where_it_starts_alone(tmp_path):
    """trainer.init_jitter moves a member's initial weights as it moves its solo run's: twins
    apart only in the jitter start apart, so a rate pilot's rounding gap is measured in a group."""
    from harness.train import loop

    twins = [plan("elu", 0, 1e-2, 4, 6, "trainer.init_jitter=1e-2"), plan("elu", 0, 1e-2, 4, 6)]
    grouped = [build_member(p).state_dict() for p in twins]
    run = loop.start(twins[0], tmp_path / "solo")
    try:
        solo = {k: v.clone() for k, v in run.model.state_dict().items()}
    finally:
        run.metrics.close()
        run.terminate.restore()
    for name, value in grouped[0].items():
        torch.testing.assert_close(value, solo[name], rtol=0, atol=0)
    moved = [name for name, value in grouped[0].items() if not torch.equal(value, grouped[1][name])]
    assert len(moved) >= len(grouped[0]) // 2, moved  # every weight not initialised to 0
    first, second = (m.state_dict() for m in train_group(twins))
    assert any(not torch.equal(first[name], second[name]) for name in moved)


def test_group_adamw_is_torch_adamw_per_member_and_a_masked_member_stays_bit_for_bit():
    torch.manual_seed(0)
    lrs, decays, clips = [1e-2, 3e-3, 5e-3], [0.1, 0.0, 0.3], [1.0, 0.0, 0.5]
    solo = [[torch.randn(4, 5, dtype=torch.float64, requires_grad=True),
             torch.randn(5, dtype=torch.float64, requires_grad=True)] for _ in lrs]
    flat = torch.stack([torch.cat([w.detach().reshape(-1), b.detach()]) for w, b in solo]).requires_grad_()
    decaying = torch.arange(25) < 20  # the matrix decays, the bias does not (build_optimizer's split)
    opts = [torch.optim.AdamW([{"params": [s[0]], "weight_decay": wd}, {"params": [s[1]], "weight_decay": 0.0}],
                              lr=lr, betas=(0.9, 0.98), eps=1e-8) for s, lr, wd in zip(solo, lrs, decays)]
    group = GroupAdamW(flat, decaying, decays, beta1=0.9, beta2=0.98, eps=1e-8)
    for step in range(1, 6):
        grads = [[torch.randn(4, 5, dtype=torch.float64) * (i + 1), torch.randn(5, dtype=torch.float64)]
                 for i in range(len(lrs))]
        for s, g, o, clip in zip(solo, grads, opts, clips):
            s[0].grad, s[1].grad = g[0].clone(), g[1].clone()
            if clip:
                torch.nn.utils.clip_grad_norm_(s, clip)
            o.step()
        flat.grad = torch.stack([torch.cat([w.reshape(-1), b]) for w, b in grads])
        clip_per_member(flat.grad, clips)
        group.step(flat, lrs, torch.ones(len(lrs), dtype=torch.bool))
    for i, (w, b) in enumerate(solo):
        torch.testing.assert_close(flat[i], torch.cat([w.detach().reshape(-1), b.detach()]), rtol=1e-13, atol=0)
    # a member masked out (a NaN gradient, say) keeps parameters, moments and step count exactly
    before, moments = flat.detach().clone(), group.member_state(1, lambda row: {"all": row})
    flat.grad = torch.randn_like(flat)
    flat.grad[1] = float("nan")
    group.step(flat, lrs, torch.tensor([True, False, True]))
    assert torch.equal(flat[1], before[1]) and not torch.equal(flat[0], before[0])
    after = group.member_state(1, lambda row: {"all": row})
    assert after["step"] == moments["step"] == 5.0
    assert all(torch.equal(after[key]["all"], moments[key]["all"]) for key in ("exp_avg", "exp_avg_sq"))


def test_a_member_that_stops_leaves_frozen_and_its_run_is_its_solo_run(tmp_path):
    plans = [plan("elu", 0, 1e-2, 4, 12, "trainer.log_every=1", "trainer.eval_every=3"),
             plan("elu", 1, 1e-2, 4, 5, "trainer.log_every=1", "trainer.eval_every=3")]
    seen = {}

    def at(step, g):
        if step == 5:  # after its last optimizer step, before it leaves the stack
            row = g.active.index(1)
            seen["weights"], seen["moments"] = g.stack.member_state(row), g.opt.member_state(row, g.stack.split)

    group = train_group(plans, dtype=torch.float64, on_step=at)
    short = group[1]
    assert short.stop_reason == "max_steps" and short.loop.step == 5 and group[0].loop.step == 12
    assert [r["step"] for r in short.history] == [3, 5]
    assert all(torch.equal(short.state_dict()[k], v) for k, v in seen["weights"].items())
    assert short.optimizer["step"] == seen["moments"]["step"] == 5.0
    assert all(torch.equal(short.optimizer["exp_avg"][k], v) for k, v in seen["moments"]["exp_avg"].items())
    losses, weights = solo_losses(plans[1], tmp_path)
    assert max(abs(a - r["train/loss"]) / a for a, r in zip(losses, short.train_rows)) < 1e-6
    for name, value in short.state_dict().items():
        torch.testing.assert_close(value, weights[name], rtol=1e-9, atol=1e-12)


def test_one_members_nan_fails_it_alone_and_leaves_the_others_untouched():
    def plans():
        return [plan("softmax", s, 1e-2, 4, 10, "trainer.log_every=2", "trainer.eval_every=5") for s in range(3)]

    seen = {}

    def poison(step, g):
        if step == 3:
            with torch.no_grad():
                g.stack.flat[g.active.index(1)] = float("nan")
            seen["weights"] = g.stack.member_state(g.active.index(1))

    clean = train_group(plans(), dtype=torch.float64)
    hit = train_group(plans(), dtype=torch.float64, on_step=poison)
    failed = hit[1]
    assert failed.stop_reason == "fault"
    assert failed.fault == {"step": 4, "check": "loss", "member": 1, "mixer": "softmax"}
    assert failed.loop.step == 3 and [r["step"] for r in failed.train_rows] == [2]
    for name, value in failed.state_dict().items():  # frozen as it was when it went bad
        torch.testing.assert_close(value, seen["weights"][name], rtol=0, atol=0, equal_nan=True)
    for i in (0, 2):
        assert hit[i].stop_reason == "max_steps" and hit[i].fault is None
        assert [r["train/loss"] for r in hit[i].train_rows] == [r["train/loss"] for r in clean[i].train_rows]
        for name, value in hit[i].state_dict().items():
            torch.testing.assert_close(value, clean[i].state_dict()[name], rtol=1e-12, atol=1e-14)


def test_a_killed_group_resumes_bit_for_bit(tmp_path):
    from harness.outputs import checkpoint

    def plans():
        return [plan("gated_deltanet", 0, 1e-2, 4, 12, "trainer.log_every=2", "trainer.eval_every=3"),
                plan("gated_deltanet", 1, 3e-3, 2, 7, "trainer.log_every=2", "trainer.eval_every=3")]

    whole = train_group(plans(), checkpoint=tmp_path / "whole.pt", ckpt_every=4)

    def kill(step, g):
        if step == 6:
            raise KeyboardInterrupt

    path = tmp_path / "group.pt"
    with pytest.raises(KeyboardInterrupt):
        train_group(plans(), checkpoint=path, ckpt_every=4, on_step=kill)
    saved = checkpoint.load(path)
    assert saved["step"] == 4
    resumed = train_group(plans(), checkpoint=path, ckpt_every=4, resume=saved)
    for a, b in zip(whole, resumed):
        assert a.stop_reason == b.stop_reason and a.loop.step == b.loop.step
        assert a.train_rows == b.train_rows
        assert [{k: v for k, v in r.items() if k != "time_s"} for r in a.history] == \
               [{k: v for k, v in r.items() if k != "time_s"} for r in b.history]
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    with pytest.raises(ValueError, match="belongs to other runs"):
        train_group(plans()[::-1], resume=saved)


@pytest.mark.parametrize("model, extra", [*[(name, ()) for name in registry.builtin_names()],
                                          ("swa", ("model.options.window=8",)), (HYBRID[0], HYBRID[1:])],
                         ids=[*registry.builtin_names(), "swa_banded", "hybrid"])
def test_every_builtin_mixer_trains_in_a_group(model, extra):
    plans = [plan(model, s, 3e-3, 2 + s, 3, "trainer.log_every=1", "trainer.eval_every=3", *extra) for s in range(2)]
    group = train_group(plans)
    for m in group:
        assert m.stop_reason == "max_steps" and m.fault is None and len(m.train_rows) == 3
        assert all(math.isfinite(r["train/loss"]) for r in m.train_rows)
        assert m.history and 0.0 <= m.history[-1]["accuracy"] <= 1.0
    first, second = (m.state_dict()["head.weight"] for m in group)
    assert not torch.equal(first, second)  # each member kept its own initialisation and data


def test_the_signature_groups_what_shares_shapes_and_says_why_not():
    base = plan("elu", 0)
    assert why_apart(base, plan("elu", 3, 1e-2, 6, 9, "trainer.grad_clip=0.5", "trainer.weight_decay=0.0")) is None
    assert "model.d_model: 8 vs 16" in why_apart(base, plan("elu", 0, 3e-3, 4, 6, "model.d_model=16"))
    assert "model.name: 'elu' vs 'retnet'" in why_apart(base, plan("retnet"))
    assert "trainer.batch_size: 8 vs 4" in why_apart(base, plan("elu", 0, 3e-3, 4, 6, "trainer.batch_size=4"))
    assert "training length: 32 vs 64" in why_apart(base, plan("elu", 0, 3e-3, 4, 6, "task.seq_len=64"))
    assert "model.eps" in why_apart(base, plan("elu", 0, 3e-3, 4, 6, "model.options.eps=1e-5"))  # the skeleton's setting
    # the interference task derives its length from the number of pairs: those differ in shape
    n4, n8 = (plan("elu", 0, 3e-3, n, 6, "task=interference", "task.seq_len=null") for n in (4, 8))
    assert why_apart(n4, n8) == "they differ in training length: 12 vs 24"
    dropout = plan("elu", 0, 3e-3, 4, 6, "model.dropout=0.1")
    assert "dropout" in ungroupable(dropout) and "dropout" in why_apart(base, dropout)
    assert shape_signature(base) == shape_signature(plan("elu", 7, 1e-2, 2))


def test_group_plans_cuts_equal_groups_and_names_each_run_left_alone():
    plans = [plan("elu", s) for s in range(5)] + [plan("elu", 0, 3e-3, 4, 6, "model.d_model=16"),
                                                  plan("elu", 0, 3e-3, 4, 6, "model.dropout=0.1")]
    groups, alone = group_plans(plans, max_size=4)
    assert groups == [[0, 1], [2, 3, 4]] or groups == [[0, 1, 2], [3, 4]]
    assert sorted(alone) == [5, 6]
    assert alone[5].startswith("no other run shares its shape") and "model.d_model: 16 vs 8" in alone[5]
    assert "dropout" in alone[6]
    assert group_plans(plans[:5])[0] == [[0, 1, 2, 3, 4]]
    assert sorted(group_plans(plans[:3], max_size=1)[1]) == [0, 1, 2]


def test_the_bench_row_times_solo_and_grouped_steps_of_one_shape():
    from harness.bench.group import format_table, shape_rows

    rows = shape_rows("tiny elu", ["model=elu", *SMALL], sizes=[2, 3], steps=3, warmup=2, solo_runs=1)
    assert [r["group_size"] for r in rows] == [2, 3]
    for r in rows:
        assert r["solo_ms_per_step"] > 0 and r["grouped_ms_per_step_per_run"] > 0
        assert r["speedup"] == pytest.approx(r["solo_ms_per_step"] / r["grouped_ms_per_step_per_run"])
    assert rows[0]["solo_ms_per_step"] == rows[1]["solo_ms_per_step"]  # measured once per shape
    assert "| tiny elu | 3 |" in format_table(rows)
    # on a CPU the rows count process time (what a run costs a core), and say so
    assert {(r["device"], r["clock"]) for r in rows} == {("cpu", "cpu")}
    assert "| solo cpu ms/step |" in format_table(rows)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for a machine without CUDA")
def test_the_bench_refuses_a_gpu_it_cannot_see(capsys):
    from harness.bench.group import main

    with pytest.raises(SystemExit) as stop:
        main(["--device", "cuda", "--sizes", "2"])
    assert stop.value.code == 2 and "torch sees no CUDA device" in capsys.readouterr().err


def test_the_bound_row_times_one_solo_run_at_the_groups_whole_batch():
    from harness.bench.group import format_table, shape_rows

    row, = shape_rows("tiny elu", ["model=elu", *SMALL], sizes=[2], steps=3, warmup=2, solo_runs=1, bound=True)
    # a run's share of one solo step at batch 2 x batch: what the bound and the overhead divide by
    assert row["solo_whole_batch_ms_per_run"] > 0
    assert row["bound"] == pytest.approx(row["solo_ms_per_step"] / row["solo_whole_batch_ms_per_run"])
    assert row["overhead"] == pytest.approx(row["grouped_ms_per_step_per_run"] / row["solo_whole_batch_ms_per_run"])
    assert "| bound |" in format_table([row]) and f"{row['bound']:.2f}x" in format_table([row])


class CumulativeMixer(torch.nn.Module):
    """An outside mixer of plain torch operators (unnormalised causal linear attention through a
    cumulative sum): vmap batches it."""

    def __init__(self, d_model: int):
        super().__init__()
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.out = torch.nn.Linear(d_model, d_model)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        state = torch.cumsum(k.unsqueeze(-1) * v.unsqueeze(-2), dim=1)  # (B, T, C, C)
        return self.out(torch.einsum("btc,btcd->btd", torch.nn.functional.elu(q) + 1, state) / x.shape[1])


class BranchingMixer(CumulativeMixer):
    """An outside mixer that reads a tensor's value in Python (a data-dependent branch): vmap cannot
    batch it."""

    def forward(self, x):
        y = super().forward(x)
        return y if y.sum().item() > float("-inf") else -y


def test_an_outside_mixer_joins_a_group_where_a_trial_step_shows_vmap_batches_it(tmp_path):
    ok = [plan("elu", s, 3e-3, 4, 4, "trainer.log_every=1", f"model.name={__name__}.CumulativeMixer")
          for s in range(2)]
    assert ungroupable(ok[0]) is None
    groups, alone = group_plans(ok)
    assert groups == [[0, 1]] and not alone
    # and each member is its solo run, as a built-in's (float64)
    group = train_group(ok, dtype=torch.float64)
    for i, (p, m) in enumerate(zip(ok, group)):
        losses, _ = solo_losses(p, tmp_path / str(i))
        grouped = [row["train/loss"] for row in m.train_rows]
        assert max(abs(a - b) / abs(a) for a, b in zip(losses, grouped)) < 1e-6
    branching = plan("elu", 0, 3e-3, 4, 6, f"model.name={__name__}.BranchingMixer")
    reason = ungroupable(branching)
    assert reason is not None and "BranchingMixer: vmap does not batch it" in reason, reason
    groups, alone = group_plans([branching, plan("elu", 1, 3e-3, 4, 6, f"model.name={__name__}.BranchingMixer")])
    assert not groups and all("vmap does not batch it" in why for why in alone.values())


@pytest.mark.parametrize("model, extra", [("elu", ()), ("deltanet", ()), HYBRID[:1] + (HYBRID[1:],)],
                         ids=["elu", "deltanet", "hybrid"])
def test_the_direct_fold_trains_as_torchs_own_vmap_rule_does(model, extra, monkeypatch):
    """harness.ops.common.members makes a folded call directly below vmap's level; torch's path
    for the Function's vmap rule (members.DIRECT off) is its oracle: the same group to the bit."""
    from harness.ops.common import members

    assert members.DIRECT  # this torch has the bindings, so the tests below exercise the direct path
    groups, torch_path = {}, []
    through_torch = members._MemberFold.apply

    def counted(*args):
        torch_path.append(args[0])
        return through_torch(*args)

    monkeypatch.setattr(members._MemberFold, "apply", counted)
    for direct in (True, False):
        monkeypatch.setattr(members, "DIRECT", direct)
        torch_path.clear()
        groups[direct] = train_group([plan(model, s, 3e-3, 2 + s, 6, "trainer.log_every=1", *extra) for s in range(2)])
        assert bool(torch_path) != direct  # the path under test ran: no call through torch's, or every one
    for a, b in zip(groups[True], groups[False]):
        assert [r["train/loss"] for r in a.train_rows] == [r["train/loss"] for r in b.train_rows]
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
