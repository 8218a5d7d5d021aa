"""The law's predictions, written into the experiment files before the runs they predict.

    python -m analysis.preregister --results results/findings            # print the rows
    python -m analysis.preregister --results results/findings --write    # write them into the files

The findings capacity experiment runs in stages (its file's header): stage 1 trains the wide
model at key width 8 only. From each of those runs' statistics (``train_stats``, measured at
its own training setting: harness.measure.out_of_sample) this command predicts, by the law and
by both naive baselines (nominal: the random-key law at the nominal key width; anchored: the
training read-out carried with the random-key slope), through the same accuracy map:

  key_width  the accuracy of every mixer at the other key widths of the grid (4 and 16) at each
             of their N, from the key-width-8 runs trained at the N nearest in log N (the
             statistics carried to the other width by TrainStats.at_key_width, and to the other
             N by the reads of its layout);
  length     the decayed mixer's recall against sequence length, filler between the pairs and
             the queries (findings/capacity_length's lengths), from its key-width-8 runs at that N:
             the law's decay saturates the crosstalk at its horizon while the target fades, the
             baselines count every earlier write once.

A row is the mean over the seeds' predictions. ``discriminating``: the law differs from both
baselines by more than the margin (analysis.law_margin_logodds, in log-odds) at that setting,
so only its measurement can tell them apart; the verdict (analysis.plots.law) is read on those.
``law_anchored_by_algebra``: the law is the anchored baseline by construction there (one
additive head without decay, the width unchanged), a row no verdict counts as a win.

--write replaces the block between the markers under ``analysis:`` in each file (stage 2's runs
then carry the rows in their config, and git shows they came first); commit before stage 2.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from analysis.loader import find_results
from harness.measure.out_of_sample import TrainStats, predict_baselines, predict_from_train, reads_of

EXPERIMENT = "findings/capacity"            # the key-width stages; its results folder: <results>/capacity
LENGTH_EXPERIMENT = "findings/capacity_length"
SOURCE_KEY_WIDTH = 8
MARGIN_KEY = "law_margin_logodds"
BEGIN, END = "# >>> law_predictions", "# <<< law_predictions"
SOURCES = ("law", "nominal", "anchored")


def _logit(p: float) -> float:
    from analysis.plots.capacity import log_odds

    return float(log_odds(p))


def source_runs(folder: Path) -> list[dict]:
    """The finished stage-1 runs under ``folder``: training runs with their statistics, of a wide
    model (width above its key width) at key width SOURCE_KEY_WIDTH."""
    runs = []
    for file in find_results(folder):
        data = json.loads(file.read_text())
        config, stats = data.get("config") or {}, data.get("train_stats") or {}
        if data.get("status") != "ok" or data.get("mode") != "train" or stats.get("status") != "ok":
            continue
        if config.get("model.qk_dim") != SOURCE_KEY_WIDTH or config.get("model.d_model", 0) <= SOURCE_KEY_WIDTH:
            continue
        runs.append({"config": config, "stats": TrainStats.from_record(stats)})
    return runs


def _task_config(config: dict, **change):
    from harness.tasks import get_task

    module = get_task(config["task.name"])
    fields = {k[len("task."):]: v for k, v in config.items() if k.startswith("task.") and k != "task.name"}
    fields.update(test_num_pairs=[], test_seq_len=[], **change)
    return module, module.Config(**fields)


def reads_at(config: dict, **change):
    """The reads of the run's test split at its task setting with ``change`` (num_pairs, seq_len):
    the layout alone, as the run would be evaluated there."""
    module, task = _task_config(config, **change)
    batch = module.make_batch(task, int(config.get("trainer.eval_examples", 256)), seed=int(config["seed"]),
                              split="test")
    return reads_of(batch)


def predict(stats: TrainStats, reads, ratio: float = 1.0) -> dict[str, float]:
    """The law's and both baselines' accuracy at ``reads`` for the key side ``ratio`` times the
    measured one."""
    carried = stats.at_key_width(ratio) if ratio != 1.0 else stats
    return {"law": predict_from_train(carried, reads)["acc_predicted_from_train"],
            **{k: v for k, v in zip(SOURCES[1:], predict_baselines(carried, reads).values())}}


def _nearest(available, n: float) -> float:
    return min(available, key=lambda m: (abs(math.log(m / n)), m))


def _row(part: str, key: tuple, preds: list[dict], identity: list[bool], margin: float, **source) -> dict:
    model, qk, n, length = key
    mean = {s: float(np.mean([p[s] for p in preds])) for s in SOURCES}
    apart = all(abs(_logit(mean["law"]) - _logit(mean[s])) > margin for s in SOURCES[1:])
    return {"part": part, "model": model, "qk_dim": qk, "num_pairs": n, "seq_len": length, **source,
            **{s: round(mean[s], 4) for s in SOURCES}, "seeds": len(preds),
            "law_anchored_by_algebra": bool(all(identity)), "discriminating": bool(apart and not all(identity))}


def key_width_rows(runs: list[dict], targets: list[int], ratios: list[float], margin: float) -> list[dict]:
    """Predictions at every (mixer, key width in targets, N = key width x ratio) from the
    key-width-8 runs of that mixer trained at the nearest N."""
    by_model = defaultdict(lambda: defaultdict(list))
    for run in runs:
        by_model[run["config"]["model.name"]][int(run["config"]["task.num_pairs"])].append(run)
    rows = []
    for model, by_n in sorted(by_model.items()):
        for qk in targets:
            for ratio in ratios:
                n = int(round(qk * ratio))
                src = _nearest(list(by_n), n)
                preds = [predict(r["stats"], reads_at(r["config"], num_pairs=n), qk / SOURCE_KEY_WIDTH)
                         for r in by_n[src]]
                rows.append(_row("key_width", (model, qk, n, None), preds, [False] * len(preds), margin,
                                 source_qk_dim=SOURCE_KEY_WIDTH, source_num_pairs=src))
    return rows


def length_rows(runs: list[dict], model: str, n: int, lengths: list[int], margin: float) -> list[dict]:
    """Predictions of ``model``'s recall at N = n against sequence length, from its key-width-8
    runs trained at n (the width unchanged: only the reads move)."""
    mine = [r for r in runs if r["config"]["model.name"] == model and int(r["config"]["task.num_pairs"]) == n]
    rows = []
    for length in lengths:
        preds = [predict(r["stats"], reads_at(r["config"], num_pairs=n, seq_len=length)) for r in mine]
        if preds:
            rows.append(_row("length", (model, SOURCE_KEY_WIDTH, n, length), preds,
                             [r["stats"].anchored_by_algebra for r in mine], margin,
                             source_qk_dim=SOURCE_KEY_WIDTH, source_num_pairs=n))
    return rows


def block(rows: list[dict], indent: str = "  ") -> str:
    """The marked YAML block: one flow mapping per row."""
    def value(v):
        return "null" if v is None else str(v).lower() if isinstance(v, bool) else v

    lines = [f"{indent}{BEGIN} (python -m analysis.preregister --write: stage 1's statistics; do not edit)",
             f"{indent}law_predictions:" + ("" if rows else " []")]
    lines += [f"{indent}- {{" + ", ".join(f"{k}: {value(v)}" for k, v in row.items()) + "}" for row in rows]
    lines.append(f"{indent}{END}")
    return "\n".join(lines)


def write_block(path: Path, rows: list[dict]) -> None:
    """Replace the marked block of ``path`` (its indentation kept) by the rows."""
    text = path.read_text().splitlines()
    start = next((i for i, line in enumerate(text) if line.strip().startswith(BEGIN)), None)
    end = next((i for i, line in enumerate(text) if line.strip().startswith(END)), None)
    if start is None or end is None or end < start:
        raise ValueError(f"{path}: no '{BEGIN}' ... '{END}' block under analysis: to write into")
    indent = text[start][: len(text[start]) - len(text[start].lstrip())]
    path.write_text("\n".join(text[:start] + block(rows, indent).split("\n") + text[end + 1:]) + "\n")


def main(argv=None) -> int:
    from analysis.plots.capacity import LAW_MARGIN_LOGODDS
    from harness.config.compose import CONF_DIR, compose_experiment, experiment_grid

    parser = argparse.ArgumentParser(prog="python -m analysis.preregister", description=__doc__.split("\n")[0])
    parser.add_argument("--results", required=True, help="the profile's results root (stage 1 under <root>/capacity)")
    parser.add_argument("--write", action="store_true", help="write the rows into the experiment files")
    args = parser.parse_args(argv)
    root = Path(args.results)
    runs = source_runs(root / "capacity")
    if not runs:
        print(f"python -m analysis.preregister: error: no finished key-width-{SOURCE_KEY_WIDTH} run with "
              f"statistics under {root / 'capacity'} (run stage 1 first)", file=sys.stderr)
        return 2
    grid = experiment_grid(EXPERIMENT)
    cfg = compose_experiment(EXPERIMENT)
    margin = float(cfg.analysis.get(MARGIN_KEY, LAW_MARGIN_LOGODDS))
    targets = [int(k) for k in grid["model.qk_dim"] if int(k) != SOURCE_KEY_WIDTH]
    ratios = [float(r) for r in grid["analysis.pairs_per_key"]]
    wide = key_width_rows(runs, targets, ratios, margin)
    along = []
    for choice in experiment_grid(LENGTH_EXPERIMENT).get("model", [None]):
        length_cfg = compose_experiment(LENGTH_EXPERIMENT, [f"model={choice}"] if choice else [])
        along += length_rows(runs, length_cfg.model.name, int(length_cfg.task.num_pairs),
                             list(length_cfg.task.test_seq_len), margin)
    for name, rows in ((EXPERIMENT, wide), (LENGTH_EXPERIMENT, along)):
        print(f"{name}: {len(rows)} predictions, {sum(r['discriminating'] for r in rows)} discriminating")
        print(block(rows))
        if args.write:
            write_block(CONF_DIR / "experiment" / f"{name}.yaml", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
