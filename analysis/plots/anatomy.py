"""The anatomy of recall: which heads gather and which aggregate, by criteria fixed before the
runs (analysis.gather_aggregate: the criteria, after Bick, Xing & Gu 2025).

Every number comes from the rows harness.measure.ablate writes: the anatomy sweep's runs write
them into their own results.json at the end of training (trainer.ablate=true, the rows
`python -m harness mode=ablate ablate.run=<run>` prints), so the figure needs the results
alone; a run without them (made before the switch) is reopened from its model.pt and ablated
as mode=ablate does, at the run's own ablate.* settings.

Per model (the mixers of its layers, and whether the short convolution is on), two panels.
Left: how many heads of each layer meet each role (A: aggregate, G: gather), per seed, with the
mean and, from five seeds, its interval. Right: the numbers the criteria read, for each run's A
candidate (the head whose clean output restores the most of the query corruption) and G
candidate (the earlier head whose path into the A candidate restores the most of the key
corruption): the share of the way to chance its ablation takes recall (resample, zero and mean
ablation, side by side: they need not agree), what its patching restores, and its weights;
each criterion's threshold is marked. Heads are not matched across seeds, so nothing is
averaged over a head index.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis import stats
from analysis.gather_aggregate import Criteria, candidates, head_numbers, path_numbers, roles
from analysis.plots import FigureSpec
from analysis.plots.common import (MissingData, caption, draw_bars, figure, legend_outside, mark_lower_bounds,
                                   new_figure, require, table, with_stop_flags)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("anatomy", "anatomy", "anatomy_figure", reopens_runs=True, stored_by="trainer.ablate",
               notebook="nb_anatomy",
               tables=("anatomy", "anatomy_roles", "anatomy_heads"),
               synthetic="analysis.synthetic.anatomy.anatomy_runs"),
)

CONV = "config.model.short_conv"
ROLE_COLORS = {"A": (0.80, 0.33, 0.10), "G": (0.13, 0.47, 0.71)}
# (role, number, its name in the figure and tables, the criterion's threshold key or None: shown,
# not judged); the caption says what each name is
NUMBERS = (
    ("A", "necessity_resample", "A resample", "necessity"),
    ("A", "necessity_zero", "A zero", None),
    ("A", "necessity_mean", "A mean", None),
    ("A", "restore_query", "A patched", "restore"),
    ("A", "query_on_answer", "A weight", "attention"),
    ("G", "necessity_resample", "G resample", "necessity"),
    ("G", "path", "G path", "restore"),
    ("G", "value_on_key", "G weight", "attention"),
)
LEGEND = ("resample / zero / mean: the share of the way to chance that ablating the head takes recall; A "
          "patched: the share of the logit difference its clean output restores with the query swapped; G path: "
          "what its clean output restores through the A candidate alone, keys rotated; A weight: at the query on "
          "the answer's value token; G weight: at a pair's value token on its key")


def model_label(runs: pd.DataFrame) -> pd.Series:
    """A run's model as the figure names it: its stack, and "no conv" without the short convolution."""
    conv = runs[CONV] if CONV in runs.columns else pd.Series(True, index=runs.index)
    return runs["model"].astype(str) + np.where(conv.astype(object).eq(False), " (no conv)", "")


def trained_runs(data: pd.DataFrame) -> pd.DataFrame:
    """The finished training runs, each with its figure label (`label`) and `lower_bound`."""
    runs = table(data, "runs", primary=True)
    if "mode" in runs.columns:
        runs = runs[runs["mode"] == "train"]
    runs = require(runs, ["model", "run_dir"], "trained runs (model, run_dir)")
    return with_stop_flags(runs.assign(label=model_label(runs))).reset_index(drop=True)


def ablation_rows(data: pd.DataFrame, *, trust_code: bool = False) -> pd.DataFrame:
    """The ablate rows of every trained run (one per run, layer, head and kind, as mode=ablate
    writes them): read from its results.json, or for a run that has none, computed by reopening
    its model.pt (harness.measure.ablate.ablate_run at the run's own ablate.* settings)."""
    runs = trained_runs(data)
    kept = table(data, "ablate")
    have = set(kept["run_dir"]) if "run_dir" in kept.columns else set()
    out = [kept[kept["run_dir"].isin(runs["run_dir"])]] if have else []
    for _, run in runs[~runs["run_dir"].isin(have)].iterrows():
        if not Path(run["run_dir"], "model.pt").exists():
            continue
        out.append(_reopened(run["run_dir"], trust_code))
    if not out:
        raise MissingData("no ablate rows in any run's results.json (trainer.ablate=true) and no model.pt to "
                          "reopen (trainer.checkpoint=true)")
    rows = pd.concat(out, ignore_index=True)
    rows = rows.drop(columns=[c for c in ("label", "lower_bound", "model", stats.SEED) if c in rows.columns])
    rows = rows.merge(runs[["run_dir", "label", "lower_bound", stats.SEED]], on="run_dir", how="inner")
    for column in ("layer", "head", "sender_layer", "sender_head"):
        if column in rows.columns:
            rows[column] = pd.to_numeric(rows[column], errors="coerce")
    return rows


def _reopened(run_dir: str, trust_code: bool) -> pd.DataFrame:
    import harness
    from omegaconf import OmegaConf

    from harness.config.schema import AblateConfig
    from harness.measure.ablate import ablate_run, settings

    loaded = harness.load_run(run_dir, trust_code=trust_code)
    # the run's own ablate.* settings (what trainer.ablate would have used in the run), over the defaults
    own = settings(OmegaConf.merge(OmegaConf.structured(AblateConfig), loaded.config.get("ablate") or {}))
    return pd.DataFrame(ablate_run(loaded.model, loaded.config, **own)["rows"]).assign(run_dir=run_dir)


def anatomy_tables(rows: pd.DataFrame, criteria: Criteria) -> dict[str, pd.DataFrame]:
    """{"heads": every head of every run with its numbers and roles (is_A, is_G); "candidates":
    per run its A and G candidates; "roles": per model, layer and role the heads that meet it
    (n, mean, interval over seeds); "anatomy": per model the candidates' numbers over seeds, each
    with its threshold, plus runs_at_max_steps and lower_bound}."""
    runs = rows.drop_duplicates("run_dir")[["run_dir", "label", "lower_bound", stats.SEED]]
    heads = roles(head_numbers(rows), path_numbers(rows), criteria).merge(runs, on="run_dir", how="left")
    picked = candidates(heads, path_numbers(rows)).merge(runs, on="run_dir", how="left")
    counts = (heads.groupby(["run_dir", "layer"])[["is_A", "is_G"]].sum().reset_index()
              .melt(id_vars=["run_dir", "layer"], var_name="role", value_name="heads")
              .assign(role=lambda f: f["role"].str[-1]).merge(runs, on="run_dir", how="left"))
    per_layer = heads.groupby(["run_dir", "layer"]).size().max()  # the most heads a layer has
    role_points = stats.summarize(counts, ["label", "layer", "role"], "heads", bounds=(0.0, float(max(1, per_layer))))
    long = []
    for role, number, name, threshold in NUMBERS:
        column = f"{role}_{number}"
        if column in picked.columns:
            long.append(picked.assign(number=name, role=role, value=picked[column],
                                      threshold=getattr(criteria, threshold) if threshold else np.nan))
    long = pd.concat(long, ignore_index=True)
    points = stats.summarize(long, ["label", "role", "number"], "value")
    points = points.merge(long.groupby("number")["threshold"].first().reset_index(), on="number", how="left")
    points["meets"] = np.where(points["threshold"].notna(), points["mean"] >= points["threshold"], np.nan)
    ga = picked.groupby("label")["ga"].agg(runs_with_ga="sum", runs="size").reset_index()
    points = mark_lower_bounds(points.merge(ga, on="label", how="left"), picked, ["label"])
    order = {name: i for i, (_, _, name, _) in enumerate(NUMBERS)}
    points = points.sort_values(["label", "number"], key=lambda s: s.map(order) if s.name == "number" else s,
                                kind="stable").reset_index(drop=True)
    return {"heads": heads, "candidates": picked, "roles": role_points, "anatomy": points}


def _roles_panel(ax, points: pd.DataFrame) -> None:
    layers = sorted(int(v) for v in points["layer"].unique())
    for offset, role in ((-0.2, "A"), (0.2, "G")):
        mine = points[points["role"] == role].assign(key=lambda f: f["layer"].astype(int).astype(str))
        draw_bars(ax, mine, [str(layer) for layer in layers], {str(layer): ROLE_COLORS[role] for layer in layers},
                  key="key", offset=offset, width=0.38, color_of=lambda _, r=role: ROLE_COLORS[r],
                  label=f"{role} heads")
    ax.set_xlabel("layer (0: first)")
    ax.set_ylabel("heads meeting the role (per run)")
    seeds = points[[c for c in points.columns if str(c).startswith("seed_")]].to_numpy(float)
    ax.set_ylim(-0.05, max(1.0, float(np.nanmax(seeds, initial=0.0))) + 0.1)  # a count: from 0 up, 1 at least


def _numbers_panel(ax, points: pd.DataFrame) -> None:
    order = [name for _, _, name, _ in NUMBERS if name in set(points["number"])]
    colors = {name: ROLE_COLORS[role] for role, _, name, _ in NUMBERS}
    draw_bars(ax, points, order, colors, key="number")
    for i, name in enumerate(order):
        threshold = points.loc[points["number"] == name, "threshold"].iloc[0]
        if np.isfinite(threshold):  # the criterion's line across its bar
            ax.plot([i - 0.45, i + 0.45], [threshold] * 2, color="0.1", lw=1.0, ls="--")
    ax.axhline(0.0, color="0.6", lw=0.6)
    ax.set_xlabel("the candidate's number (A: aggregate, G: gather)")
    ax.set_ylabel("value (share; dashed: the criterion)")


@figure("anatomy")
def anatomy_figure(data, *, trust_code: bool = False) -> Figure:
    """Per model, the heads that meet the G and A criteria by layer (left) and the numbers of each
    run's A and G candidates against the criteria (right). ``trust_code``: harness.load_run's,
    for a reopened run of an outside mixer."""
    rows = ablation_rows(data, trust_code=trust_code)
    criteria = Criteria.of_runs(trained_runs(data))
    found = anatomy_tables(rows, criteria)
    points, role_points = found["anatomy"], found["roles"]
    models = list(dict.fromkeys(points["label"]))
    fig, axes = new_figure(len(models), 2, panel=(4.6, 2.8), legend=1.0)
    for i, model in enumerate(models):
        mine = points[points["label"] == model]
        _roles_panel(axes[2 * i], role_points[role_points["label"] == model])
        _numbers_panel(axes[2 * i + 1], mine)
        first = mine.iloc[0]
        bound = f"; {int(first['runs_at_max_steps'])} at max_steps (lower bounds)" if first["lower_bound"] else ""
        axes[2 * i].set_title(f"{model}: G and A heads", fontsize="small")
        axes[2 * i + 1].set_title(f"{model}: G&A in {int(first['runs_with_ga'])} of {int(first['runs'])} runs{bound}",
                                  fontsize="small")
    caption(fig, "Gather and aggregate heads by criteria fixed before the runs: how many heads of each layer "
                 "meet each role, and each run's candidates against the criteria", points, role_points,
            extra=f"criteria (analysis.gather_aggregate): ablating the head takes recall at least "
                  f"{criteria.necessity:g} of the way to chance (resample ablation); patching restores at least "
                  f"{criteria.restore:g} of the logit difference (A: its output, query swapped; G: its path into "
                  f"A, keys rotated); at least {criteria.attention:g} of its weight where its role looks. {LEGEND}",
            legend=1.0)
    legend_outside(fig, axes[0])
    # a run named by its sweep folder and job, not its absolute path: the table is the same wherever
    # the results lie (a committed copy redraws it byte for byte)
    heads = found["heads"].assign(run_dir=found["heads"]["run_dir"].map(lambda d: "/".join(Path(d).parts[-2:])))
    fig.tables = {"anatomy": points, "anatomy_roles": role_points, "anatomy_heads": heads}
    return fig
