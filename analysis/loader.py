"""Turn run and sweep directories into tidy pandas frames.

Every run writes one ``results.json`` into its Hydra run directory; a multirun sweep is a
directory of numbered run directories. Any directory is loaded the same way: every
``results.json`` below it becomes one run. The run's scalar fields become run columns

    run_dir, mode, status, error, task, model, schema, config.*, summary.*, train_stats.*, env.*

and every list-valued top-level key of the file is a table ("slices", "heads", "probe",
"cost", ...) whose rows are joined with the run columns. The run's ``metrics.jsonl`` beside
it (one JSON line per evaluation during training: step, split, accuracy, ...) is the
``metrics`` table. A table field that shares a name with a run column keeps its name; the
run's value moves to ``run.<name>`` (the probe table's ``model`` is the probed mixer, the
run's becomes ``run.model``).

Committed results (analysis.archive) keep each file gzip'd: ``results.json.gz``,
``metrics.jsonl.gz`` and ``config.yaml.gz`` are read as the plain files are, so a folder of
either kind loads to the same frame.

Failed and unfinished runs never stop a load: a run directory without results.json is
skipped, an unreadable or malformed results.json is kept as a failed run whose error names the
file, and a run without a table simply contributes no rows to it. Unreadable includes a file
that is not regular or is past a size bound, a schema other than the harness's, a config that
does not hash to the config_hash beside it (an edited file), a model label whose layer counts
are malformed or past any stack, and a value a figure could not use (a text where the schema has a number, a non-finite summary number): the
error then names the key too (:func:`unusable_values`), and the figure's note names the run.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pandas as pd

from harness.model import stack_slots
from harness.outputs.results import DamagedResults, parse_results_file

RESULTS_FILE = "results.json"
METRICS_FILE = "metrics.jsonl"
GZ = ".gz"  # committed results: each file gzip'd (analysis.archive)
RUN_COLUMNS = ("run_dir", "mode", "status", "error", "task", "model", "schema")
# Groups of run columns, in the order they appear after the fixed ones.
_PREFIXES = ("config.", "summary.", "train_stats.", "env.")


class NoResultsError(FileNotFoundError):
    """The path holds no results.json at all (wrong path, or sweeps not run yet)."""


def results_root(profile: str = "quick") -> Path:
    """Root of the sweep results: $HARNESS_RESULTS, else results/<profile>."""
    return Path(os.environ.get("HARNESS_RESULTS") or Path("results") / profile)


def find_results(path: str | os.PathLike) -> list[Path]:
    """Every results.json under ``path`` (or ``path`` itself), run directories in natural order."""
    path = Path(path)
    if not path.exists():
        raise NoResultsError(f"results path does not exist: {path}")
    if path.is_file():
        return [path]
    # Hidden folders (.hydra, .submitit, .ipynb_checkpoints) never hold a run's results.
    found = [
        f for pattern in (RESULTS_FILE, RESULTS_FILE + GZ) for f in path.rglob(pattern)
        if not any(part.startswith(".") for part in f.relative_to(path).parts[:-1])
    ]
    # a run directory holding both forms is read once, from its plain file
    files = [f for f in found if f.name == RESULTS_FILE or not (f.parent / RESULTS_FILE).exists()]
    if not files:
        raise NoResultsError(
            f"no {RESULTS_FILE} under {path}: expected a run directory or a sweep of run "
            "directories (python -m harness ... or python -m harness -m +experiment=...)"
        )
    return sorted(files, key=lambda f: _natural_key(f.relative_to(path).as_posix()))


def load_results(path: str | os.PathLike, table: str | None = None) -> pd.DataFrame:
    """One row per run (``table=None``), or one row per row of ``table`` joined with its run.

    A table that no run has gives an empty frame that still has the run columns.
    Raises NoResultsError when ``path`` holds no results.json.
    """
    runs, tables = _collect(path)
    if table is None:
        return runs
    return _join_table(runs, tables.get(table, []))


def load_all(path: str | os.PathLike) -> pd.DataFrame:
    """Long frame of every run and every table row, told apart by a ``table`` column.

    ``table == "runs"`` rows are the per-run frame; the other values name the tables.
    """
    runs, tables = _collect(path)
    frames = [runs.assign(table="runs")]
    frames += [_join_table(runs, rows).assign(table=name) for name, rows in tables.items() if rows]
    long = pd.concat(frames, ignore_index=True, sort=False)
    return long[["table"] + [c for c in long.columns if c != "table"]]


def read_run(file: str | os.PathLike) -> tuple[dict, dict[str, list[dict]]]:
    """One results.json as (run record of scalar columns, {table name: rows})."""
    file = Path(file)
    try:
        data = parse_results_file(file)  # a regular file under a size bound, JSON, schema 1
        malformed(data)
        unusable_values(data)
    except (OSError, ValueError, RecursionError) as err:
        # A run killed while writing leaves a truncated file, an edit or another program a file
        # of another shape: keep it visible as a failed run that names the file, never a crash.
        reason = err.reason if isinstance(err, DamagedResults) else err
        data = {"status": "failed", "error": f"unreadable {RESULTS_FILE} ({file}): {reason}"}

    config = data.get("config") or _saved_config(file.parent)
    record = {
        "mode": data.get("mode"),
        # The contract always writes status; a file without it is judged by its error field.
        "status": data.get("status") or ("failed" if data.get("error") else "ok"),
        "error": data.get("error"),
        # Probe and cost runs write task null on purpose; only an absent field falls back.
        "task": data["task"] if "task" in data else config.get("task.name"),
        "model": data["model"] if "model" in data else config.get("model.name"),
        "schema": data.get("schema"),
    }
    # Other scalar top-level fields (config_hash, ...) are run columns too.
    known = {"config", "summary", "env", *record}
    record.update({k: v for k, v in data.items() if k not in known and not isinstance(v, (list, dict))})
    record.update(_flatten(config, "config."))
    record.update(_flatten(data.get("summary") or {}, "summary."))
    # the statistics the out-of-sample law carried from the training setting (lists as tuples)
    record.update(_flatten(data.get("train_stats") or {}, "train_stats."))
    record.update(_flatten(data.get("env") or {}, "env."))
    tables = {
        key: [_flatten(row) for row in value if isinstance(row, dict)]
        for key, value in data.items()
        if isinstance(value, list)
    }
    return record, tables


def malformed(data) -> None:
    """ValueError saying what is wrong with a parsed results.json that is not shaped as the
    harness writes it (schema in the README): an object whose run fields are plain values, whose
    model label reads as a stack (harness.model.stack_slots) and whose config, summary and env are
    objects. Table rows that are not objects are skipped."""
    if not isinstance(data, dict):
        raise ValueError(f"top level is {type(data).__name__}, not an object")
    for key in ("config", "summary", "env"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise ValueError(f"'{key}' is {type(data[key]).__name__}, not an object")
    for key in RUN_COLUMNS[1:]:
        if isinstance(data.get(key), (dict, list)):
            raise ValueError(f"'{key}' is {type(data[key]).__name__}, not a single value")
    if isinstance(data.get("model"), str):
        try:  # the figures read a stack's layers off its label: counts bounded before any list is made
            stack_slots(data["model"])
        except ValueError as exc:
            raise ValueError(f"'model': {exc}") from None


# The numbers the figures aggregate (README: the results.json schema), in the summary and in the
# rows of its tables; a summary key "accuracy/<setting>" is the number "accuracy" of a setting.
NUMBERS = frozenset((
    "accuracy", "loss", "val_accuracy", "val_loss", "steps", "steps_run", "best_val_accuracy",
    "best_val_step", "params", "d_key", "d_head", "state_elements_per_head", "state_elements_per_layer",
    "state_bytes", "kv_cache_bytes", "target_weight", "entropy", "norm_entropy", "eff_support",
    "max_weight", "target_rank", "monotonicity", "snr_measured", "snr_predicted", "snr_readout_trained",
    "acc_readout_trained", "d_kernel", "snr_predicted_from_train", "acc_predicted_from_train",
    "retrieval_layer", "retrieval_head", "log_decay", "eval_peak_mem_bytes", "peak_mem_bytes",
    "time_s", "step_time_s", "setup_time_s", "measure_time_s", "wall_time_s", "cpu_time_s", "seq_len", "count", "layer", "head", "d", "n", "acc_measured", "acc_predicted", "d_eff", "n_eff", "stale",
))


def unusable_values(data: dict) -> None:
    """ValueError naming the key of the first value a figure could not use: a NaN or infinity in
    the summary (the harness writes a non-finite number as null, so one there was put by something
    else, and a figure would drop its run in silence; a table's NaN is a point not measured), or
    a value that is not a number where the schema has one (a figure's mean would fail on it)."""
    places = [("summary", data.get("summary") or {})]
    places += [(f"{key}[{i}]", row) for key, value in data.items() if isinstance(value, list)
               for i, row in enumerate(value) if isinstance(row, dict)]
    for where, fields in places:
        for key, value in _flatten(fields).items():
            name = f"{where}.{key}"
            if where == "summary" and isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"'{name}' is {value}, not a finite number")
            if key.split("/")[0] in NUMBERS and value is not None and (
                    isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"'{name}' is {type(value).__name__} ({_short(value)}), not a number")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_text(path: str | os.PathLike) -> str:
    """A file's text, or that of ``<path>.gz`` beside it where only the gzip'd one exists
    (committed results); OSError when neither can be read, UnicodeDecodeError for bytes that
    are not text."""
    import gzip

    path = Path(path)
    if not path.exists() and Path(f"{path}{GZ}").exists():
        path = Path(f"{path}{GZ}")
    if path.name.endswith(GZ):
        with gzip.open(path, "rb") as fh:
            return fh.read().decode()
    return path.read_text()


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The rows of a run's metrics.jsonl (or metrics.jsonl.gz); none when it has no such file. A
    line that does not parse as an object (a run killed mid-write leaves a partial last line) is
    skipped."""
    try:
        text = read_text(Path(run_dir) / METRICS_FILE)
    except (OSError, UnicodeDecodeError, EOFError):
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(_flatten(row))
    return rows


_EXTENDED = "lr_extended"  # analysis.lr_edge.EXTENDED_DIR


def _collect(path) -> tuple[pd.DataFrame, dict[str, list[tuple[int, dict]]]]:
    """Read every run under ``path`` once: the runs frame and each table's (run index, row)s."""
    root = Path(path)
    records, tables = [], {}
    for i, file in enumerate(find_results(root)):
        record, run_tables = read_run(file)
        records.append({"run_dir": file.parent.as_posix(), **record})
        if _EXTENDED in file.relative_to(root).parts[:-1]:
            # a rate the learning-rate edge rule added past the grid (analysis.lr_edge)
            records[-1]["lr_extended"] = True
        for name, rows in run_tables.items():
            tables.setdefault(name, []).extend((i, row) for row in rows)
        tables.setdefault("metrics", []).extend((i, row) for row in read_metrics(file.parent))
    runs = pd.DataFrame.from_records(records)
    return runs[_order_run_columns(runs.columns)], tables


def _join_table(runs: pd.DataFrame, rows: list[tuple[int, dict]]) -> pd.DataFrame:
    """Rows of one table, each followed by the columns of the run it came from."""
    body = pd.DataFrame.from_records([row for _, row in rows])
    if body.empty:
        return runs.iloc[0:0].copy()
    clashes = [c for c in runs.columns if c in body.columns]
    run_part = runs.rename(columns={c: f"run.{c}" for c in clashes})
    run_part = run_part.iloc[[i for i, _ in rows]].reset_index(drop=True)
    fixed = [c for c in run_part.columns if not c.startswith(_PREFIXES)]
    rest = [c for c in run_part.columns if c.startswith(_PREFIXES)]
    return pd.concat([run_part[fixed], body, run_part[rest]], axis=1)


def _saved_config(run_dir: Path) -> dict:
    """Fallback when results.json lacks a config: the run's resolved config.yaml, else the
    one Hydra saved in .hydra/config.yaml (unresolved), flattened to dotted keys."""
    import yaml  # only needed for this fallback

    for file in (run_dir / "config.yaml", run_dir / ".hydra" / "config.yaml"):
        try:
            loaded = yaml.safe_load(read_text(file))
        except (OSError, UnicodeDecodeError, EOFError, yaml.YAMLError):
            continue
        if isinstance(loaded, dict):
            return _flatten(loaded)
    return {}


def _flatten(mapping: dict, prefix: str = "") -> dict:
    """Nested dicts to dotted keys; lists to tuples so that columns stay hashable for groupby."""
    flat = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = _hashable(value)
    return flat


def _hashable(value):
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _order_run_columns(columns) -> list[str]:
    fixed = [c for c in RUN_COLUMNS if c in columns]
    grouped = [sorted(c for c in columns if c.startswith(p)) for p in _PREFIXES]
    seen = set(fixed).union(*grouped)
    other = [c for c in columns if c not in seen]
    return fixed + other + [c for group in grouped for c in group]


def _natural_key(text: str):
    """Sort "2" before "10" so that sweep members come in job order."""
    return [(0, int(tok), "") if tok.isdigit() else (1, 0, tok) for tok in re.split(r"(\d+)", text)]
