"""The anatomy of recall: which head carries it.

For each model, the recall lost when each head of each layer is ablated (mode=ablate's rows,
zero ablation by default), as a layer x head grid, beside each head's sharpness (the weight
its effective attention puts on the correct key, from the end-of-run heads table): the
gather-and-aggregate heads of Bick, Xing & Gu (2025) should stand out in both, and in a hybrid
the grid shows which layer took retrieval.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.plots.common import MissingData, new_figure


def drop_grid(rows: pd.DataFrame, kind: str = "zero") -> tuple[list, np.ndarray]:
    """(layers, (L, H) recall lost) of one model's ablation rows; NaN where a layer has fewer heads."""
    heads = rows[(rows["kind"] == kind) & rows["head"].notna()]
    layers = sorted(heads["layer"].unique())
    width = int(heads["head"].max()) + 1 if len(heads) else 0
    grid = np.full((len(layers), width), np.nan)
    for _, r in heads.groupby(["layer", "head"])["drop"].mean().reset_index().iterrows():
        grid[layers.index(r["layer"]), int(r["head"])] = r["drop"]
    return layers, grid


def anatomy_figure(ablation: pd.DataFrame, heads: pd.DataFrame | None = None, kind: str = "zero") -> Figure:
    """ablation: the loader's "ablate" table (mode=ablate runs); heads: the "heads" table of the
    trained runs (target_weight per layer and head), or None."""
    if ablation.empty or not {"model", "layer", "head", "kind", "drop"} <= set(ablation.columns):
        raise MissingData("no ablation rows (python -m harness mode=ablate ablate.run=...)")
    models = list(dict.fromkeys(ablation["model"]))
    fig, axes = new_figure(len(models), 2, panel=(3.8, 2.8))
    for i, model in enumerate(models):
        grid_ax, sharp_ax = axes[2 * i], axes[2 * i + 1]
        layers, grid = drop_grid(ablation[ablation["model"] == model], kind)
        image = grid_ax.imshow(grid, vmin=0, vmax=max(1e-9, np.nanmax(grid)) if grid.size else 1, cmap="viridis",
                               aspect="auto")
        grid_ax.set_yticks(range(len(layers)), [str(int(l)) for l in layers])
        grid_ax.set_xticks(range(grid.shape[1]))
        grid_ax.set_xlabel("head")
        grid_ax.set_ylabel("layer")
        grid_ax.set_title(f"{model}: recall lost ({kind} ablation)", fontsize=8)
        fig.colorbar(image, ax=grid_ax)
        if heads is None or "target_weight" not in heads.columns:
            sharp_ax.set_visible(False)
            continue
        sharp = heads[heads["model"] == model].groupby(["layer", "head"])["target_weight"].mean()
        for (layer, head), weight in sharp.items():
            if layer in layers and head is not None and not pd.isna(head) and int(head) < grid.shape[1]:
                sharp_ax.scatter(weight, grid[layers.index(layer), int(head)], s=16)
                sharp_ax.annotate(f"{int(layer)}.{int(head)}", (weight, grid[layers.index(layer), int(head)]),
                                  fontsize=6)
        sharp_ax.set_xlabel("weight on the correct key (sharpness)")
        sharp_ax.set_ylabel("recall lost when ablated")
    return fig
