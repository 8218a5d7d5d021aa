"""From measured rows to the figures the issue asks for: limit ratios, crossovers, memory
exponents, decode flatness, loop efficiency, the targets they are held against, and tables."""

from __future__ import annotations

import math
from typing import Any

from harness.bench.cases import DELTA_FAMILIES, FAMILIES, LINEAR_FAMILIES

# Targets on the reference set-up (CPU, float32, batch 8, 4 heads, head dim 64, T = 4,096).
LIMIT_TARGETS = {"linear": 4.0, "decay_scalar": 4.0, "decay_per_dim": 5.0}
CROSSOVER_TARGET = 512
FLATNESS_TARGET = 1.2
SOFTMAX_GROWTH_TARGET = 10.0
MEMORY_EXPONENT_TARGET = 1.1
LOOP_TARGET = 0.9
DELTA_TARGET = 2.5  # the delta rule's chunk form, fwd+bwd, over the linear chunk form's, at the limit length
EXTRAS_TARGET = 1.1  # a default step over the same model without short convolution, fault checks, clipping


def _ok(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "ok"]


def best_chunk_rows(rows: list[dict]) -> list[dict]:
    """The chunk form's rows reduced to the fastest chunk length per (family, seq_len, pass)."""
    best: dict[tuple, dict] = {}
    for r in _ok(rows):
        if r["form"] != "chunk":
            continue
        key = (r["family"], r["seq_len"], r["pass"])
        if key not in best or r["time_s"] < best[key]["time_s"]:
            best[key] = r
    return list(best.values())


def limit_ratios(rows: list[dict], seq_len: int) -> dict[str, dict[str, dict[str, float]]]:
    """{family: {form: {pass: limit ratio}}} at seq_len (the chunk form at its best chunk length)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    candidates = [r for r in _ok(rows) if r["form"] != "chunk"] + best_chunk_rows(rows)
    for r in candidates:
        if r["seq_len"] == seq_len:
            out.setdefault(r["family"], {}).setdefault(r["form"], {})[r["pass"]] = r["limit_ratio"]
    return out


def delta_over_linear(rows: list[dict], seq_len: int) -> dict[str, float]:
    """{delta family: its chunk form's fwd+bwd time / the linear chunk form's} at seq_len (same run)."""
    best = {(r["family"], r["seq_len"], r["pass"]): r["time_s"] for r in best_chunk_rows(rows)}
    linear = best.get(("linear", seq_len, "fwdbwd"))
    if not linear:
        return {}
    return {f: best[(f, seq_len, "fwdbwd")] / linear for f in DELTA_FAMILIES if (f, seq_len, "fwdbwd") in best}


def crossovers(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per linear family and pass: the shortest measured T from which the chunk form is faster than
    the parallel form at every longer measured T (a parallel call skipped as too large or too slow
    counts as slower); None when the chunk form is slower at the longest T compared. Families or
    passes without any parallel row are left out."""
    chunk = {(r["family"], r["pass"], r["seq_len"]): r["time_s"] for r in best_chunk_rows(rows)}
    par = {(r["family"], r["pass"], r["seq_len"]): r for r in rows if r["form"] == "parallel"}
    out: dict[str, dict[str, Any]] = {}
    for family, pass_ in sorted({(f, p) for (f, p, _) in chunk}):
        if not any(f == family and p == pass_ for (f, p, _) in par):
            continue
        cross = None
        for t in sorted((t for (f, p, t) in chunk if f == family and p == pass_), reverse=True):
            pr = par.get((family, pass_, t))
            if pr is None or pr["status"].startswith("error"):
                continue  # nothing to compare at this length
            if pr["status"] == "ok" and chunk[(family, pass_, t)] >= pr["time_s"]:
                break
            cross = t  # faster, or the parallel form could not even run
        out.setdefault(family, {})[pass_] = cross
    return out


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return math.nan
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var if var else math.nan


def memory_exponents(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Fitted exponent of the chunk form's peak memory against T, per family and pass."""
    out: dict[str, dict[str, float]] = {}
    chunk = [r for r in best_chunk_rows(rows) if r.get("peak_mem_bytes")]
    for family in sorted({r["family"] for r in chunk}):
        for pass_ in ("fwd", "fwdbwd"):
            part = sorted((r["seq_len"], r["peak_mem_bytes"]) for r in chunk
                          if r["family"] == family and r["pass"] == pass_)
            if len(part) >= 2:
                out.setdefault(family, {})[pass_] = fit_exponent([p[0] for p in part], [p[1] for p in part])
    return out


def _target(name: str, value: float | None, op: str, bound: float) -> dict[str, Any]:
    met = None if value is None or (isinstance(value, float) and math.isnan(value)) else (
        value <= bound if op == "<=" else value >= bound)
    return {"name": name, "value": value, "target": f"{op} {bound:g}", "met": met}


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    ratios = summary.get("limit_ratio", {})
    for family, bound in LIMIT_TARGETS.items():
        value = ratios.get(family, {}).get("chunk", {}).get("fwdbwd")
        out.append(_target(f"limit ratio, {family} chunk fwd+bwd at T={summary.get('limit_seq_len')}", value, "<=", bound))
    for family, ratio in summary.get("delta_over_linear", {}).items():
        out.append(_target(f"{family} chunk fwd+bwd over linear chunk at T={summary.get('limit_seq_len')}", ratio,
                           "<=", DELTA_TARGET))
    for family, passes in summary.get("crossover", {}).items():
        for pass_, t in passes.items():
            out.append(_target(f"crossover chunk < parallel, {family} {pass_}", t if t is not None else math.inf,
                               "<=", CROSSOVER_TARGET))
    decode = summary.get("decode") or {}
    for family, d in decode.get("families", {}).items():
        if family == "softmax":
            out.append(_target(f"decode growth, softmax with a KV cache, {decode['reference_context']} vs "
                               f"{min(decode['contexts'])}", d["growth"], ">=", SOFTMAX_GROWTH_TARGET))
        else:
            out.append(_target(f"decode flatness, {family}, {decode['reference_context']} vs {min(decode['contexts'])}",
                               d["growth"], "<=", FLATNESS_TARGET))
    for family, passes in summary.get("memory_exponent", {}).items():
        if family in LINEAR_FAMILIES and "fwdbwd" in passes:
            out.append(_target(f"peak memory exponent, {family} chunk fwd+bwd", passes["fwdbwd"], "<=",
                               MEMORY_EXPONENT_TARGET))
    loop = summary.get("loop")
    if loop:
        out.append(_target("loop efficiency", loop["efficiency"], ">=", LOOP_TARGET))
    extras = summary.get("extras")
    if extras:
        out.append(_target("extras ratio (plain loop / default train() step)", extras["ratio"], "<=", EXTRAS_TARGET))
    return out


# ---- text tables ---------------------------------------------------------------------------------

def _ms(t: float) -> str:
    ms = t * 1e3
    return f"{ms:.3g}" if ms < 1000 else f"{ms:.0f}"


def _ratio(x: float) -> str:
    return f"{x:.3g}" if x < 1000 else f"{x:.2g}".replace("e+0", "e").replace("e+", "e")


def _grid(title: str, keys, lens, width: int, cell, keep_empty: bool) -> list[str]:
    """A titled table: one row per (family, form, C) of keys, one column of `width` per length;
    cell(family, form, C, length) is the text or None ('-'). Rows of only '-' are dropped
    unless keep_empty."""
    head = f"{'family':<14}{'form':<10}{'C':>4} " + "".join(f"{t:>{width}}" for t in lens)
    lines = ["", title, head, "-" * len(head)]
    for fam, form, c in keys:
        texts = [cell(fam, form, c, t) for t in lens]
        if keep_empty or any(x is not None for x in texts):
            lines.append(f"{fam:<14}{form:<10}{(c or ''):>4} " + "".join(f"{x or '-':>{width}}" for x in texts))
    return lines


def format_tables(rows: list[dict], gemm_rate: float) -> str:
    lens = sorted({r["seq_len"] for r in rows})
    keys = sorted({(r["family"], r["form"], r["chunk_size"] or 0) for r in rows},
                  key=lambda k: (FAMILIES.index(k[0]), k[1], k[2]))
    by = {(r["family"], r["form"], r["chunk_size"] or 0, r["seq_len"], r["pass"]): r for r in rows}

    def ok(r):
        return r if r is not None and r["status"] == "ok" else None

    lines = [f"GEMM {gemm_rate / 1e9:.1f} GFLOP/s (1024^3 float32); cells: time in ms / limit ratio; '-' not run"]
    for pass_, title in (("fwd", "forward"), ("fwdbwd", "forward + backward")):
        def timing(fam, form, c, t, pass_=pass_):
            r = ok(by.get((fam, form, c, t, pass_)))
            return None if r is None else _ms(r["time_s"]) + " /" + _ratio(r["limit_ratio"])

        lines += _grid(title, keys, lens, 16, timing, keep_empty=False)
    if not any(r.get("peak_mem_bytes") for r in rows):
        return "\n".join(lines)

    def memory(fam, form, c, t):
        r = ok(by.get((fam, form, c, t, "fwdbwd")) or by.get((fam, form, c, t, "fwd")))
        m = None if r is None else r.get("peak_mem_bytes")
        return None if m is None else format(m / 2**20, ".1f")

    lines += _grid("peak memory (MB), forward + backward (forward only where there is no backward)",
                   keys, lens, 10, memory, keep_empty=True)
    return "\n".join(lines)


def format_summary(summary: dict[str, Any]) -> str:
    lines = []
    dec = summary.get("decode")
    if dec:
        ctx = dec["contexts"]
        lines.append("decode, one step (us) at context " + ", ".join(str(c) for c in ctx)
                     + f"; ratio at {dec['reference_context']} over {min(ctx)}:")
        for family, d in dec["families"].items():
            t = d["time_s"]
            label = "growth" if family == "softmax" else "flatness"
            cells = "".join(f"{t[str(c)] * 1e6:>12.1f}" for c in ctx)
            lines.append(f"  {family:<14}{cells}   {label} {d['growth']:.2f}")
    loop = summary.get("loop")
    if loop:
        lines.append(f"loop efficiency ({loop['task']}/{loop['model']}, batch {loop['batch_size']}): "
                     f"{loop['loop_steps_per_s']:.1f} steps/s in train() vs {loop['bare_steps_per_s']:.1f} bare "
                     f"= {loop['efficiency']:.3f}")
    extras = summary.get("extras")
    if extras:
        lines.append(f"extras ratio ({extras['task']}/{extras['model']}): {extras['plain_steps_per_s']:.1f} steps/s "
                     f"plain ({extras['plain']}) vs {extras['loop_steps_per_s']:.1f} in train() "
                     f"= {extras['ratio']:.3f}")
    lines += _default_run_lines(summary.get("default_run"))
    lines.append("targets:")
    for t in summary.get("targets", []):
        mark = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        value = t["value"]
        shown = f"{value:.3g}" if isinstance(value, float) else str(value)
        lines.append(f"  [{mark:>6}] {t['name']}: {shown} (target {t['target']})")
    return "\n".join(lines)


RUN_PARTS = (("start_and_save", "process start (imports) and saving"), ("setup", "set-up before the first step"),
             ("steps", "training steps (median step x steps)"),
             ("evaluations_and_checkpoints", "evaluations and checkpoints"), ("measurements", "end-of-run measurements"))


def _default_run_lines(run: dict[str, Any] | None) -> list[str]:
    """The default run's seconds by part against the bare loop's for as many steps."""
    if not run:
        return []
    parts = run["parts"]
    lines = [f"default run ({' '.join(run['overrides']) or 'no overrides'}; {run['steps']} steps, accuracy "
             f"{run['accuracy']:.4f}, loss {run['loss']:.4f}): {run['run_s']:.1f} s in all vs {run['bare_s']:.1f} s "
             f"bare loop = {run['ratio']:.2f}"]
    lines += [f"  {label:<40}{parts[key]:>8.1f} s" for key, label in RUN_PARTS]
    return lines
