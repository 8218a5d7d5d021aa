"""The learning-rate edge rule: where a point's chosen rate sits at the edge of its grid, the
sweep runs the next rate out for that mixer.

After an experiment's sweep, each point (a run's sweep overrides but the learning rate and the
seed) takes the rate with the best mean validation accuracy over its seeds. A point whose best
rate is the grid's lowest (highest) gets the next rate below (above) it, one grid step out
(the ratio of the grid's two outermost rates on that side), for its mixer, unless the edge rate
beats its inner neighbour by no more than TIE: a point whose accuracy is flat across rates (every
rate at 1.0 on induction) has no optimum to bracket, and a two-rate grid would otherwise send every
mixer out on one side or the other. One second-stage
sweep per new rate, ``model=<the edge mixers> trainer.lr=<new rate>``, written under
``<sweep>/lr_extended/lr_<rate>/``. The loader marks those runs ``lr_extended`` (their folder),
so every figure's learning-rate table says which rates the sweep added.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path, PurePath

import yaml

EXTENDED_DIR = "lr_extended"
LR_KEY = "trainer.lr"
# A best rate this little above its inner neighbour (mean validation accuracy) is a tie, not an
# edge to extend: the plateau rule's min_delta, several times the binomial noise of 1,024 queries.
TIE = 0.01


def grid_rates(params: dict[str, list[str]]) -> list[float]:
    """The sorted learning rates the sweep tries (empty: fewer than two, no edge to extend)."""
    rates = sorted({float(v) for v in params.get(LR_KEY, [])})
    return rates if len(rates) >= 2 else []


def _overrides(run_dir: Path) -> dict[str, str]:
    from analysis.loader import read_text

    try:
        items = yaml.safe_load(read_text(run_dir / ".hydra" / "overrides.yaml")) or []
    except (OSError, UnicodeDecodeError, EOFError, yaml.YAMLError):
        return {}
    out = {}
    for item in items:
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def run_scores(sweep_dir: Path) -> list[dict]:
    """Per finished training run of the first stage: its overrides, rate and validation accuracy."""
    from analysis.loader import NoResultsError, find_results, read_text

    try:
        files = find_results(sweep_dir)
    except NoResultsError:
        return []
    rows = []
    for file in files:
        if EXTENDED_DIR in file.relative_to(sweep_dir).parts:
            continue
        try:
            data = json.loads(read_text(file))
        except (OSError, ValueError, EOFError):
            continue
        summary = data.get("summary") or {}
        score = summary.get("val_accuracy", summary.get("accuracy"))
        lr = (data.get("config") or {}).get("trainer", {}).get("lr") if isinstance(
            (data.get("config") or {}).get("trainer"), dict) else (data.get("config") or {}).get(LR_KEY)
        if data.get("status") != "ok" or data.get("mode") != "train" or score is None:
            continue
        overrides = _overrides(file.parent)
        lr = float(overrides.get(LR_KEY, lr if lr is not None else math.nan))
        rows.append({"overrides": overrides, "lr": lr, "score": float(score),
                     "val_loss": float(summary.get("val_loss", math.nan))})
    return rows


def extensions(rows: list[dict], rates: list[float]) -> dict[float, list[str]]:
    """{new rate: the model choices whose chosen rate at some point sits at that edge}."""
    if not rates:
        return {}
    low, high = rates[0] / (rates[1] / rates[0]), rates[-1] * (rates[-1] / rates[-2])
    by_point = defaultdict(lambda: defaultdict(list))
    for row in rows:
        point = tuple(sorted((k, v) for k, v in row["overrides"].items() if k not in (LR_KEY, "seed")))
        by_point[point][row["lr"]].append(row["score"])
    out = defaultdict(set)
    for point, per_lr in by_point.items():
        means = {lr: sum(s) / len(s) for lr, s in per_lr.items() if not math.isnan(lr)}
        if len(means) < 2:
            continue
        best = max(sorted(means), key=lambda lr: means[lr])
        model = dict(point).get("model")
        if model is None:
            continue
        tried = sorted(means)
        if math.isclose(best, rates[0]) and means[best] > means[tried[1]] + TIE:
            out[low].add(model)
        elif math.isclose(best, rates[-1]) and means[best] > means[tried[-2]] + TIE:
            out[high].add(model)
    return {lr: sorted(models) for lr, models in sorted(out.items())}


def experiment_dir(folder: PurePath) -> PurePath:
    """The experiment's sweep folder that `folder` belongs to: the one a chosen-rate sweep
    (chosen_dir) or a rate extension (extension_dir) was written under, else `folder` itself.
    Runs of one experiment split by rate are still one experiment (their labels, for one)."""
    if folder.name.startswith("lr_") and folder.name != EXTENDED_DIR:
        folder = folder.parent
        if folder.name == EXTENDED_DIR:
            folder = folder.parent
    return folder


def in_rate_folder(run_dir) -> bool:
    """Whether a run was written under a per-rate folder (chosen_dir, extension_dir): it ran at
    a rate chosen for it before its sweep, not among the sweep's own rates."""
    folder = PurePath(str(run_dir)).parent
    return experiment_dir(folder) != folder


def extension_dir(sweep_dir: Path, lr: float) -> Path:
    return sweep_dir / EXTENDED_DIR / f"lr_{lr:.3g}"


def extension_overrides(lr: float, models: list[str]) -> list[str]:
    return [f"model={','.join(models)}", f"{LR_KEY}={lr:.3g}"]


def is_extended(run_dir: str) -> bool:
    """A run the second stage added (it lies under an lr_extended folder)."""
    return f"/{EXTENDED_DIR}/" in f"/{Path(run_dir).as_posix()}/"


# ---- the rate pilot: one seed per mixer, width and rate, on the validation split, run before
# an experiment that has one (<experiment>_rates.yaml); the experiment then runs each mixer at
# the rate the pilot chose for it, one sweep per chosen rate under <sweep>/lr_<rate>/.

PILOT_SUFFIX = "_rates"
WIDTH_KEY = "model.d_model"


def pilot_name(experiment: str) -> str:
    return f"{experiment}{PILOT_SUFFIX}"


# The rounding twin: a pilot run beside its twin whose initial weights were perturbed by
# trainer.init_jitter (1e-6 of each weight, below any seed's difference). Where training amplifies
# such a perturbation (a rate at which the loss climbs back and forth), the two end apart by as
# much as two seeds do, and so would the run on another CPU, whose rounding differs by as little
# (the capacity note in docs/findings.md: FAVOR+ at 3e-2 moved 0.1-0.2 nats where 1e-2 moved 4e-5).
# A rate whose twins' final validation losses differ by more than this is not chosen while a rate
# that holds exists.
JITTER_KEY = "trainer.init_jitter"
# nats. Chaotic twins ended 0.012-0.56 apart (FAVOR+ at 1e-2 and 3e-2, elu and retnet at 3e-2 in the
# findings pilot at d_model 64; the quick pilot's 0.019-0.028); stable ones 1e-7 to 4e-5 at d_model 8
# and 2e-3 to 4e-3 at d_model 64, where the validation loss itself is 0.02-0.05 (twins there end
# within 0.001 of accuracy). It was 1e-3, set from the d_model 8 pilots, and passed over elu's
# 1e-2 (0.986, its twin 0.985) for 3e-3 (0.871) at d_model 64.
ROUNDING_GAP = 1e-2


def rounding_gaps(rows: list[dict]) -> dict[float, float]:
    """{rate: the largest |difference| of final validation loss between a run and its jittered
    twin (the same overrides but trainer.init_jitter)}; a rate without a twin is left out."""
    runs = defaultdict(dict)
    for row in rows:
        jitter = float(row["overrides"].get(JITTER_KEY, 0.0))
        twin = tuple(sorted((k, v) for k, v in row["overrides"].items() if k not in (JITTER_KEY, LR_KEY)))
        runs[(row["lr"], twin)][jitter > 0] = row["val_loss"]
    gaps = defaultdict(float)
    for (lr, _), pair in runs.items():
        if len(pair) == 2:
            gaps[lr] = max(gaps[lr], abs(pair[True] - pair[False]))
    return dict(gaps)


def pilot_choices(rows: list[dict]) -> list[dict]:
    """Per (model, width) of the pilot's runs (run_scores rows): every rate's mean validation
    accuracy, how far its rounding twins ended apart (rounding_gap, NaN without twins;
    rounding_sensitive above ROUNDING_GAP) and the chosen one (the best among the rates that
    are not rounding-sensitive, all of them where none holds; ties: the lower rate), with
    chosen_at_edge where it is the lowest or highest rate tried."""
    by_point = defaultdict(lambda: defaultdict(list))
    for row in rows:
        model = row["overrides"].get("model")
        if model is None or math.isnan(row["lr"]):
            continue
        by_point[(model, row["overrides"].get(WIDTH_KEY))][row["lr"]].append(row)
    out = []
    for (model, width), per_lr in sorted(by_point.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        means = {lr: sum(r["score"] for r in runs) / len(runs) for lr, runs in sorted(per_lr.items())}
        gaps = rounding_gaps([r for runs in per_lr.values() for r in runs])
        holds = [lr for lr in means if not gaps.get(lr, 0.0) > ROUNDING_GAP] or list(means)
        best = max(holds, key=lambda lr: (means[lr], -lr))
        for lr, mean in means.items():
            gap = gaps.get(lr, math.nan)
            out.append({"model": model, "width": width, "lr": lr, "val_accuracy": mean, "runs": len(per_lr[lr]),
                        "rounding_gap": gap, "rounding_sensitive": bool(gap > ROUNDING_GAP),
                        "chosen": lr == best, "chosen_at_edge": lr == best and len(means) > 1
                        and lr in (min(means), max(means))})
    return out


def rate_groups(choices: list[dict]) -> dict[tuple[float, str | None], list[str]]:
    """{(chosen rate, width): the models that run at it}: one sweep each."""
    groups = defaultdict(list)
    for row in choices:
        if row["chosen"]:
            groups[(row["lr"], row["width"])].append(row["model"])
    return {key: sorted(models) for key, models in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))}


def chosen_dir(sweep_dir: Path, lr: float, width: str | None) -> Path:
    return sweep_dir / (f"lr_{lr:.3g}" if width is None else f"lr_{lr:.3g}_d{width}")


def chosen_overrides(lr: float, width: str | None, models: list[str]) -> list[str]:
    return [*extension_overrides(lr, models), *([] if width is None else [f"{WIDTH_KEY}={width}"])]
