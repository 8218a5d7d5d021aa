"""What each sweep of a profile cost, from its runs' own times (results.json), and the sum.

    python -m analysis.times results/findings               # a table per sweep, then the total
    python -m analysis.times docs/results/findings --csv t.csv

Per sweep (a folder under the results root, its per-rate and edge-rule folders included): the
runs, how many finished, the sum of their wall times (``summary.wall_time_s``: claim to
results.json, the process's start and imports left out) and CPU times (``summary.cpu_time_s``),
and the sweep's minutes at ``--parallel`` runs at a time (the profiles run two, one thread
each): the summed wall time over that number. The budget line compares the total with a
profile's budget (the findings profile's: 2.5 hours on 2 cores), twice: by wall time, what the
runs took where they ran, and by CPU time, what they would take on an idle machine with a core
for each of the ``--parallel`` runs (one thread each). Wall above CPU is time a run waited for a
core: the machine ran more than ``--parallel`` things at once.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from analysis.loader import NoResultsError, find_results, read_text

BUDGET_S = {"findings": 2.5 * 3600}  # wall seconds of sweeps on 2 cores, two runs at a time
COLUMNS = ["sweep", "runs", "ok", "failed", "wall_s", "cpu_s", "minutes_at_parallel", "stops"]


def sweep_times(root: Path, parallel: int = 2) -> pd.DataFrame:
    """One row per sweep folder under ``root`` (COLUMNS), then a row "all" with the sums."""
    rows = []
    for sweep in sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            files = find_results(sweep)
        except NoResultsError:
            continue
        runs = []
        for file in files:
            try:
                runs.append(json.loads(read_text(file)))
            except (OSError, ValueError, EOFError):
                runs.append({"status": "failed"})
        summaries = [r.get("summary") or {} for r in runs]
        wall = sum(float(s.get("wall_time_s") or 0.0) for s in summaries)
        stops = pd.Series([s.get("stop_reason") for s in summaries if s.get("stop_reason")], dtype=object)
        rows.append({"sweep": sweep.name, "runs": len(runs), "ok": sum(r.get("status") == "ok" for r in runs),
                     "failed": sum(r.get("status") != "ok" for r in runs), "wall_s": wall,
                     "cpu_s": sum(float(s.get("cpu_time_s") or 0.0) for s in summaries),
                     "minutes_at_parallel": wall / parallel / 60,
                     "stops": ", ".join(f"{k} {v}" for k, v in stops.value_counts().sort_index().items())})
    table = pd.DataFrame(rows, columns=COLUMNS)
    if len(table):
        total = {c: table[c].sum() for c in ("runs", "ok", "failed", "wall_s", "cpu_s", "minutes_at_parallel")}
        table = pd.concat([table, pd.DataFrame([{"sweep": "all", **total, "stops": ""}])], ignore_index=True)
    return table


def format_table(table: pd.DataFrame, parallel: int, budget_s: float | None) -> str:
    lines = [f"{'sweep':<22} {'runs':>5} {'ok':>5} {'failed':>6} {'wall s':>9} {'CPU s':>9} "
             f"{f'min at {parallel}':>9}  stops"]
    for _, r in table.iterrows():
        lines.append(f"{r['sweep']:<22} {r['runs']:>5} {r['ok']:>5} {r['failed']:>6} {r['wall_s']:>9,.0f} "
                     f"{r['cpu_s']:>9,.0f} {r['minutes_at_parallel']:>9.1f}  {r['stops']}")
    if budget_s is not None and len(table):
        used = table["wall_s"].iloc[-1] / parallel
        idle = table["cpu_s"].iloc[-1] / parallel
        lines.append(f"budget: {used / 3600:.2f} h of {budget_s / 3600:.2f} h at {parallel} runs at a time "
                     f"({used / budget_s:.0%}); by CPU time, on an idle machine with a core per run, "
                     f"{idle / 3600:.2f} h ({idle / budget_s:.0%})")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.times", description=__doc__.split("\n")[0])
    parser.add_argument("root", help="a profile's results (results/findings, or committed: docs/results/findings)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--budget-profile", default=None, choices=sorted(BUDGET_S),
                        help="compare the total with this profile's budget (default: the root's folder name)")
    parser.add_argument("--csv", help="also write the table here")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        print(f"python -m analysis.times: error: {root}: no such folder", file=sys.stderr)
        return 2
    table = sweep_times(root, args.parallel)
    if table.empty:
        print(f"python -m analysis.times: error: no results.json under {root}", file=sys.stderr)
        return 2
    budget = BUDGET_S.get(args.budget_profile or root.name)
    print(format_table(table, args.parallel, budget))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
