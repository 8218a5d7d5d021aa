"""The anatomy of recall: which head carries it.

The anatomy sweep's trained runs (trainer.checkpoint keeps their model.pt) are reopened with
harness.load_run and ablated with harness.measure.ablate.ablate_run, the function mode=ablate
runs, at the same defaults: so the figure needs only the sweep, and `python -m harness
mode=ablate ablate.run=<run>` prints the same numbers for one run. For each model, the recall
lost when each head of each layer is ablated (zero ablation) as a layer x head grid, beside each
head's sharpness (the weight its effective attention puts on the correct key, from the run's
heads table): the gather-and-aggregate heads of Bick, Xing & Gu (2025) should stand out in both,
and in a hybrid the grid shows which layer took retrieval.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.common import MissingData, caption, figure, new_figure, require, table

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("anatomy", "anatomy", "anatomy_figure", reopens_runs=True, notebook="nb_anatomy",
               tables=("anatomy", "anatomy_patching")),
)

KIND = "zero"  # the ablation the grid draws (both kinds are in the table)
LAYER_MARKERS = ("o", "s", "^", "D", "v", "P")


def trained_runs(data: pd.DataFrame) -> pd.DataFrame:
    """The finished training runs that kept their weights (model.pt)."""
    runs = table(data, "runs", primary=True)
    if "mode" in runs.columns:
        runs = runs[runs["mode"] == "train"]
    runs = require(runs, ["model", "run_dir"], "trained runs (model, run_dir)")
    runs = runs[[Path(d, "model.pt").exists() for d in runs["run_dir"]]]
    if runs.empty:
        raise MissingData("no trained run with model.pt (trainer.checkpoint=true keeps it)")
    return runs.reset_index(drop=True)


def ablation_rows(data: pd.DataFrame, *, trust_code: bool = False, examples: int = 256) -> pd.DataFrame:
    """One row per run, (layer, head) and kind ("zero", "mean", "patch"), as mode=ablate writes
    them (head NaN: the whole layer), with the run's model, run_dir and seed."""
    import harness
    from harness.measure.ablate import ablate_run

    out = []
    for _, run in trained_runs(data).iterrows():
        loaded = harness.load_run(run["run_dir"], trust_code=trust_code)
        found = ablate_run(loaded.model, loaded.config, examples=examples)
        seed = run.get(stats.SEED, 0)
        out += [{**r, "model": run["model"], "run_dir": run["run_dir"], stats.SEED: seed} for r in found["rows"]]
    rows = pd.DataFrame(out)
    rows["head"] = pd.to_numeric(rows["head"], errors="coerce")
    return rows


def sharpness(data: pd.DataFrame) -> pd.DataFrame:
    """Mean weight on the correct key per model, layer and head (the runs' heads tables)."""
    heads = table(data, "heads")
    if heads.empty or not {"model", "layer", "head", "target_weight"} <= set(heads.columns):
        return pd.DataFrame(columns=["model", "layer", "head", "target_weight"])
    return heads.groupby(["model", "layer", "head"])["target_weight"].mean().reset_index()


def anatomy_points(rows: pd.DataFrame, sharp: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(recall lost per model, layer, head and ablation kind, with each head's sharpness;
    fraction of the clean logit difference each head restores when patched): n, mean,
    interval and seeds (analysis.stats)."""
    heads = rows[rows["head"].notna() & rows["kind"].isin(["zero", "mean"])]
    drops = stats.summarize(heads, ["model", "layer", "head", "kind"], "drop", bounds=(-1.0, 1.0))
    drops = drops.merge(sharp, on=["model", "layer", "head"], how="left")
    patched = rows[rows["kind"] == "patch"].dropna(subset=["restored"])
    return drops, stats.summarize(patched, ["model", "layer", "head"], "restored")


def drop_grid(points: pd.DataFrame, kind: str = KIND) -> tuple[list, np.ndarray]:
    """(layers, (L, H) mean recall lost) of one model's points; NaN where a layer has fewer heads."""
    mine = points[points["kind"] == kind]
    layers = sorted(int(v) for v in mine["layer"].unique())
    width = int(mine["head"].max()) + 1 if len(mine) else 0
    grid = np.full((len(layers), width), np.nan)
    for _, r in mine.iterrows():
        grid[layers.index(int(r["layer"])), int(r["head"])] = r["mean"]
    return layers, grid


def _grid_panel(ax, fig, model: str, layers: list, grid: np.ndarray, scale: float) -> None:
    image = ax.imshow(grid, vmin=-scale, vmax=scale, cmap="RdBu_r", aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        if np.isfinite(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize="x-small",
                    color="white" if abs(value) > 0.6 * scale else "black")
    ax.grid(False)  # the style's grid would cut through the cells
    ax.set_yticks(range(len(layers)), [str(layer) for layer in layers])
    ax.set_xticks(range(grid.shape[1]))
    ax.set_xlabel("head (index in its layer)")
    ax.set_ylabel("layer (0: first)")
    ax.set_title(f"{model}: recall lost ({KIND} ablation)", fontsize="small")
    fig.colorbar(image, ax=ax, label="recall lost (accuracy)")


def _sharpness_panel(ax, points: pd.DataFrame, layers: list, stack: list[str], scale: float) -> None:
    mine = points[points["kind"] == KIND].dropna(subset=["target_weight"])
    for k, layer in enumerate(layers):
        at = mine[mine["layer"] == layer]
        name = stack[layer] if layer < len(stack) else "?"
        # see-through: heads that score alike stay visible under one another
        ax.scatter(at["target_weight"], at["mean"], s=30, alpha=0.6, marker=LAYER_MARKERS[k % len(LAYER_MARKERS)],
                   label=f"layer {layer}: {name}")
    ax.set_xlabel("weight on the correct key (sharpness)")
    ax.set_ylabel("recall lost when ablated (accuracy)")
    ax.set_ylim(-1.05 * scale, 1.05 * scale)  # the grid's colour scale: panels compare by eye
    ax.legend(fontsize="x-small", loc="best")


@figure("anatomy")
def anatomy_figure(data, *, trust_code: bool = False) -> Figure:
    """Per model, a layer x head grid of the recall lost by zero ablation, beside each head's
    sharpness against that loss. ``trust_code``: harness.load_run's, for runs of outside mixers."""
    from analysis.plots.hybrid import slots

    rows = ablation_rows(data, trust_code=trust_code)
    drops, patched = anatomy_points(rows, sharpness(data))
    models = list(dict.fromkeys(rows["model"]))
    scale = max(0.05, float(np.nanmax(np.abs(drops["mean"].to_numpy(float)))))
    with_sharpness = drops["target_weight"].notna().any()
    fig, axes = new_figure(len(models), 2 if with_sharpness else 1, panel=(3.9, 2.6))
    for i, model in enumerate(models):
        mine = drops[drops["model"] == model]
        layers, grid = drop_grid(mine)
        if with_sharpness:
            _grid_panel(axes[2 * i], fig, model, layers, grid, scale)
            _sharpness_panel(axes[2 * i + 1], mine, layers, slots(model), scale)
        else:
            _grid_panel(axes[i], fig, model, layers, grid, scale)
    caption(fig, "The anatomy of recall: the recall each head carries (lost when it is ablated), beside its "
                 "sharpness", drops, extra="ablation at the run's training length (harness.measure.ablate, as "
                                           "mode=ablate); sharpness from the run's heads table", legend=0.0)
    fig.tables = {"anatomy": drops, "anatomy_patching": patched}
    return fig
