"""Attention maps of trained runs: the effective weights a_ij of a retrieval head on one example,
query rows against key columns, the answer positions marked; softmax attention beside the first
mixer of each other family (kernel maps, decays, the delta rule) is the picture of sharp against
smeared attention.

The runs are reopened with harness.load_run (weights, config, task) and one held-out example is
run through the hook points; the weights are the mixer's own effective_weights, the same ones
the run's sharpness measurements used. Nothing is trained here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

import harness
from analysis.plots import FigureSpec
from analysis.plots.common import MissingData, figure, mixer_order, new_figure, require, table
from analysis.plots.palette import family_of
from harness.hooks import capture
from harness.layers.protocol import mixer_hooks

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("attention", "sharpness", "attention_figure", reopens_runs=True, notebook="nb_attention"),  # one run per family
)


def family_representatives(names) -> list[str]:
    """Of ``names``, the first mixer of each family in reading order (analysis.plots.palette)."""
    seen, out = set(), []
    for name in mixer_order(names):
        family = family_of(name)
        if family not in seen:
            seen.add(family)
            out.append(name)
    return out


@dataclass
class AttentionMap:
    model: str
    run_dir: str
    layer: int
    head: int
    weights: np.ndarray       # (T, T) effective weights of the head, zero above the diagonal
    queries: np.ndarray       # (Q,) query positions
    answers: np.ndarray       # (Q,) the position each query's answer was written at
    tokens: np.ndarray        # (T,) the example's input tokens
    target_weight: float      # the run's measured mean weight on the answer span


def trained_runs(data: pd.DataFrame, models=None) -> pd.DataFrame:
    """The best finished run (highest accuracy, ties to the lowest seed) of each model that kept its
    weights (model.pt); ``models`` None: of each family's first mixer in reading order among those
    runs (softmax attention beside one mixer of each other family, chosen by what the mixers are)."""
    runs = require(table(data, "runs", primary=True), ["model", "run_dir", "summary.accuracy"],
                   "finished runs with run_dir and summary.accuracy")
    runs = runs[[Path(d, "model.pt").exists() for d in runs["run_dir"]]]
    if models is None:
        models = family_representatives(runs["model"])
    runs = runs[runs["model"].isin(models)]
    if runs.empty:
        raise MissingData(f"no run of {', '.join(models) or 'any mixer'} with model.pt "
                          "(trainer.checkpoint=true keeps it)")
    # ties (seeds at the same test accuracy are common near 1) go to the lowest seed, a stated rule
    # rather than the order the results were read in
    keys = ["summary.accuracy"] + (["config.seed"] if "config.seed" in runs else [])
    best = runs.sort_values(keys, ascending=[False, True][:len(keys)], kind="stable")
    best = best.groupby("model", sort=False).head(1)
    return best.set_index("model").loc[[m for m in mixer_order(best["model"])]].reset_index()


@torch.no_grad()
def attention_map(run_dir: str, *, example: int = 0, layer: int | None = None, head: int | None = None,
                  trust_code: bool = False) -> AttentionMap:
    """The effective weights of one head (default: the run's retrieval head) on one example;
    ``trust_code``: harness.load_run's (a run whose config names outside code)."""
    run = harness.load_run(run_dir, trust_code=trust_code)
    summary = run.results.get("summary", {})
    layer = int(summary.get("retrieval_layer") or 0) if layer is None else layer
    head = int(summary.get("retrieval_head") or 0) if head is None else head
    batch = run.batch(example + 1, seed=0)
    with capture(run.model, names=lambda name: f"layers.{layer}.mixer.hook_" in name) as cache:
        run.model(batch.inputs)
    mixer = run.model.mixers()[layer]
    weights = mixer.effective_weights(mixer_hooks(mixer, cache, f"layers.{layer}.mixer."))  # (B, H, T, T)
    target = batch.target_pos[example]
    queries = torch.nonzero(target >= 0).squeeze(-1)
    return AttentionMap(model=run.config.model.name, run_dir=str(run_dir), layer=layer, head=head,
                        weights=weights[example, head].double().cpu().numpy(), queries=queries.numpy(),
                        answers=target[queries].numpy(), tokens=batch.inputs[example].numpy(),
                        target_weight=float(summary.get("target_weight", np.nan)))


def _draw(ax, amap: AttentionMap) -> object:
    """The causal weights up to a little past the last query (the rest of the sequence is filler
    that no query reads), log colour, each query's row marked and its answer circled."""
    end = min(len(amap.tokens), int(amap.queries.max()) + 4) if amap.queries.size else len(amap.tokens)
    w = np.abs(amap.weights[:end, :end])
    w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)  # each row a distribution (decayed mixers are unnormalised)
    shown = np.where(np.tril(np.ones_like(w, dtype=bool)), np.maximum(w, 1e-4), np.nan)
    im = ax.imshow(shown, cmap="magma_r", norm=LogNorm(vmin=1e-4, vmax=1.0), interpolation="nearest", aspect="equal")
    ax.grid(False)
    for q in amap.queries:
        ax.axhline(q, color="tab:cyan", lw=0.6, alpha=0.6)
    ax.scatter(amap.answers, amap.queries, s=70, facecolors="none", edgecolors="tab:cyan", linewidths=1.6,
               label="a query's answer")
    ax.set(xlabel="key position j (token)", ylabel="query position i (token; query rows marked)",
           title=f"{amap.model}: layer {amap.layer}, head {amap.head}\n"
                 f"mean weight on the answer span {amap.target_weight:.2f}")
    return im


@figure("attention")
def attention_figure(data, models=None, trust_code: bool = False) -> Figure:
    """Effective attention of each model's best run on one held-out example of its task."""
    runs = trained_runs(data, models)
    maps = [attention_map(d, trust_code=trust_code) for d in runs["run_dir"]]
    fig, axes = new_figure(1, len(maps), panel=(4.4, 4.4), legend=0.0)
    im = None
    for ax, amap in zip(axes, maps):
        im = _draw(ax, amap)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", fontsize="small", frameon=False)
    fig.colorbar(im, ax=axes, shrink=0.8, label="weight a_ij / sum_j |a_ij| (log)")
    fig.suptitle("Sharp against smeared: effective attention on one recall example", x=0.01, ha="left",
                 fontsize="medium")
    for ax in axes:  # a square image in a taller box sits at its foot, its title below the figure's
        ax.set_anchor("S")
    return fig
